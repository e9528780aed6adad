"""What a benchmark run needs (`Plan`, checked before any timing) and what one timed run of a mode gives (`ModeRun`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from batching.arrivals import Schedule
from batching.bench.workloads import Workload
from batching.engine.batcher import BatcherOptions
from batching.runs import RunRecord


@dataclass(frozen=True)
class Plan:
    """Everything a run needs, validated: token ids and caps in workload order, the arrival schedule."""

    workload: Workload
    modes: tuple[str, ...]
    prompt_ids: tuple[tuple[int, ...], ...]
    caps: tuple[int, ...]
    schedule: Schedule
    options: BatcherOptions
    ignore_eos: bool


@dataclass
class ModeRun:
    """One timed run of one mode: its events, the longest sequence in each step (for step-time statistics), and
    the CPU time the process used (well below the wall time when other work on the machine took the CPU)."""

    record: RunRecord
    kv_lens: list[int] = field(default_factory=list)
    cpu_s: float = math.nan
