"""What a race asks for (`Inputs`, checked before the model loads) and needs (`Plan`, checked before any timing),
what one timed run of a mode gives (`ModeRun`), and what a peer engine offers (`Peer`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from batching.arrivals import Schedule
from batching.bench.workloads import Workload
from batching.engine.events import FinishedEvent
from batching.engine.options import BatcherOptions
from batching.runs import RunRecord


@dataclass(frozen=True)
class Inputs:
    """What the flags ask for, checked before the model is loaded: the modes, the workload, its arrivals."""

    modes: tuple[str, ...]
    workload: Workload
    schedule: Schedule


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


class Peer(Protocol):
    """Another engine run on the same plan: transformers' continuous batching, llama.cpp's server."""

    def warm_up(self, prompt: Sequence[int], max_new_tokens: int = 4) -> None: ...

    def outside_cpu_s(self) -> float:
        """CPU seconds used so far by its processes other than this one (a server's), for the run's CPU time."""
        ...

    def hold(self, paused: bool) -> None:
        """Pause or resume its processes other than this one (a server's) while other contenders run."""
        ...

    def run(
        self,
        prompts: Sequence[Sequence[int]],
        caps: Sequence[int],
        schedule: Schedule,
        ignore_eos: bool,
        mode: str = ...,
        on_finished: Callable[[FinishedEvent], object] | None = None,
    ) -> tuple[RunRecord, list[int]]:
        """Run the requests on `schedule`; the run as events, and each step's longest sequence (empty if unknown)."""
        ...
