"""When each request of a run is submitted: all at once, just before engine step k, at given times, or Poisson.

The driver submits between engine steps (a batcher admits at the start of its next step), so one schedule drives
the static and the continuous batcher, and the transformers peer, the same way. The benchmark and the page both
use it.
"""

from __future__ import annotations

import heapq
import itertools
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from batching.engine.batcher import Clock

AT_ONCE = "at-once"
PER_STEP = "per-step"
TIMED = "timed"
KINDS = (AT_ONCE, PER_STEP, TIMED)


@dataclass(frozen=True)
class Schedule:
    """When each request (by its index in the workload) arrives: `due[i]` is a step index or seconds from the start."""

    kind: str
    due: tuple[float, ...]
    description: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"arrival kind {self.kind!r} is not allowed: choose one of {', '.join(KINDS)}")
        if any(not value >= 0 for value in self.due):
            raise ValueError("arrival steps and times must be >= 0")

    def __len__(self) -> int:
        return len(self.due)

    @classmethod
    def at_once(cls, count: int) -> Schedule:
        return cls(AT_ONCE, (0.0,) * count, "every request at once")

    @classmethod
    def per_step(cls, steps: Sequence[int]) -> Schedule:
        """Request i is submitted just before engine step `steps[i]` (0 = before the first step)."""
        return cls(PER_STEP, tuple(float(step) for step in steps), "each request just before its engine step")

    @classmethod
    def timed(cls, seconds: Sequence[float], description: str = "at the workload's arrival times") -> Schedule:
        return cls(TIMED, tuple(float(second) for second in seconds), description)

    @classmethod
    def poisson(cls, count: int, rate_per_s: float, seed: int = 0) -> Schedule:
        """A Poisson stream: the first request at 0 s, then exponential gaps with mean 1/rate; the seed fixes it."""
        if not rate_per_s > 0:
            raise ValueError(f"rate={rate_per_s} is not allowed: must be > 0 requests/s")
        rng = random.Random(seed)
        times, now = [], 0.0
        for index in range(count):
            if index:
                now += rng.expovariate(rate_per_s)
            times.append(now)
        return cls.timed(times, f"Poisson arrivals at {rate_per_s:g} requests/s (seed {seed})")


class ArrivalDriver:
    """Submits each request (calls `submit(index, arrival)`) once its step or time has come.

    `arrival` is the clock time the request arrived: its scheduled time (timed schedules: the driver can only
    submit between steps, and the wait for the step in flight is part of the request's latency), else now.

    Call `release(steps_done)` between steps; when the engine has nothing to do, `wait_idle()` moves on to the next
    arrival: it sleeps until the next time, or (per-step) releases the next group at once, since an idle engine
    takes no steps.

    `add_at(seconds, submit)` adds an arrival after the start (a prompt typed during a race joins each lane at the
    same clock time): it is timed, whatever the schedule's kind.
    """

    def __init__(
        self,
        schedule: Schedule,
        submit: Callable[[int, float], object],
        clock: Clock = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.schedule = schedule
        self.submit = submit
        self.clock = clock
        self.sleep = sleep
        self._order = sorted(range(len(schedule)), key=lambda index: schedule.due[index])
        self._next = 0
        self._late: list[tuple[float, int, Callable[[float], object]]] = []  # a heap of (seconds, order, submit)
        self._late_order = itertools.count()
        self._late_submitted = 0
        self.started: float | None = None

    def start(self) -> float:
        """Start the clock the arrival times count from; returns that time."""
        self.started = self.clock()
        return self.started

    @property
    def done(self) -> bool:
        """Every request has been submitted."""
        return self._scheduled_done and not self._late

    @property
    def _scheduled_done(self) -> bool:
        return self._next >= len(self._order)

    @property
    def submitted(self) -> int:
        return self._next + self._late_submitted

    def add_at(self, seconds: float, submit: Callable[[float], object]) -> None:
        """One more arrival, `seconds` after the start: `submit(arrival)` is called when it is due."""
        if not seconds >= 0:
            raise ValueError(f"arrival at {seconds} s is not allowed: must be >= 0 s after the start")
        heapq.heappush(self._late, (seconds, next(self._late_order), submit))

    def drop_pending(self) -> int:
        """Forget every arrival not yet submitted (a stopped run); returns how many."""
        dropped = len(self._order) - self._next + len(self._late)
        self._next = len(self._order)
        self._late.clear()
        return dropped

    def _elapsed(self) -> float:
        """Seconds since the clock started (starting it now if it has not)."""
        started = self.start() if self.started is None else self.started
        return self.clock() - started

    def release(self, steps_done: int) -> int:
        """Submit every request now due: its step is <= `steps_done`, or its time has passed. Returns how many."""
        elapsed = self._elapsed()
        count = self._release_through(elapsed if self.schedule.kind == TIMED else steps_done)
        return count + self._release_late(elapsed)

    def wait_idle(self) -> int:
        """The engine is idle but requests are still to come: wait for (or jump to) the next one and submit it."""
        if self.done:
            return 0
        late = self._late[0][0] if self._late else None
        if not self._scheduled_done:
            upcoming = self.schedule.due[self._order[self._next]]
            if self.schedule.kind != TIMED:
                return self._release_through(upcoming)
            if late is None or upcoming <= late:
                self.sleep(max(0.0, upcoming - self._elapsed()))
                return self._release_through(max(upcoming, self._elapsed()))
        assert late is not None
        self.sleep(max(0.0, late - self._elapsed()))
        return self._release_late(max(late, self._elapsed()))

    def _release_late(self, reached: float) -> int:
        started = self.start() if self.started is None else self.started
        count = 0
        while self._late and self._late[0][0] <= reached:
            seconds, _, submit = heapq.heappop(self._late)
            submit(started + seconds)
            count += 1
        self._late_submitted += count
        return count

    def _release_through(self, reached: float) -> int:
        due = self.schedule.due
        timed = self.schedule.kind == TIMED
        started = self.start() if self.started is None else self.started
        count = 0
        while self._next < len(self._order) and due[self._order[self._next]] <= reached:
            index = self._order[self._next]
            self.submit(index, started + due[index] if timed else self.clock())
            self._next += 1
            count += 1
        return count
