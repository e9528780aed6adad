"""The names of the engine's choices, defined once: the settings offer and check them, the engine keys its behaviour
by them (`batching.engine.scheduler`, `batching.engine.options`), the page labels them. Plain values that import
nothing, so the engine core, which imports nothing else of ours, may import them as the settings do."""

# KV positions per block the engine can page by
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)

# The waiting queue's orders (`scheduler.POLICIES`)
FCFS, SHORTEST_FIRST, LONGEST_FIRST = "fcfs", "shortest-first", "longest-first"
POLICY_NAMES = (FCFS, SHORTEST_FIRST, LONGEST_FIRST)

# How continuous batching takes KV blocks (`scheduler.ADMISSIONS`)
PREEMPT, RESERVE = "preempt", "reserve"
ADMISSION_NAMES = (PREEMPT, RESERVE)
