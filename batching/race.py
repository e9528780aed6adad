"""A race: the same queue on a continuous and a static batcher, stepped in turn by one loop, each on its own clock.

Both lanes share one machine, so they never run at the same time: the loop steps one lane at a time, and always
the lane whose clock is behind. Each lane's clock (`StepClock`) advances only during that lane's own steps, and
jumps forward when the lane has nothing to run until its next arrival. So at any moment both lanes have used the
same compute time, give or take one step: what the page shows side by side is where each schedule stands after
the same amount of work. A lane's wall time is its clock at its last step; the race's speed-up is the ratio of the
two clocks, which is how the benchmark measures it (each mode alone on a clock that runs only during its steps).

Slow motion (`pause_s`) waits between steps on the loop's side, outside both clocks. A prompt added during the
race (`add`) arrives on every lane at the same clock time: the clock of the lane furthest ahead.

A race may wait for its graphs (`graphs_first`): no lane steps until every compiled graph the lanes' steps go through
is made (or failed), so a first race times the same steps as every later one. Eager and compiled steps differ in
more than speed: a compiled step's time grows with its rows, an eager one's hardly does, so a race on eager steps
reads another speed-up (measured: 2.00x eager against 1.36x compiled on the same queue).
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from batching.arrivals import Schedule
from batching.engine.batcher import MODES, Batcher
from batching.engine.events import Event
from batching.engine.request import Request
from batching.runs import WALL, LaneClock, ScheduledRun, StepClock

MAX_PAUSE_S = 1.0


@dataclass
class Lane:
    """One schedule of the race: its batcher, its clock (from 0 s), its run, and arrivals not yet reported."""

    mode: str
    batcher: Batcher
    clock: StepClock
    run: ScheduledRun
    finished: bool = False
    arrived: list[tuple[str, float]] = field(default_factory=list)

    @property
    def elapsed(self) -> float:
        return self.run.elapsed()


@dataclass(frozen=True)
class LaneStep:
    """What one step of one lane did: its events, the requests that arrived before it, and the lane's clock after."""

    mode: str
    events: tuple[Event, ...]
    arrived: tuple[tuple[str, float], ...]
    elapsed: float
    finished: bool


def check_pause(pause_s: float) -> float:
    if not 0 <= pause_s <= MAX_PAUSE_S:
        raise ValueError(f"pause={pause_s} s is not allowed: choose 0 to {MAX_PAUSE_S:g} s between steps")
    return pause_s


class Race:
    """The lanes of one race; `step()` advances the lane that is behind by one step.

    `make_batcher(mode, clock)` builds each lane's batcher on its clock; `requests[i]` arrives at `schedule.due[i]`
    on every lane (each lane runs its own copy of it). `clock` says what the lanes' clocks count during their steps
    (wall time; a load sweep counts the stepping thread's CPU time where that is all of a step's work).
    """

    def __init__(
        self,
        make_batcher: Callable[[str, StepClock], Batcher],
        requests: Sequence[Request],
        schedule: Schedule,
        pause_s: float = 0.0,
        modes: Sequence[str] = MODES,
        clock: LaneClock = WALL,
        graphs_first: bool = False,
    ) -> None:
        if len(requests) != len(schedule):
            raise ValueError(f"{len(requests)} requests but {len(schedule)} arrival times: give one per request")
        self.pause_s = check_pause(pause_s)
        self.graphs_first = graphs_first
        self.ready_at = 0.0  # time.monotonic() before which slow motion holds the next step
        self.clock = clock
        self.stopped = False
        self.lanes: dict[str, Lane] = {}
        for mode in modes:
            lane_clock = StepClock(start=0.0, source=clock)
            batcher = make_batcher(mode, lane_clock)
            lane_run = ScheduledRun(batcher, schedule, self._builder(mode, requests), sleep=lane_clock.sleep)
            self.lanes[mode] = Lane(mode, batcher, lane_clock, lane_run)

    def _builder(self, mode: str, requests: Sequence[Request]) -> Callable[[int, float], Request]:
        def build(index: int, arrival: float) -> Request:
            return self._arrive(mode, requests[index], arrival)

        return build

    def _arrive(self, mode: str, request: Request, arrival: float) -> Request:
        """This lane's own copy of `request`, arriving now (lanes must not share a request's mutable state)."""
        own = copy.deepcopy(request)
        own.times.arrival = arrival
        self.lanes[mode].arrived.append((own.request_id, arrival))
        return own

    @property
    def done(self) -> bool:
        return all(lane.finished for lane in self.lanes.values())

    def graphs_pending(self) -> bool:
        """Whether the race still waits for its graphs (`graphs_first`): starts making each one not yet made (in the
        background, where the engine's idle loop lets it run) and says True while any is being made. A stopped
        race waits for nothing: its one last step reports the cancellations."""
        if not self.graphs_first:
            return False
        pending = False
        for lane in self.lanes.values():
            for compiler in lane.batcher.runner.compilers():
                if not (compiler.ready or compiler.failed):
                    compiler.start()
                    pending = True
        self.graphs_first = pending and not self.stopped
        return self.graphs_first

    def wait_s(self, now: float | None = None) -> float:
        """How long slow motion holds the next step (0 at real speed)."""
        return max(0.0, self.ready_at - (time.monotonic() if now is None else now))

    def behind(self) -> Lane | None:
        """The unfinished lane whose clock is furthest behind (the first lane on a tie), or None when all are done."""
        running = [lane for lane in self.lanes.values() if not lane.finished]
        return min(running, key=lambda lane: lane.elapsed) if running else None

    def step(self) -> LaneStep | None:
        """One step of the lane that is behind; None when every lane is done."""
        lane = self.behind()
        if lane is None:
            return None
        lane.clock.resume()
        try:
            events = lane.run.advance()
        finally:
            lane.clock.pause()
        lane.finished = events is None
        arrived, lane.arrived = tuple(lane.arrived), []
        self.ready_at = time.monotonic() + self.pause_s
        return LaneStep(lane.mode, tuple(events or ()), arrived, lane.elapsed, lane.finished)

    def add(self, request: Request) -> float:
        """`request` joins every lane at the clock time of the lane furthest ahead; returns that time (seconds)."""
        at_s = max(lane.elapsed for lane in self.lanes.values())
        for mode, lane in self.lanes.items():
            lane.run.add_late(functools.partial(self._arrive, mode, request), at_s)
            lane.finished = False
        return at_s

    def stop(self) -> None:
        """Stop every lane: requests yet to arrive never will, running ones are cancelled at their next step."""
        self.stopped = True
        for lane in self.lanes.values():
            lane.run.stop()
            lane.finished = False  # one more step reports the cancellations

    def set_pause(self, pause_s: float) -> None:
        self.pause_s = check_pause(pause_s)
        self.ready_at = min(self.ready_at, time.monotonic() + pause_s)
