"""A load sweep: the same prompt mix at a list of request rates, each rate a race of both schedules.

At each rate the mix's requests arrive on the same seeded Poisson schedule (`Schedule.poisson`: the seed fixes the
exponential draws, so a higher rate is the same arrivals closer together) on a continuous and a static lane, each
on a clock that counts only its own steps and jumps idle gaps (`batching.race`). What each lane recorded is the
sweep's data; `utils.sweep` turns it into latency percentiles, SLO attainment, goodput and knees.

The page runs each rate as a private race in the engine process (`app.sweep_view`); the CLI
(`python -m batching.bench.sweep`) and the tests run them here, in-process, with `run_rate`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from batching.arrivals import Schedule
from batching.engine.batcher import Batcher
from batching.engine.request import Request
from batching.race import LaneStep, Race
from batching.runs import RunRecord, StepClock

# From below static batching's capacity to above continuous batching's on the embedded model (docs/benchmarks.md):
# low rates cost the most compute (little batching), high ones little (the lanes' clocks jump no idle gaps there).
DEFAULT_RATES = (2.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0)
DEFAULT_REQUESTS = 32
MAX_RATES = 24
MAX_REQUESTS = 1024

Item = TypeVar("Item")


def parse_rates(text: str) -> tuple[float, ...]:
    """Request rates from a comma (or space) separated list, in ascending order; ValueError names the bad part."""
    parts = [part for part in text.replace(",", " ").split() if part]
    if not parts:
        raise ValueError("give at least one request rate, e.g. 2, 4, 8")
    rates = []
    for part in parts:
        try:
            rate = float(part)
        except ValueError:
            raise ValueError(f"request rate {part!r} is not a number: write rates like 2, 4, 8") from None
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"request rate {part!r} is not allowed: every rate must be a number above 0")
        rates.append(rate)
    return tuple(sorted(set(rates)))


def format_rates(rates: Sequence[float]) -> str:
    return ", ".join(f"{rate:g}" for rate in rates)


@dataclass(frozen=True)
class SweepSpec:
    """What a sweep runs: the rates (ascending), how many requests arrive at each, and the arrivals' seed."""

    rates: tuple[float, ...]
    requests: int = DEFAULT_REQUESTS
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.rates or len(self.rates) > MAX_RATES:
            raise ValueError(f"{len(self.rates)} request rates are not allowed: give 1 to {MAX_RATES}")
        if tuple(sorted(set(self.rates))) != self.rates or not all(math.isfinite(r) and r > 0 for r in self.rates):
            raise ValueError("request rates must be distinct numbers above 0, in ascending order")
        if not 1 <= self.requests <= MAX_REQUESTS:
            raise ValueError(f"requests={self.requests} per rate is not allowed: choose 1 to {MAX_REQUESTS}")
        if self.seed < 0:
            raise ValueError(f"seed={self.seed} is not allowed: must be >= 0")

    def schedule(self, rate: float) -> Schedule:
        """This rate's arrivals: the same seeded draws at every rate, scaled by 1 / rate."""
        return Schedule.poisson(self.requests, rate, self.seed)

    def mix(self, items: Sequence[Item]) -> list[Item]:
        """The requests of one rate: the mix's items in order, from the start again until there are enough."""
        if not items:
            raise ValueError("the prompt mix is empty: load a workload or add prompts first")
        return [items[index % len(items)] for index in range(self.requests)]

    @property
    def total_requests(self) -> int:
        """Requests the whole sweep finishes, counting each lane's."""
        return len(self.rates) * self.requests * 2


def run_rate(
    make_batcher: Callable[[str, StepClock], Batcher],
    requests: Sequence[Request],
    schedule: Schedule,
    on_step: Callable[[LaneStep], object] | None = None,
) -> dict[str, RunRecord]:
    """One rate of the sweep in this process: a race of `requests` arriving on `schedule`; each lane's record."""
    race = Race(make_batcher, requests, schedule)
    while (step := race.step()) is not None:
        if on_step is not None:
            on_step(step)
    return {mode: lane.run.record for mode, lane in race.lanes.items()}
