"""The client of the engine process: starts it, talks to it over two pipes, and hands out sessions.

One client per server process (the page keeps it in `st.cache_resource`; every tab is a `Session` of it). Requests
are tokenised and checked here with the engine's own `RequestBuilder`, so a bad prompt is a `ValueError` at once;
queue and engine limits are checked here too (all requests to this engine pass through this client). A receiver
thread routes the engine's per-step `Outputs` to sessions and private runs; a reaper thread drops sessions that
stopped polling, cancelling their requests. If the engine process dies, every waiting request ends with an error
and the next call (`ensure_running`, a submit) starts a new one.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
import weakref
from collections.abc import Sequence
from functools import cache
from multiprocessing.connection import Connection

from transformers import PreTrainedTokenizerBase

from batching.arrivals import Schedule
from batching.engine.batcher import MODES, BatcherOptions
from batching.engine.builder import RequestBuilder
from batching.engine.compiled import CompileState
from batching.engine.events import FinishedEvent, RowKind, StepEvent
from batching.engine.model_support import UnsupportedModelError
from batching.engine.params import RequestParams
from batching.race import check_pause
from batching.service.core import failed
from batching.service.handles import (
    BatcherLoad,
    EngineDeadError,
    Item,
    PrivateBatcher,
    PrivateRun,
    QueueFullError,
    RaceHandle,
    Session,
    Submitted,
)
from batching.service.launch import EngineProcess
from batching.service.messages import (
    Cancel,
    ClosePrivate,
    CloseRace,
    Command,
    EngineConfig,
    EngineInfo,
    EngineStats,
    LaneOutputs,
    LoadFailed,
    OpenPrivate,
    Outputs,
    RaceAdd,
    RaceEnded,
    RacePace,
    Ready,
    RunEnded,
    RunPrivate,
    Shutdown,
    StartRace,
    StopRace,
    Submit,
)
from config.settings import LimitSettings, Settings
from model.loader import ModelLoadError, load_tokenizer, remember_hub_failure, remembered_hub_failure, resolve_source

logger = logging.getLogger(__name__)

REAP_EVERY_S = 0.25
DEATH_CHECK_S = 0.5


def engine_options(settings: Settings, batch_size: int | None = None, policy: str | None = None) -> BatcherOptions:
    """The shared batcher for a batch size and policy (default: the settings'). The page and the API both ask here,
    so a tab and the API choosing the same ones share one batch."""
    slots = batch_size or settings.batching.max_batch_size
    return BatcherOptions(
        max_batch_size=slots,
        max_batched_tokens=max(settings.batching.max_batched_tokens, slots + 1),
        policy=policy or settings.batching.policy,
        max_seq_len=settings.batching.max_seq_len,
        max_prompt_tokens=settings.tokenizer.max_prompt_tokens,
        compile_steps=settings.engine.compile_steps,
        compile_autotune=settings.engine.compile_autotune,
    )


class EngineClient:
    """Starts the engine process for `config` and is every caller's way to it (thread-safe)."""

    def __init__(self, config: EngineConfig, limits: LimitSettings | None = None) -> None:
        self.config = config
        self.limits = limits or LimitSettings()
        self.restarts = 0
        self.last_error: str | None = None
        self.stats = EngineStats()
        self._lock = threading.Lock()  # sessions, pending requests, private runs
        self._send_lock = threading.Lock()  # one writer on the pipe; never held while taking `_lock` for long
        self._start_lock = threading.Lock()
        self._sessions: dict[str, Session] = {}
        self._owner: dict[str, Session] = {}
        self._privates: dict[str, PrivateBatcher] = {}
        self._races: dict[str, RaceHandle] = {}
        self._last_step: dict[BatcherOptions, StepEvent] = {}  # each shared batcher's latest step, for `load`
        self._ids = itertools.count(1)
        self._stopping = threading.Event()  # set when this client stops its engine on purpose (close, exit)
        self._alive = False
        self._generation = 0
        self.process: EngineProcess | None = None
        self._commands: Connection | None = None
        source = resolve_source(config.model.name_or_path)  # a missing folder fails here, before any process starts
        remembered = remembered_hub_failure(config.model)  # an unreachable hub is not tried again by every tab
        if remembered is not None:
            raise remembered
        try:
            self.info: EngineInfo = self._start()
        except ModelLoadError as error:
            remember_hub_failure(config.model, error)
            raise
        self.tokenizer: PreTrainedTokenizerBase = load_tokenizer(source, config.model, config.tokenizer)
        self._builders = cache(self._builder)
        threading.Thread(target=self._reap_loop, name="batchscope-reaper", daemon=True).start()

    # --- the process ----------------------------------------------------------------------------------------
    def _start(self) -> EngineInfo:
        """Start the engine process and wait until its model is loaded; raises ModelLoadError or RuntimeError."""
        process = EngineProcess(self.config)
        try:
            first = process.outputs.recv()
        except EOFError:
            process.wait(5)
            raise RuntimeError(f"the engine process exited while starting ({process.describe_exit()})") from None
        if isinstance(first, LoadFailed):
            process.wait(5)
            if first.unsupported:
                raise UnsupportedModelError(first.message)
            raise (ModelLoadError if first.model_error else RuntimeError)(first.message)
        assert isinstance(first, Ready)
        with self._send_lock, self._lock:
            self.process, self._commands, self._alive = process, process.commands, True
            self._generation += 1
            self.stats = EngineStats()
        weakref.finalize(self, _shut_down, process, self._stopping)
        threading.Thread(
            target=self._receive, args=(process, self._generation), name="batchscope-receiver", daemon=True
        ).start()
        logger.info("engine process %d ready (%s)", process.pid, first.info.name)
        return first.info

    @property
    def alive(self) -> bool:
        return self._alive

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def ensure_running(self) -> bool:
        """Start a new engine process if the last one died; True when it had to (the page says so)."""
        with self._start_lock:
            if self._alive or self._stopping.is_set():
                return False
            logger.warning("engine process died (%s); starting a new one", self.last_error)
            self.info = self._start()
            self.restarts += 1
            with self._lock:  # the time without an engine does not count as a tab's silence
                for session in self._sessions.values():
                    session.last_seen = time.monotonic()
            return True

    def close(self) -> None:
        """Stop the engine process (also done at interpreter exit)."""
        with self._send_lock:
            if self.process is not None:
                _shut_down(self.process, self._stopping)
            self._alive = False

    def _send(self, command: Command) -> None:
        with self._send_lock:
            self._send_unlocked(command)

    def _dead_message(self) -> str:
        return f"the engine stopped ({self.last_error or 'not running'}); reload the page to restart it"

    # --- sessions and the shared batchers --------------------------------------------------------------------
    def builder(self, options: BatcherOptions) -> RequestBuilder:
        """What a batcher with `options` accepts (the engine's own checks, run here)."""
        return self._builders(options)

    def _builder(self, options: BatcherOptions) -> RequestBuilder:
        context = min(self.info.context_length, options.max_seq_len)
        reason = self.info.context_reason if context == self.info.context_length else ""
        return RequestBuilder(self.tokenizer, context, options.max_prompt_tokens, reason)

    def open_session(self, options: BatcherOptions, max_queue: int | None = None) -> Session:
        """A client's handle on the shared batcher for `options`; `max_queue` replaces the per-session limit (the
        API is one session serving many people, held by the total limit alone)."""
        with self._lock:
            session = Session(self, f"s{next(self._ids)}", options, max_queue or self.limits.max_queue_per_session)
            self._sessions[session.session_id] = session
        return session

    def close_session(self, session: Session) -> None:
        with self._lock:
            session.closed = True
            self._sessions.pop(session.session_id, None)
        self.cancel_all(session)

    def cancel_all(self, session: Session) -> None:
        with self._lock:
            pending = list(session.pending)
        self.cancel(pending)

    @property
    def sessions(self) -> int:
        return len(self._sessions)

    @property
    def live_engines(self) -> int:
        return self.stats.live_engines

    @property
    def compile_state(self) -> CompileState:
        """Whether the engine's decode steps are compiled yet (see `batching.engine.compiled`)."""
        return self.stats.compile

    def load(self, options: BatcherOptions) -> BatcherLoad:
        """What the shared batcher for `options` holds now, from its latest step and the requests still pending."""
        with self._lock:
            pending = sum(1 for rid, owner in self._owner.items() if owner.pending.get(rid) == options)
            last = self._last_step.get(options) if pending else None
        running = 0 if last is None else last.active
        kv_tokens = (
            0 if last is None else sum(r.first_position + r.tokens for r in last.rows if r.kind is not RowKind.HELD)
        )
        context = min(self.info.context_length, options.max_seq_len)
        return BatcherLoad(
            running=min(running, pending),
            waiting=max(pending - running, 0),
            slots=options.max_batch_size,
            kv_tokens=kv_tokens,
            kv_capacity=options.max_batch_size * context,
        )

    def in_flight(self) -> int:
        with self._lock:
            return len(self._owner)

    def submit(self, session: Session, prompt: str | Sequence[int], params: RequestParams) -> Submitted:
        self.ensure_running()
        session.last_seen = time.monotonic()
        request = self.builder(session.options).build(prompt, params, session.next_request_id())
        rid = request.request_id
        with self._send_lock:  # bookkeeping and sending in one order, so a cancel never overtakes its submit
            with self._lock:
                self._admit(session, rid)
            try:
                self._send_unlocked(Submit(session.options, request))
            except EngineDeadError:
                with self._lock:
                    self._owner.pop(rid, None)
                    session.pending.pop(rid, None)
                raise
        return Submitted(rid, request.times.arrival, tuple(request.prompt_ids), params)

    def _admit(self, session: Session, request_id: str) -> None:
        """Check the limits and record the request as pending; raises QueueFullError or ValueError."""
        if session.closed:
            raise ValueError("this session is closed: reload the page")
        limits = self.limits
        if len(self._owner) >= limits.max_queue_total:
            raise QueueFullError(
                f"the engine is full: {len(self._owner)} requests are queued or running for everyone "
                f"(max_queue_total={limits.max_queue_total}); try again in a moment"
            )
        if len(session.pending) >= session.max_queue:
            raise QueueFullError(
                f"you already have {len(session.pending)} requests queued or running, the most one person may "
                f"have (max_queue_per_session={session.max_queue}): wait for some to finish"
            )
        busy = {owner.pending[rid] for rid, owner in self._owner.items()}  # batchers with requests in flight
        most = self.config.engine.max_engines
        if session.options not in busy and len(busy) >= most:
            raise QueueFullError(
                f"all {most} engines (max_engines={most}) are busy with other batch sizes or policies: "
                "pick one in use, or try again when one is free"
            )
        session.pending[request_id] = session.options
        self._owner[request_id] = session

    def _send_unlocked(self, command: Command) -> None:
        """`_send` for a caller that already holds `_send_lock`."""
        if not self._alive or self._commands is None:
            raise EngineDeadError(self._dead_message())
        try:
            self._commands.send(command)
        except OSError:
            raise EngineDeadError(self._dead_message()) from None

    def cancel(self, request_ids: Sequence[str]) -> None:
        if request_ids and self._alive:
            with contextlib.suppress(EngineDeadError):  # its requests have ended with an error already
                self._send(Cancel(tuple(request_ids)))

    # --- private batchers ------------------------------------------------------------------------------------
    def open_private(self, mode: str, options: BatcherOptions) -> PrivateBatcher:
        """A batcher of your own in the engine process, stepped in its loop with a clock of its own."""
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} is not allowed: choose one of {', '.join(MODES)}")
        self.ensure_running()
        private = PrivateBatcher(self, f"p{next(self._ids)}", mode, options)
        with self._lock:
            self._privates[private.batcher_id] = private
        self._send(OpenPrivate(private.batcher_id, mode, options))
        return private

    def run_private(
        self,
        private: PrivateBatcher,
        items: Sequence[tuple[str | Sequence[int], RequestParams, str]],
        schedule: Schedule,
    ) -> PrivateRun:
        if len(items) != len(schedule):
            raise ValueError(f"{len(items)} requests but {len(schedule)} arrival times: give one per request")
        builder = self.builder(private.options)
        requests = tuple(builder.build(prompt, params, request_id) for prompt, params, request_id in items)
        run = private.current = PrivateRun(private.mode, private.options.max_batch_size)
        self._send(RunPrivate(private.batcher_id, requests, schedule))
        return run

    def close_private(self, private: PrivateBatcher) -> None:
        with self._lock:
            known = self._privates.pop(private.batcher_id, None) is not None
        if known and self._alive:
            with contextlib.suppress(EngineDeadError):
                self._send(ClosePrivate(private.batcher_id))

    # --- races -----------------------------------------------------------------------------------------------------
    def start_race(
        self, options: BatcherOptions, items: Sequence[Item], schedule: Schedule, pause_s: float = 0.0
    ) -> RaceHandle:
        """Race (prompt, params, request id) items on a continuous and a static lane of your own, arriving on
        `schedule` on each lane's clock; raises ValueError for bad input (nothing is started then)."""
        if len(items) != len(schedule):
            raise ValueError(f"{len(items)} requests but {len(schedule)} arrival times: give one per request")
        check_pause(pause_s)
        self.ensure_running()
        builder = self.builder(options)
        requests = tuple(builder.build(prompt, params, request_id) for prompt, params, request_id in items)
        race = RaceHandle(self, f"race{next(self._ids)}", options)
        with self._lock:
            self._races[race.race_id] = race
        self._send(StartRace(race.race_id, options, requests, schedule, pause_s))
        return race

    def race_add(self, race: RaceHandle, item: Item) -> None:
        prompt, params, request_id = item
        self._send(RaceAdd(race.race_id, self.builder(race.options).build(prompt, params, request_id)))

    def race_command(self, race: RaceHandle, command: str, pause_s: float = 0.0) -> None:
        """`pace` (slow motion), `stop` or `close` a race; a dead engine has stopped it already."""
        if command == "pace":
            message: Command = RacePace(race.race_id, check_pause(pause_s))
        elif command == "stop":
            message = StopRace(race.race_id)
        elif command == "close":
            with self._lock:
                known = self._races.pop(race.race_id, None) is not None
            if not known:
                return
            message = CloseRace(race.race_id)
        else:
            raise ValueError(f"race command {command!r} is not allowed: choose pace, stop or close")
        if self._alive:
            with contextlib.suppress(EngineDeadError):
                self._send(message)

    # --- the receiver and the reaper -------------------------------------------------------------------------
    def _receive(self, process: EngineProcess, generation: int) -> None:
        """Route the engine's messages until its pipe closes or it exits; then fail everything still waiting.

        (The exit check: another engine forked from this process may hold a copy of this pipe, hiding the EOF.)
        """
        outputs = process.outputs
        try:
            while True:
                if not outputs.poll(DEATH_CHECK_S):
                    if process.exit_code() is not None:
                        break
                    continue
                message = outputs.recv()
                if isinstance(message, Outputs):
                    self._route(message)
                elif isinstance(message, RunEnded):
                    self._end_run(message)
                elif isinstance(message, LaneOutputs | RaceEnded):
                    race = self._races.get(message.race_id)
                    if race is not None:
                        race.inbox.put(message.step if isinstance(message, LaneOutputs) else message)
                elif isinstance(message, EngineStats):
                    self.stats = message
        except (EOFError, OSError):
            pass
        self._on_death(generation)

    def _route(self, message: Outputs) -> None:
        if isinstance(message.source, str):
            private = self._privates.get(message.source)
            if private is not None and private.current is not None:
                private.current.inbox.put(message.events)
            return
        options = message.source
        with self._lock:
            steps = [event for event in message.events if isinstance(event, StepEvent)]
            if steps:
                self._last_step[options] = steps[-1]
            # Who watches this batcher's steps: its sessions with pending requests before the step's finishes.
            watchers = [s for s in self._sessions.values() if options in s.pending.values()]
            for event in message.events:
                if isinstance(event, StepEvent):
                    for session in watchers:
                        session.inbox.put(event)
                    continue
                owner = self._owner.get(event.request_id)
                if owner is None:
                    continue
                session = owner
                if isinstance(event, FinishedEvent):
                    del self._owner[event.request_id]
                    session.pending.pop(event.request_id, None)
                session.inbox.put(event)  # a closed session's too: bounded by its requests, and it shows they ended

    def _end_run(self, message: RunEnded) -> None:
        private = self._privates.get(message.batcher_id)
        if private is not None and private.current is not None:
            private.current.inbox.put(message)

    def _on_death(self, generation: int) -> None:
        process = self.process
        if process is not None:
            process.wait(2)
        with self._send_lock, self._lock:
            if generation != self._generation or self._stopping.is_set():
                return
            self._alive = False
            self.last_error = f"the engine process stopped: {process.describe_exit()}" if process else "no engine"
            logger.error("%s", self.last_error)
            message = self._dead_message()
            owners, self._owner = self._owner, {}
            for request_id, session in owners.items():
                session.pending.pop(request_id, None)
                session.inbox.put(failed(request_id, message))
            for private in self._privates.values():
                if private.current is not None:
                    private.current.inbox.put(EngineDeadError(message))
            self._privates.clear()
            for race in self._races.values():
                race.inbox.put(EngineDeadError(message))
            self._races.clear()
            self.stats = EngineStats()

    def _reap_loop(self) -> None:
        while not self._stopping.is_set():
            time.sleep(REAP_EVERY_S)
            self.reap()

    def reap(self) -> int:
        """Drop sessions silent for `session_timeout_s`, cancelling their requests; returns how many."""
        if not self._alive:  # while the engine restarts, no one can poll
            return 0
        deadline = time.monotonic() - self.config.engine.session_timeout_s
        with self._lock:
            gone = [s for s in self._sessions.values() if s.last_seen < deadline]
            races = [race for race in self._races.values() if race.last_seen < deadline]
        for session in gone:
            if session.pending:
                logger.info("session %s went away; cancelling %d requests", session.session_id, len(session.pending))
            self.close_session(session)
        for race in races:
            logger.info("race %s went unwatched; closing it", race.race_id)
            race.close()
        return len(gone) + len(races)


def _shut_down(process: EngineProcess, stopping: threading.Event) -> None:
    """Ask the engine process to stop, then make sure it has."""
    stopping.set()
    with contextlib.suppress(OSError):
        process.commands.send(Shutdown())
    process.wait(3)
    if process.exit_code() is None:
        process.kill()
