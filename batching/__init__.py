"""Batchscope's engine and what drives it.

- `batching.engine`: the core (requests, scheduler, KV cache, runner, batcher); imports nothing else of ours.
- `batching.arrivals`, `batching.runs`: arrival schedules, and one run of a queue on a batcher.
- `batching.service`: one shared engine for every browser tab.
- `batching.bench`: the benchmark CLI (`python -m batching.bench`), its report, plot, peers and workloads.

Each is imported by its own name (`from batching.engine import Batcher`). Importing any of them first imports the
engine package, which sets what torch reads once as it loads (huge pages for its allocator, OpenMP's wait policy)
before any module of ours imports torch: `batching.bench.cli` imports torch at its top.
"""

import batching.engine  # noqa: F401  (the settings torch reads as it loads, before anything below imports it)
