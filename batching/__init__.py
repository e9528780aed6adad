"""Batchscope's engine and what drives it.

- `batching.engine`: the core (requests, scheduler, KV cache, runner, batcher); imports nothing else of ours.
- `batching.arrivals`, `batching.runs`: arrival schedules, and one run of a queue on a batcher.
- `batching.service`: one shared engine for every browser tab.
- `batching.bench`: the benchmark CLI (`python -m batching.bench`), its report, plot, peers and workloads.
"""

from batching.arrivals import Schedule
from batching.engine import (
    MODES,
    POLICIES,
    Batcher,
    BatcherOptions,
    Event,
    FinishedEvent,
    FinishReason,
    Request,
    RequestParams,
    SamplingParams,
    StepEvent,
    TokenEvent,
)
from batching.runs import RunRecord, ScheduledRun

__all__ = [
    "MODES",
    "POLICIES",
    "Batcher",
    "BatcherOptions",
    "Event",
    "FinishReason",
    "FinishedEvent",
    "Request",
    "RequestParams",
    "RunRecord",
    "SamplingParams",
    "Schedule",
    "ScheduledRun",
    "StepEvent",
    "TokenEvent",
]
