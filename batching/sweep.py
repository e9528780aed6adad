"""A load sweep: the same prompt mix at a list of request rates, each rate a race of both schedules.

At each rate the mix's requests arrive on the same seeded Poisson schedule (`Schedule.poisson`: the seed fixes the
exponential draws, so a higher rate is the same arrivals closer together) on a continuous and a static lane, each
on a clock that counts only its own steps and jumps idle gaps (`batching.race`). What each lane recorded is the
sweep's data; `utils.metrics.sweep` turns it into latency percentiles, SLO attainment, goodput and knees.

Where a step's work all runs on the stepping thread (a CPU model on one torch thread), the lanes' clocks count that
thread's CPU time (`batching.runs.CPU`): a sweep lasts minutes, and on a machine shared with other jobs wall time
during a step could be several times its CPU time, at random, which moved knees and goodput from run to run.

The rates may be picked for the machine (`auto`): one race of every request at once first measures what each
schedule serves when it is never idle (its capacity, requests/s), and the sweep then spans from 0.4 of the lower
capacity to 4 times the higher, so it starts below static's knee and ends near every request at once, past
continuous's knee, however fast the machine is (compiled steps, or a quieter hour, move them severalfold).

The page runs each rate as a private race in the engine process (`app.sweep_view`); the CLI
(`python -m batching.bench sweep`) and the tests run them here, in-process, with `run_rate`.
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
from batching.runs import WALL, LaneClock, RunRecord, StepClock

AUTO = "auto"
AUTO_POINTS = 10
AUTO_LOW = 0.4  # the lowest rate, of the lower capacity: light load, below static's knee
AUTO_HIGH = 4.0  # the highest, of the higher capacity: near every request at once, past continuous's knee
# Enough requests that a queue can build past a target: with 32, continuous batching's first-token wait with every
# request at once stayed under 200 ms once its steps were compiled, so it met that target at any rate.
DEFAULT_REQUESTS = 48
MAX_RATES = 24
MAX_REQUESTS = 1024

Item = TypeVar("Item")


def parse_rates(text: str) -> tuple[float, ...]:
    """Request rates from a comma (or space) separated list, in ascending order, or () for `auto` (picked for the
    machine by a first race of every request at once); ValueError names the bad part."""
    if text.strip().lower() == AUTO:
        return ()
    parts = [part for part in text.replace(",", " ").split() if part]
    if not parts:
        raise ValueError("give at least one request rate, e.g. 2, 4, 8, or auto")
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
    return ", ".join(f"{rate:g}" for rate in rates) if rates else AUTO


def capacity(record: RunRecord) -> float:
    """Requests a run finished per second of its clock: with every request there at once, what its schedule serves
    when it is never idle."""
    return len(record.finished) / record.wall_s if record.wall_s > 0 else math.nan


def auto_rates(*capacities: float, points: int = AUTO_POINTS) -> tuple[float, ...]:
    """`points` rates evenly spaced on a log scale from `AUTO_LOW` of the lowest capacity (a schedule's, or a
    server's) to `AUTO_HIGH` times the highest, each rounded to two significant figures."""
    served = [rate for rate in capacities if math.isfinite(rate) and rate > 0]
    if not served:
        raise ValueError("the calibration race served nothing: give the rates yourself")
    low, high = AUTO_LOW * min(served), AUTO_HIGH * max(served)
    step = (high / low) ** (1 / (points - 1))
    return tuple(sorted({_two_figures(low * step**index) for index in range(points)}))


def _two_figures(value: float) -> float:
    return float(f"{value:.2g}")


@dataclass(frozen=True)
class SweepSpec:
    """What a sweep runs: the rates (ascending; none: `auto`, picked by a first race), how many requests arrive at
    each, and the arrivals' seed."""

    rates: tuple[float, ...] = ()
    requests: int = DEFAULT_REQUESTS
    seed: int = 0

    def __post_init__(self) -> None:
        if len(self.rates) > MAX_RATES:
            raise ValueError(f"{len(self.rates)} request rates are not allowed: give 1 to {MAX_RATES}")
        if tuple(sorted(set(self.rates))) != self.rates or not all(math.isfinite(r) and r > 0 for r in self.rates):
            raise ValueError("request rates must be distinct numbers above 0, in ascending order")
        if not 1 <= self.requests <= MAX_REQUESTS:
            raise ValueError(f"requests={self.requests} per rate is not allowed: choose 1 to {MAX_REQUESTS}")
        if self.seed < 0:
            raise ValueError(f"seed={self.seed} is not allowed: must be >= 0")

    @property
    def auto(self) -> bool:
        """The rates are still to be picked (`auto_rates`, after a race of every request at once)."""
        return not self.rates

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
        """Requests the whole sweep finishes, counting each lane's (with `auto`, its calibration race and the
        rates it will pick)."""
        races = AUTO_POINTS + 1 if self.auto else len(self.rates)
        return races * self.requests * 2


def run_rate(
    make_batcher: Callable[[str, StepClock], Batcher],
    requests: Sequence[Request],
    schedule: Schedule,
    on_step: Callable[[LaneStep], object] | None = None,
    clock: LaneClock = WALL,
) -> dict[str, RunRecord]:
    """One rate of the sweep in this process: a race of `requests` arriving on `schedule`, its lanes' clocks
    counting `clock` during their steps; each lane's record."""
    race = Race(make_batcher, requests, schedule, clock=clock)
    while (step := race.step()) is not None:
        if on_step is not None:
            on_step(step)
    return {mode: lane.run.record for mode, lane in race.lanes.items()}
