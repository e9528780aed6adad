"""Batchers of a client's own in the engine process: private batchers, and races (a continuous and a static lane
of its own, stepped in turn on fair clocks: `batching.race`).

Their requests pass the engine's own checks here, as a shared batcher's do; the queue limits do not apply (a
private run's queue is the client's own, run on a clock of its own).
"""

from __future__ import annotations

from collections.abc import Sequence

from batching.arrivals import Schedule
from batching.engine.batcher import MODES
from batching.engine.options import BatcherOptions
from batching.engine.request import Request
from batching.race import check_pause
from batching.service.admission import Admission
from batching.service.handles import Item, PrivateBatcher, PrivateRun, RaceHandle
from batching.service.lifecycle import EngineLifecycle
from batching.service.messages import (
    ClosePrivate,
    CloseRace,
    OpenPrivate,
    RaceAdd,
    RacePace,
    RunPrivate,
    StartRace,
    StopRace,
)
from batching.service.routing import Router


class PrivateRuns:
    """Opens, runs and closes private batchers and races on `lifecycle`'s engine, registered in `router`."""

    def __init__(self, lifecycle: EngineLifecycle, router: Router, admission: Admission) -> None:
        self.lifecycle = lifecycle
        self.router = router
        self.admission = admission

    # --- private batchers ------------------------------------------------------------------------------------
    def open_private(self, mode: str, options: BatcherOptions) -> PrivateBatcher:
        """A batcher of your own in the engine process, stepped in its loop with a clock of its own."""
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} is not allowed: choose one of {', '.join(MODES)}")
        self.lifecycle.ensure_running()
        private = PrivateBatcher(self, self.router.new_id("p"), mode, options)
        self.router.add(private)
        self.lifecycle.send(OpenPrivate(private.batcher_id, mode, options))
        return private

    def run_private(self, private: PrivateBatcher, items: Sequence[Item], schedule: Schedule) -> PrivateRun:
        _one_arrival_each(items, schedule)
        requests = self._build(private.options, items)
        run = private.current = PrivateRun(private.mode, private.options.max_batch_size)
        self.lifecycle.send(RunPrivate(private.batcher_id, requests, schedule))
        return run

    def close_private(self, private: PrivateBatcher) -> None:
        if self.router.remove_private(private.batcher_id):
            self.lifecycle.send_if_alive(ClosePrivate(private.batcher_id))

    # --- races -----------------------------------------------------------------------------------------------
    def start_race(
        self,
        options: BatcherOptions,
        items: Sequence[Item],
        schedule: Schedule,
        pause_s: float = 0.0,
        cpu_clock: bool = False,
    ) -> RaceHandle:
        """Race (prompt, params, request id) items on a continuous and a static lane of your own, arriving on
        `schedule` on each lane's clock (`cpu_clock`: CPU time where that is a step's whole work); raises ValueError
        for bad input (nothing is started then)."""
        _one_arrival_each(items, schedule)
        check_pause(pause_s)
        self.lifecycle.ensure_running()
        requests = self._build(options, items)
        race = RaceHandle(self, self.router.new_id("race"), options)
        self.router.add(race)
        self.lifecycle.send(StartRace(race.race_id, options, requests, schedule, pause_s, cpu_clock))
        return race

    def race_add(self, race: RaceHandle, item: Item) -> None:
        """A prompt typed during the race joins every lane; raises ValueError for bad input."""
        (request,) = self._build(race.options, [item])
        self.lifecycle.send(RaceAdd(race.race_id, request))

    def race_send(self, message: RacePace | StopRace) -> None:
        """Slow a race down or stop it; a dead engine has stopped it already."""
        self.lifecycle.send_if_alive(message)

    def close_race(self, race: RaceHandle) -> None:
        if self.router.remove_race(race.race_id):
            self.lifecycle.send_if_alive(CloseRace(race.race_id))

    def _build(self, options: BatcherOptions, items: Sequence[Item]) -> tuple[Request, ...]:
        """Each (prompt, params, request id) item as a request, checked as the engine would; ValueError if not."""
        builder = self.admission.builder(options)
        return tuple(builder.build(prompt, params, request_id) for prompt, params, request_id in items)


def _one_arrival_each(items: Sequence[Item], schedule: Schedule) -> None:
    if len(items) != len(schedule):
        raise ValueError(f"{len(items)} requests but {len(schedule)} arrival times: give one per request")
