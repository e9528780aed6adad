"""The page's view of a load sweep (`batching.sweep`): one private race per rate in the engine process, started one
after the other, each lane's steps folded into a record on that lane's clock, and a sweep point per lane once a
rate's race is over; with `auto` rates, a first race of every request at once picks them. Plain Python, tested
without Streamlit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from app.common.baton import Baton, Follower
from app.common.streaming import RaceEnd
from batching.arrivals import Schedule
from batching.engine.batcher import MODES
from batching.engine.events import FinishedEvent
from batching.race import LaneStep
from batching.runs import RunRecord
from batching.sweep import SweepSpec, auto_rates, capacity, format_rates
from utils.metrics.run import steps_kind
from utils.metrics.sweep import Slo, SweepPoint, goodputs, headline, record_point


class SweepRace(Protocol):
    """What the sweep needs of one rate's race in the engine (`batching.service.RaceHandle`)."""

    def poll(self, timeout: float = 0.0) -> Sequence[LaneStep | RaceEnd]: ...

    def stop(self) -> None: ...

    def close(self) -> None: ...


# Starts the race of rate number `index` (-1: the calibration race of `auto` rates) arriving on `schedule`;
# ValueError for input the engine refuses.
StartRace = Callable[[int, Schedule], SweepRace]
CALIBRATION = -1


@dataclass(frozen=True)
class Tick:
    """What one tick of the sweep did: a rate was completed (its points are new), the sweep is over, or a newer
    script run follows the sweep now (this one stops)."""

    rate_done: bool = False
    done: bool = False
    superseded: bool = False


