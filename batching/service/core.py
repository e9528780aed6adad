"""The engine loop's state, without any I/O: every batcher of the server, stepped round-robin by one thread.

Shared batchers (one per `BatcherOptions` in use: a tab's batch size and policy pick one) take the requests of
every client; a batcher nobody used for `idle_engine_timeout_s` is closed, freeing its cache, and at most
`max_engines` live at once. Private batchers run a client's own queue on a clock of their own (`StepClock`), so
their timings count only their own steps, however busy the shared ones are. Outputs leave through `emit`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from batching.engine.batcher import Batcher, BatcherOptions
from batching.engine.events import Event, FinishedEvent
from batching.engine.request import FinishReason, Request
from batching.runs import ScheduledRun
from batching.service.messages import (
    Cancel,
    ClosePrivate,
    Command,
    EngineStats,
    OpenPrivate,
    Outputs,
    RunEnded,
    RunPrivate,
    Submit,
)
from config.settings import EngineSettings

logger = logging.getLogger(__name__)

Emit = Callable[[object], None]


class StepClock:
    """A clock that runs only while the engine loop steps its batcher; waiting for an arrival jumps it forward."""

    def __init__(self) -> None:
        self._base = time.perf_counter()
        self._resumed: float | None = None

    def __call__(self) -> float:
        running = time.perf_counter() - self._resumed if self._resumed is not None else 0.0
        return self._base + running

    def resume(self) -> None:
        self._resumed = time.perf_counter()

    def pause(self) -> None:
        self._base = self()
        self._resumed = None

    def sleep(self, seconds: float) -> None:
        self._base += max(0.0, seconds)


@dataclass
class SharedBatcher:
    batcher: Batcher
    last_used: float = field(default_factory=time.monotonic)


@dataclass
class PrivateBatcher:
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
        self.private: dict[str, PrivateBatcher] = {}
        self.owner: dict[str, BatcherOptions] = {}  # in-flight shared request -> its batcher

    @property
    def has_work(self) -> bool:
        return any(s.batcher.has_work for s in self.shared.values()) or any(
            p.run is not None for p in self.private.values()
        )

    def stats(self) -> EngineStats:
        return EngineStats(tuple(self.shared), len(self.private))

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
            self.private[command.batcher_id] = PrivateBatcher(batcher, clock)
            self.emit(self.stats())
        elif isinstance(command, RunPrivate):
            self._start_private_run(command)
        elif isinstance(command, ClosePrivate):
            if self.private.pop(command.batcher_id, None) is not None:
                self.emit(self.stats())
        else:
            raise TypeError(f"unknown command {command!r}")

    def _submit(self, options: BatcherOptions, request: Request) -> None:
        shared = self.shared.get(options)
        if shared is None:
            shared = self._open_shared(options)
            if shared is None:
                limit = self.settings.max_engines
                message = f"every one of the max_engines={limit} engines is busy: try a batch size and policy in use"
                self.emit(Outputs(options, (failed(request.request_id, message),)))
                return
        shared.last_used = time.monotonic()
        self.owner[request.request_id] = options
        shared.batcher.submit(request)

    def _open_shared(self, options: BatcherOptions) -> SharedBatcher | None:
        """A new shared batcher, closing the least recently used idle one if `max_engines` are live."""
        if len(self.shared) >= self.settings.max_engines:
            idle = [(s.last_used, key) for key, s in self.shared.items() if not s.batcher.has_work]
            if not idle:
                return None
            self._close_shared(min(idle)[1])
        shared = self.shared[options] = SharedBatcher(Batcher(self.model, self.tokenizer, options))
        self.emit(self.stats())
        return shared

    def _close_shared(self, options: BatcherOptions) -> None:
        del self.shared[options]
        logger.info("closed the shared engine %s", options)

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

    # --- the loop's work ----------------------------------------------------------------------------------------
    def step_round(self) -> None:
        """One step of every batcher with work, shared and private alike."""
        for options, shared in list(self.shared.items()):
            if shared.batcher.has_work:
                self._step_shared(options, shared)
        for batcher_id, private in list(self.private.items()):
            if private.run is not None:
                self._step_private(batcher_id, private)

    def _step_shared(self, options: BatcherOptions, shared: SharedBatcher) -> None:
        try:
            events = shared.batcher.step()
        except Exception as exc:  # the batcher is broken: its requests end, the other batchers go on
            logger.exception("shared engine %s failed", options)
            message = f"the engine failed ({type(exc).__name__}: {exc}); try again"
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

    def _step_private(self, batcher_id: str, private: PrivateBatcher) -> None:
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
        """Close shared batchers no one used for `idle_engine_timeout_s`; returns how many."""
        now = time.monotonic() if now is None else now
        limit = self.settings.idle_engine_timeout_s
        idle = [k for k, s in self.shared.items() if not s.batcher.has_work and now - s.last_used >= limit]
        for options in idle:
            self._close_shared(options)
        if idle:
            self.emit(self.stats())
        return len(idle)
