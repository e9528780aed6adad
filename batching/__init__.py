"""Batchscope's engine and what drives it.

- `batching.engine`: the core (requests, scheduler, KV cache, runner, batcher); imports nothing else of ours.
- `batching.arrivals`, `batching.runs`: arrival schedules, and one run of a queue on a batcher.
- `batching.service`: one shared engine for every browser tab.
- `batching.bench`: the benchmark CLI (`python -m batching.bench`), its report, plot, peers and workloads.

Started as `python -m batching.serve` or `python -m batching.bench`, the process first starts again with TCMalloc
preloaded where it is installed (`batching.allocator`). Each is imported by its own name (`from batching.engine import
Batcher`). Importing any of them first imports the engine package, which sets what torch reads once as it loads
(huge pages for its allocator, OpenMP's wait policy) before any module of ours imports torch: `batching.bench.cli`
imports torch at its top.
"""

from batching.allocator import relaunch_with_tcmalloc

# `python -m batching.serve` / `batching.bench` start again under TCMalloc before torch loads (batching/allocator.py).
relaunch_with_tcmalloc()

import batching.engine  # noqa: E402, F401  (the settings torch reads as it loads, before anything below imports it)
