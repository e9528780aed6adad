"""The engine loop's state, without any I/O: every batcher of the server, stepped round-robin by one thread.

Shared batchers (one per `BatcherOptions` in use: a tab's batch size and policy pick one) take the requests of
every client; a batcher nobody used for `idle_shared_batcher_timeout_s` is closed, freeing its cache, and at most
`max_shared_batchers` live at once. Private batchers run a client's own queue on a clock of their own (`StepClock`), so
their timings count only their own steps, however busy the shared ones are; a race (`batching.race`) is a pair of
them stepped in turn, the lane that is behind first, with an optional slow-motion pause between its steps.
Outputs leave through `emit`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from batching.engine.batcher import MODES, Batcher
from batching.engine.compiled import CompileState, compile_state
from batching.engine.events import Event, FinishedEvent
from batching.engine.options import BatcherOptions
from batching.engine.request import FinishReason, Request
from batching.race import LaneStep, Race
from batching.runs import CPU, WALL, ScheduledRun, StepClock
from batching.service.messages import (
    Cancel,
    ClosePrivate,
    CloseRace,
    Command,
    EngineStats,
    LaneOutputs,
    OpenPrivate,
    Outputs,
    RaceAdd,
    RaceEnded,
    RacePace,
    RunEnded,
    RunPrivate,
    StartRace,
    StopRace,
    Submit,
)
from config.settings import EngineSettings

logger = logging.getLogger(__name__)

GRAPH_POLL_S = 0.25  # how often an engine whose only races wait for their graphs looks whether they are made

Emit = Callable[[object], None]


@dataclass
class SharedBatcher:
    """A shared batcher as the engine holds it: closed once idle for long enough, or for a new one at the limit."""

    batcher: Batcher
    last_used: float = field(default_factory=time.monotonic)


@dataclass
class PrivateBatcherState:
    """A client's private batcher as the engine holds it (the client's handle is `handles.PrivateBatcher`)."""

    batcher: Batcher
    clock: StepClock
    run: ScheduledRun | None = None


def failed(request_id: str, message: str) -> FinishedEvent:
    """The event that ends a request the engine could not run."""
    now = time.perf_counter()
    return FinishedEvent(request_id, FinishReason.ERROR, (), "", 0, now, None, None, now, None, message)


class EngineCore:
    """Owns every batcher; `handle` applies a client's command, `step_round` steps each batcher with work once."""

    def __init__(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, settings: EngineSettings, emit: Emit
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.settings = settings
        self.emit = emit
        self.shared: dict[BatcherOptions, SharedBatcher] = {}
        self.private: dict[str, PrivateBatcherState] = {}
        self.races: dict[str, Race] = {}
        self.owner: dict[str, BatcherOptions] = {}  # in-flight shared request -> its batcher
        self._compile_sent: CompileState | None = None

    @property
    def has_work(self) -> bool:
        return self.next_work_s() == 0.0

    def next_work_s(self) -> float | None:
        """Seconds until a batcher can step (0: now; > 0: only slow-motion races, paused, or races waiting for their
        graphs, looked at again in `GRAPH_POLL_S`), or None when idle."""
        if self._batchers_busy():
            return 0.0
        if not self.races:
            return None
        timed = [race for race in self.races.values() if not race.graphs_pending()]
        if not timed:
            return GRAPH_POLL_S
        now = time.monotonic()
        return min(race.wait_s(now) for race in timed)

    def holds_compiles(self) -> bool:
        """Whether a background compile must wait: while any batcher has work (a slow-motion race's pauses count),
        so no step, and no figure, ever shares the cores with a compile. A race waiting for its graphs is not
        work: its graphs are what runs."""
        return self._batchers_busy() or any(not race.graphs_pending() for race in self.races.values())

    def _batchers_busy(self) -> bool:
        """Whether a shared batcher has work or a private run is going."""
        return any(s.batcher.has_work for s in self.shared.values()) or any(
            p.run is not None for p in self.private.values()
        )

    def stats(self) -> EngineStats:
        self._compile_sent = compile_state(self.model, self.settings.compile_steps)
        live = len(self.private) + len(MODES) * len(self.races)
        return EngineStats(tuple(self.shared), live, self._compile_sent)

    # --- commands ---------------------------------------------------------------------------------------------
    def handle(self, command: Command) -> None:
        if isinstance(command, Submit):
            self._submit(command.options, command.request)
        elif isinstance(command, Cancel):
            for request_id in command.request_ids:
                options = self.owner.get(request_id)
                if options is not None:
                    self.shared[options].batcher.cancel(request_id)
        elif isinstance(command, OpenPrivate):
            clock = StepClock()
            batcher = Batcher(self.model, self.tokenizer, command.options, mode=command.mode, clock=clock)
            self.private[command.batcher_id] = PrivateBatcherState(batcher, clock)
            self.emit(self.stats())
        elif isinstance(command, RunPrivate):
            self._start_private_run(command)
        elif isinstance(command, ClosePrivate):
            if self.private.pop(command.batcher_id, None) is not None:
                self.emit(self.stats())
        elif isinstance(command, StartRace | RaceAdd | RacePace | StopRace | CloseRace):
            self._handle_race(command)
        else:
            raise TypeError(f"unknown command {command!r}")

    def _submit(self, options: BatcherOptions, request: Request) -> None:
        shared = self.shared.get(options)
        if shared is None:
            shared = self._open_shared(options)
            if shared is None:
                limit = self.settings.max_shared_batchers
                message = (
                    f"every one of the max_shared_batchers={limit} shared batchers is busy: try a batch size and "
                    "policy in use"
                )
                self.emit(Outputs(options, (failed(request.request_id, message),)))
                return
        shared.last_used = time.monotonic()
        self.owner[request.request_id] = options
        shared.batcher.submit(request)

    def _open_shared(self, options: BatcherOptions) -> SharedBatcher | None:
        """A new shared batcher, closing the least recently used idle one if `max_shared_batchers` are live."""
        if len(self.shared) >= self.settings.max_shared_batchers:
            idle = [(s.last_used, key) for key, s in self.shared.items() if not s.batcher.has_work]
            if not idle:
                return None
            self._close_shared(min(idle)[1])
        shared = self.shared[options] = SharedBatcher(Batcher(self.model, self.tokenizer, options))
        self.emit(self.stats())
        return shared

    def _close_shared(self, options: BatcherOptions) -> None:
        del self.shared[options]
        logger.info("closed the shared batcher %s", options)

    def _start_private_run(self, command: RunPrivate) -> None:
        private = self.private.get(command.batcher_id)
        if private is None:
            self.emit(RunEnded(command.batcher_id, 0.0, 0.0, f"no private batcher {command.batcher_id!r} is open"))
            return
        requests = command.requests

        def build(index: int, arrival: float) -> Request:
            request = requests[index]
            request.times.arrival = arrival
            return request

        private.run = ScheduledRun(private.batcher, command.schedule, build, sleep=private.clock.sleep)

    # --- races ---------------------------------------------------------------------------------------------------
    def _handle_race(self, command: StartRace | RaceAdd | RacePace | StopRace | CloseRace) -> None:
        race = self.races.get(command.race_id)
        if isinstance(command, StartRace):
            self._start_race(command)
        elif isinstance(command, RaceAdd):
            if race is None:  # it ended while the request was on its way: say so on every lane
                message = "the race had already ended; press Generate again"
                for mode in MODES:
                    step = LaneStep(mode, (failed(command.request.request_id, message),), (), 0.0, True)
                    self.emit(LaneOutputs(command.race_id, step))
                return
            race.add(command.request)
        elif race is None:
            return
        elif isinstance(command, RacePace):
            race.set_pause(command.pause_s)
        elif isinstance(command, StopRace):
            race.stop()
        else:
            del self.races[command.race_id]
            self.emit(self.stats())

    def _start_race(self, command: StartRace) -> None:
        def make(mode: str, clock: StepClock) -> Batcher:
            return Batcher(self.model, self.tokenizer, command.options, mode=mode, clock=clock)

        # CPU time counts a step's work only when all of it runs on this thread: a CPU model on one torch thread.
        alone = self.model.device.type == "cpu" and torch.get_num_threads() == 1
        clock = CPU if command.cpu_clock and alone else WALL
        try:
            self.races[command.race_id] = Race(
                make, command.requests, command.schedule, command.pause_s, clock=clock, graphs_first=True
            )
        except ValueError as exc:
            self.emit(RaceEnded(command.race_id, error=str(exc)))
            return
        self.emit(self.stats())

    def _step_race(self, race_id: str, race: Race) -> None:
        try:
            step = race.step()
        except Exception as exc:  # this race ends with the message; the other batchers go on
            logger.exception("race %s failed", race_id)
            del self.races[race_id]
            self.emit(RaceEnded(race_id, error=f"{type(exc).__name__}: {exc}"))
            self.emit(self.stats())
            return
        if step is not None:
            self.emit(LaneOutputs(race_id, step))
        if race.done:
            del self.races[race_id]
            walls = tuple((mode, lane.run.record.start, lane.run.record.end) for mode, lane in race.lanes.items())
            self.emit(RaceEnded(race_id, walls, clock=race.clock.name))
            self.emit(self.stats())

    # --- the loop's work ----------------------------------------------------------------------------------------
    def step_round(self) -> None:
        """One step of every batcher with work, shared and private alike (a race: one step of its lane behind)."""
        for options, shared in list(self.shared.items()):
            if shared.batcher.has_work:
                self._step_shared(options, shared)
        for batcher_id, private in list(self.private.items()):
            if private.run is not None:
                self._step_private(batcher_id, private)
        now = time.monotonic()
        for race_id, race in list(self.races.items()):
            if not race.graphs_pending() and race.wait_s(now) == 0.0:
                self._step_race(race_id, race)
        if compile_state(self.model, self.settings.compile_steps) != self._compile_sent:  # a graph was made, or failed
            self.emit(self.stats())

    def _step_shared(self, options: BatcherOptions, shared: SharedBatcher) -> None:
        try:
            events = shared.batcher.step()
        except Exception as exc:  # the batcher is broken: its requests end, the other batchers go on
            logger.exception("shared batcher %s failed", options)
            message = f"the shared batcher failed ({type(exc).__name__}: {exc}); try again"
            events = [failed(rid, message) for rid, owner in self.owner.items() if owner == options]
            self._close_shared(options)
            self.emit(self.stats())
        shared.last_used = time.monotonic()
        self._forget_finished(events)
        if events:
            self.emit(Outputs(options, tuple(events)))

    def _forget_finished(self, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, FinishedEvent):
                self.owner.pop(event.request_id, None)

    def _step_private(self, batcher_id: str, private: PrivateBatcherState) -> None:
        run = private.run
        assert run is not None
        private.clock.resume()
        try:
            events = run.advance()
        except Exception as exc:
            logger.exception("private batcher %s failed", batcher_id)
            private.run = None
            self.emit(RunEnded(batcher_id, run.record.start, private.clock(), f"{type(exc).__name__}: {exc}"))
            return
        finally:
            private.clock.pause()
        if events is None:
            private.run = None
            self.emit(RunEnded(batcher_id, run.record.start, run.record.end))
        elif events:
            self.emit(Outputs(batcher_id, tuple(events)))

    def close_idle(self, now: float | None = None) -> int:
        """Close shared batchers no one used for `idle_shared_batcher_timeout_s`; returns how many."""
        now = time.monotonic() if now is None else now
        limit = self.settings.idle_shared_batcher_timeout_s
        idle = [k for k, s in self.shared.items() if not s.batcher.has_work and now - s.last_used >= limit]
        for options in idle:
            self._close_shared(options)
        if idle:
            self.emit(self.stats())
        return len(idle)