@dataclass
class LiveSweep:
    """A sweep as the page follows it: the finished rates' points and records, and the rate running now."""

    spec: SweepSpec
    slo: Slo
    slots: int
    start_race: StartRace
    points: list[SweepPoint] = field(default_factory=list)
    records: dict[float, dict[str, RunRecord]] = field(default_factory=dict)
    steps: dict[str, str] = field(default_factory=dict)  # "continuous at 4/s" -> how its steps ran
    stopped: bool = False
    error: str | None = None
    ended: bool = False
    timer: Callable[[], float] = time.monotonic  # the page's wall clock: how long the whole sweep took to run

    def __post_init__(self) -> None:
        self.index = 0  # the rate running now (len(rates) once every rate is done)
        self.race: SweepRace | None = None
        self.lanes: dict[str, RunRecord] = {}
        self.finished: dict[str, int] = dict.fromkeys(MODES, 0)
        self.baton = Baton()  # the script run that follows this sweep (app.common.baton)
        self.started = self.timer()
        self.lane_clock = "wall"  # what the lanes' clocks counted during their steps (the engine says: cpu or wall)
        self.wall_s: float | None = None  # seconds from Run to the sweep's end, once it is over
        self.capacities: dict[str, float] = {}  # `auto`: requests/s each schedule served with every request at once

    # --- driving -------------------------------------------------------------------------------------------------
    def begin(self) -> None:
        """Start the first race (the calibration's with `auto` rates); ValueError (nothing started) if the engine
        refuses the requests."""
        self._start(CALIBRATION if self.spec.auto else 0)

    def _start(self, index: int) -> None:
        self.index = index
        self.lanes = {mode: RunRecord(mode, 0.0, slots=self.slots) for mode in MODES}
        self.finished = dict.fromkeys(MODES, 0)
        if index == CALIBRATION:
            schedule = Schedule.at_once(self.spec.requests)
        else:
            schedule = self.spec.schedule(self.spec.rates[index])
        self.race = self.start_race(index, schedule)

    @property
    def calibrating(self) -> bool:
        return self.index == CALIBRATION

    def follow(self) -> Follower:
        """This script run becomes the sweep's follower (an older one stops at its next tick)."""
        return self.baton.take()

    def tick(self, follower: Follower, timeout: float) -> Tick:
        """Wait up to `timeout` for the running race's steps and fold them in; once its race is over, record the
        rate and start the next one."""
        with follower.following() as following:
            if not following:
                return Tick(superseded=True)
            if self.ended or self.race is None:
                return Tick(done=True)
            try:
                messages = self.race.poll(timeout=timeout)
            except RuntimeError as exc:  # the engine stopped: the sweep ends with its message
                self._end(str(exc))
                return Tick(done=True)
            rate_done = False
            for message in messages:
                if isinstance(message, LaneStep):
                    self._fold(message)
                else:
                    rate_done = self._rate_over(message)
            return Tick(rate_done=rate_done, done=self.ended)

    def _fold(self, step: LaneStep) -> None:
        self.lanes[step.mode].extend(step.events)
        self.finished[step.mode] += sum(isinstance(event, FinishedEvent) for event in step.events)

    def _rate_over(self, end: RaceEnd) -> bool:
        """The running rate's race is over: keep its points (unless stopped or failed) and start the next rate."""
        assert self.race is not None
        self.race.close()
        self.race = None
        if end.error is not None:
            self._end(f"the race at {self.rate:g} requests/s failed: {end.error}")
            return False
        if self.stopped:
            self._end(None)
            return False
        for mode, start, stop in end.walls:
            record = self.lanes[mode]
            record.start, record.end = start, stop
        self.lane_clock = end.clock
        if self.calibrating:
            return self._calibrated()
        self.records[self.rate] = self.lanes
        for mode, record in self.lanes.items():
            self.points.append(record_point(mode, self.rate, record, self.slo, self.spec.requests))
            self.steps[f"{mode} at {self.rate:g}/s"] = steps_kind(record)
        if self.index + 1 < len(self.spec.rates):
            try:
                self._start(self.index + 1)
            except ValueError as exc:
                self._end(str(exc))
        else:
            self.index = len(self.spec.rates)
            self._end(None)
        return True

    def _calibrated(self) -> bool:
        """Every request at once on both lanes is over: the rates are picked from what each served per second."""
        self.capacities = {mode: capacity(record) for mode, record in self.lanes.items()}
        try:
            self.spec = replace(self.spec, rates=auto_rates(self.capacities["static"], self.capacities["continuous"]))
            self._start(0)
        except ValueError as exc:
            self._end(str(exc))
        return False

    def _end(self, error: str | None) -> None:
        self.ended = True
        self.error = error
        self.wall_s = self.timer() - self.started

    def stop(self) -> None:
        """The Stop button: the running rate is cancelled on both lanes and left out; the rates done are kept."""
        self.stopped = True
        if self.race is not None:
            self.race.stop()
        else:
            self.ended = True

    def close(self) -> None:
        """Let go of the running race (the person left: nothing will poll it)."""
        if self.race is not None:
            self.race.close()
            self.race = None
        self.ended = True

    # --- what the page shows ----------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.ended

    @property
    def rate(self) -> float:
        """The rate running now (the last one once all are done; NaN while `auto` rates are being picked)."""
        if self.calibrating or not self.spec.rates:
            return math.nan
        return self.spec.rates[min(self.index, len(self.spec.rates) - 1)]

    @property
    def completed(self) -> bool:
        """Every rate ran to its end: the headline is the whole sweep's."""
        return self.ended and not self.stopped and self.error is None and len(self.records) == len(self.spec.rates)

    @property
    def rates_done(self) -> int:
        return len(self.records)

    def headline_text(self) -> str:
        """What each schedule sustains at the target, and the ratio (the rates done so far)."""
        found = goodputs(self.points)
        return headline(found["continuous"], found["static"], self.slo)

    def requests_done(self) -> int:
        """Requests finished so far, on both lanes of every race (the progress bar's count)."""
        running = sum(self.finished.values()) if self.race is not None else 0
        races = len(self.records) + (1 if self.capacities else 0)
        return races * self.spec.requests * len(MODES) + running

    def total_requests(self) -> int:
        """Requests the whole sweep finishes on both lanes, its calibration race included."""
        races = len(self.spec.rates) + (1 if self.capacities else 0) if not self.spec.auto else None
        return self.spec.total_requests if races is None else races * self.spec.requests * len(MODES)

    def progress(self) -> float:
        if self.ended and not self.stopped and self.error is None:
            return 1.0
        return min(1.0, self.requests_done() / self.total_requests())

    def progress_line(self) -> str:
        """Where the sweep stands, in words."""
        count = len(self.spec.rates)
        swept = f"{len(self.records)} of {count} rates" if count else "no rate (they were still being picked)"
        if self.error is not None:
            return f"Stopped by an error after {swept}: {self.error}"
        if self.ended:
            verb = "Stopped" if self.stopped else "Done"
            took = f" in {self.wall_s:.0f} s" if self.wall_s is not None else ""
            return f"{verb}: {swept} swept, {self.spec.requests} requests each{took}."
        lanes = ", ".join(f"{mode} {self.finished[mode]}/{self.spec.requests}" for mode in MODES)
        if self.calibrating:
            return f"Picking the rates: every request at once on both lanes · {lanes} done"
        return f"Rate {self.index + 1} of {count}: {self.rate:g} requests/s · {lanes} done"

    def rates_line(self) -> str | None:
        """How `auto` picked the rates, once it has."""
        if not self.capacities:
            return None
        served = ", ".join(f"{mode} {self.capacities[mode]:.3g}" for mode in MODES)
        return (
            f"Rates picked for this machine: {format_rates(self.spec.rates)} requests/s, from 0.4 of the lower to 4 "
            f"times the higher of what each schedule served with every request at once ({served} requests/s)."
        )
