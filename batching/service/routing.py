"""Who waits for what the engine process sends, and the routing of its outputs to them.

Sessions (each a tab's handle on a shared batcher) wait for their own requests' tokens and ends, and for every step
of their batcher; private runs and races wait for their batcher's outputs. One lock guards the whole registry:
admission records a request under it, the receiver thread routes under it, and a dead engine fails all at once.
"""

from __future__ import annotations

import itertools
import threading
import time

from batching.engine.events import FinishedEvent, RowKind, StepEvent
from batching.engine.options import BatcherOptions
from batching.service.core import failed
from batching.service.handles import BatcherLoad, EngineDeadError, PrivateBatcher, RaceHandle, Session
from batching.service.lifecycle import Routed
from batching.service.messages import LaneOutputs, Outputs, RunEnded


class Router:
    """The registry of sessions, their requests in flight, private batchers and races; thread-safe under `lock`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sessions: dict[str, Session] = {}
        self.owner: dict[str, Session] = {}  # request in flight on a shared batcher -> the session that sent it
        self.privates: dict[str, PrivateBatcher] = {}
        self.races: dict[str, RaceHandle] = {}
        self.last_step: dict[BatcherOptions, StepEvent] = {}  # each shared batcher's latest step, for `load`
        self._ids = itertools.count(1)

    def new_id(self, prefix: str) -> str:
        """An id no session, private batcher or race of this client has had."""
        return f"{prefix}{next(self._ids)}"

    # --- the registry --------------------------------------------------------------------------------------------
    def add(self, handle: Session | PrivateBatcher | RaceHandle) -> None:
        with self.lock:
            if isinstance(handle, Session):
                self.sessions[handle.session_id] = handle
            elif isinstance(handle, PrivateBatcher):
                self.privates[handle.batcher_id] = handle
            else:
                self.races[handle.race_id] = handle

    def close_session(self, session: Session) -> list[str]:
        """Forget a session; returns its requests still in flight (to cancel)."""
        with self.lock:
            session.closed = True
            self.sessions.pop(session.session_id, None)
            return list(session.pending)

    def pending(self, session: Session) -> list[str]:
        with self.lock:
            return list(session.pending)

    def remove_private(self, batcher_id: str) -> bool:
        """Forget a private batcher; False if it was not known (closed already, or its engine died)."""
        with self.lock:
            return self.privates.pop(batcher_id, None) is not None

    def remove_race(self, race_id: str) -> bool:
        """Forget a race; False if it was not known (closed already, or its engine died)."""
        with self.lock:
            return self.races.pop(race_id, None) is not None

    def record(self, session: Session, request_id: str) -> None:
        """A request of `session` is in flight on its shared batcher (the caller holds `lock`)."""
        session.pending[request_id] = session.options
        self.owner[request_id] = session

    def forget(self, session: Session, request_id: str) -> None:
        """A request that never reached the engine."""
        with self.lock:
            self.owner.pop(request_id, None)
            session.pending.pop(request_id, None)

    def silent_since(self, deadline: float) -> tuple[list[Session], list[RaceHandle]]:
        """The sessions and races no one polled since `deadline` (time.monotonic)."""
        with self.lock:
            sessions = [s for s in self.sessions.values() if s.last_seen < deadline]
            races = [race for race in self.races.values() if race.last_seen < deadline]
        return sessions, races

    # --- what the engine sends (the receiver thread) ---------------------------------------------------------
    def deliver(self, message: Routed) -> None:
        if isinstance(message, Outputs):
            self._route(message)
        elif isinstance(message, RunEnded):
            private = self.privates.get(message.batcher_id)
            if private is not None and private.current is not None:
                private.current.inbox.put(message)
        else:
            race = self.races.get(message.race_id)
            if race is not None:
                race.inbox.put(message.step if isinstance(message, LaneOutputs) else message)

    def _route(self, message: Outputs) -> None:
        if isinstance(message.source, str):
            private = self.privates.get(message.source)
            if private is not None and private.current is not None:
                private.current.inbox.put(message.events)
            return
        options = message.source
        with self.lock:
            steps = [event for event in message.events if isinstance(event, StepEvent)]
            if steps:
                self.last_step[options] = steps[-1]
            # Who watches this batcher's steps: its sessions with pending requests before the step's finishes.
            watchers = [s for s in self.sessions.values() if options in s.pending.values()]
            for event in message.events:
                if isinstance(event, StepEvent):
                    for session in watchers:
                        session.inbox.put(event)
                    continue
                owner = self.owner.get(event.request_id)
                if owner is None:
                    continue
                if isinstance(event, FinishedEvent):
                    del self.owner[event.request_id]
                    owner.pending.pop(event.request_id, None)
                owner.inbox.put(event)  # a closed session's too: bounded by its requests, and it shows they ended

    def engine_died(self, message: str) -> None:
        """Every request in flight ends with `message`; private runs and races raise it."""
        with self.lock:
            owners, self.owner = self.owner, {}
            for request_id, session in owners.items():
                session.pending.pop(request_id, None)
                session.inbox.put(failed(request_id, message))
            for private in self.privates.values():
                if private.current is not None:
                    private.current.inbox.put(EngineDeadError(message))
            self.privates.clear()
            for race in self.races.values():
                race.inbox.put(EngineDeadError(message))
            self.races.clear()

    def engine_restarted(self) -> None:
        """The time without an engine does not count as a tab's silence."""
        with self.lock:
            for session in self.sessions.values():
                session.last_seen = time.monotonic()

    # --- gauges ----------------------------------------------------------------------------------------------
    def in_flight(self) -> int:
        with self.lock:
            return len(self.owner)

    def load(self, options: BatcherOptions, kv_capacity: int) -> BatcherLoad:
        """What the shared batcher for `options` holds now, from its latest step and the requests still pending."""
        with self.lock:
            pending = sum(1 for rid, owner in self.owner.items() if owner.pending.get(rid) == options)
            last = self.last_step.get(options) if pending else None
        running = 0 if last is None else last.active
        kv_tokens = (
            0 if last is None else sum(r.first_position + r.tokens for r in last.rows if r.kind is not RowKind.HELD)
        )
        return BatcherLoad(
            running=min(running, pending),
            waiting=max(pending - running, 0),
            slots=options.max_batch_size,
            kv_tokens=kv_tokens,
            kv_capacity=kv_capacity,
            kv_blocks_in_use=0 if last is None or last.memory is None else last.memory.usage.in_use,
            kv_blocks=0 if last is None or last.memory is None else last.memory.usage.total,
        )
