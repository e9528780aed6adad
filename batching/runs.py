"""One run of a queue on a batcher: requests submitted on an arrival schedule, every event kept.

The benchmark, the page's comparison and the tests all run queues through `ScheduledRun`, so wall time has one
definition: from the moment the arrival clock starts to the end of the step that finished the last request.
"""

from __future__ import annotations

import math
import queue
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from batching.arrivals import ArrivalDriver, Schedule
from batching.engine.batcher import Batcher
from batching.engine.events import Event, FinishedEvent, PreemptedEvent, StepEvent, TokenEvent
from batching.engine.request import Request


@dataclass(frozen=True)
class LaneClock:
    """What a `StepClock` reads while it runs: wall time (`WALL`), or the CPU time of the thread that steps (`CPU`:
    only the step's own work, never the time other processes took the core, which on a shared machine can be most
    of a step's wall time; valid when the step's work all runs on that thread, a CPU model on one torch thread)."""

    name: str
    read: Callable[[], float]


WALL = LaneClock("wall", time.perf_counter)
CPU = LaneClock("cpu", time.thread_time)


class StepClock:
    """A clock that runs only while its owner says so (`resume`/`pause`); waiting for an arrival jumps it forward.

    A private batcher or a race lane reads it, so its timings count only its own steps, however busy the
    machine is with others. `slept` is the total of the jumps (idle time waiting for arrivals). `source` says what
    it counts while running (wall time by default).
    """

    def __init__(self, start: float | None = None, source: LaneClock = WALL) -> None:
        self._read = source.read
        self._base = time.perf_counter() if start is None else start
        self._resumed: float | None = None
        self.slept = 0.0

    def __call__(self) -> float:
        running = self._read() - self._resumed if self._resumed is not None else 0.0
        return self._base + running

    def resume(self) -> None:
        self._resumed = self._read()

    def pause(self) -> None:
        self._base = self()
        self._resumed = None

    def sleep(self, seconds: float) -> None:
        self._base += max(0.0, seconds)
        self.slept += max(0.0, seconds)


@dataclass
class RunRecord:
    """Everything one batcher emitted during one run, with the run's own start time (all times are relative to it)."""

    mode: str
    start: float
    end: float = math.nan
    steps: list[StepEvent] = field(default_factory=list)
    finished: list[FinishedEvent] = field(default_factory=list)
    tokens: list[TokenEvent] = field(default_factory=list)
    preempted: list[PreemptedEvent] = field(default_factory=list)
    slots: int = 0

    def add(self, event: Event) -> None:
        if isinstance(event, StepEvent):
            self.steps.append(event)
            self.slots = max(self.slots, len(event.slots))
        elif isinstance(event, FinishedEvent):
            self.finished.append(event)
        elif isinstance(event, PreemptedEvent):
            self.preempted.append(event)
        else:
            self.tokens.append(event)

    def extend(self, events: Iterable[Event]) -> None:
        for event in events:
            self.add(event)

    @property
    def wall_s(self) -> float:
        return self.end - self.start


class ScheduledRun:
    """Submit `build(index, arrival)`'s requests to `batcher` on `schedule` and step until all have finished.

    Iterate `events()` to watch the run; afterwards `record` holds every event and the run's wall time.
    """

    def __init__(
        self,
        batcher: Batcher,
        schedule: Schedule,
        build: Callable[[int, float], Request],
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """`sleep` is how an idle run waits for its next arrival (a clock of its own may jump instead of waiting)."""
        self.batcher = batcher
        self.requests: dict[str, Request] = {}

        def submit(index: int, arrival: float) -> None:
            self._submit(build(index, arrival))

        self.driver = ArrivalDriver(schedule, submit, clock=batcher.clock, sleep=sleep)
        self.record = RunRecord(batcher.mode, math.nan, slots=batcher.max_batch_size)

    def _submit(self, request: Request) -> None:
        self.requests[request.request_id] = self.batcher.submit(request)

    def elapsed(self) -> float:
        """Seconds on the batcher's clock since the run started (0 before it has)."""
        started = self.driver.started
        return 0.0 if started is None else self.batcher.clock() - started

    def add_late(self, make: Callable[[float], Request], at_s: float) -> None:
        """One more request, arriving `at_s` seconds after the start: `make(arrival)` builds it when it is due."""
        self.driver.add_at(at_s, lambda arrival: self._submit(make(arrival)))

    def stop(self) -> int:
        """Stop the run: requests yet to arrive never will, the others are cancelled. Returns how many were dropped."""
        dropped = self.driver.drop_pending()
        for request_id, request in self.requests.items():
            if not request.is_finished:
                self.batcher.cancel(request_id)
        return dropped

    def events(self) -> Iterator[Event]:
        while (events := self.advance()) is not None:
            yield from events

    def advance(self) -> list[Event] | None:
        """Submit what is due and take one step; None once every request has finished (the record is complete)."""
        if self.driver.started is None:
            self.record.start = self.driver.start()
        events = step_once(self.batcher, self.driver)
        if events is None:
            # The run ends with the step that finished its last request (a run with no step ends now).
            self.record.end = self.record.steps[-1].end if self.record.steps else self.batcher.clock()
            return None
        self.record.extend(events)
        return events

    def complete(self) -> RunRecord:
        """Run to the end without watching."""
        for _ in self.events():
            pass
        return self.record


def drive(batcher: Batcher, driver: ArrivalDriver) -> Iterator[Event]:
    """Step `batcher` until every scheduled request has been submitted and finished, submitting between steps."""
    if driver.started is None:
        driver.start()
    while (events := step_once(batcher, driver)) is not None:
        yield from events


def step_once(batcher: Batcher, driver: ArrivalDriver) -> list[Event] | None:
    """Submit what is due (waiting for the next arrival while idle) and take one step; None when all is done."""
    driver.release(batcher.step_index)
    while not batcher.has_work and not driver.done:
        driver.wait_idle()
    return batcher.step() if batcher.has_work else None


T = TypeVar("T")


def drain(inbox: queue.Queue[T] | queue.SimpleQueue[T], timeout: float = 0.0) -> list[T]:
    """Everything waiting in `inbox`, after waiting up to `timeout` s for the first (0: no wait): how a run's
    consumer polls the events another thread puts there."""
    found: list[T] = []
    try:
        found.append(inbox.get(timeout=timeout) if timeout > 0 else inbox.get_nowait())
        while True:
            found.append(inbox.get_nowait())
    except queue.Empty:
        pass
    return found
