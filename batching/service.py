"""One engine per process, shared by every browser tab: a continuous batcher stepping in a background thread.

Each session submits requests and reads only its own token and finished events (plus every step event, so it
can draw the global batch). Limits are enforced at submission; a session that stops polling is considered
gone and its requests are cancelled; if the engine thread dies, its requests end with an error and the next
`ensure_running()` starts a fresh engine.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from batching.engine.batcher import Batcher
from batching.engine.events import Event, FinishedEvent, StepEvent
from batching.engine.params import RequestParams
from batching.engine.request import FinishReason, Request

logger = logging.getLogger(__name__)


class QueueFullError(ValueError):
    """A request was refused because a queue limit was reached; the message says which."""


@dataclass(frozen=True)
class ServiceLimits:
    max_queue_per_session: int = 64
    max_queue_total: int = 256
    session_timeout_s: float = 20.0


class Session:
    """One browser tab's handle on the shared engine."""

    def __init__(self, service: EngineService, session_id: str, max_queue: int) -> None:
        self.service = service
        self.session_id = session_id
        self.max_queue = max_queue
        self.inbox: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.pending: set[str] = set()
        self.last_seen = time.monotonic()
        self.closed = False
        self._counter = itertools.count(1)

    def owns(self, request_id: str) -> bool:
        return request_id.startswith(self.session_id + "/")

    def submit(self, prompt: str | Sequence[int], params: RequestParams) -> Request:
        """Validate and queue a request; raises ValueError (bad input) or QueueFullError (limits)."""
        return self.service.submit(self, prompt, params, request_id=f"{self.session_id}/{next(self._counter)}")

    def poll(self, timeout: float = 0.0) -> list[Event]:
        """Every event for this session since the last poll; waits up to `timeout` for the first one."""
        self.last_seen = time.monotonic()
        events: list[Event] = []
        try:
            events.append(self.inbox.get(timeout=timeout) if timeout > 0 else self.inbox.get_nowait())
            while True:
                events.append(self.inbox.get_nowait())
        except queue.Empty:
            pass
        return events

    def cancel(self, request_id: str) -> None:
        """Cancel one of this session's requests (a client that went away); it ends at the next step."""
        if request_id in self.pending:
            self.service.batcher.cancel(request_id)
            self.service.wake()

    def cancel_all(self) -> None:
        """Cancel this session's waiting and running requests (the Stop button)."""
        for request_id in list(self.pending):
            self.service.batcher.cancel(request_id)
        self.service.wake()

    def close(self) -> None:
        self.service.close_session(self)


class EngineService:
    """Runs `batcher_factory()`'s batcher in a daemon thread and routes its events to sessions."""

    def __init__(self, batcher_factory: Callable[[], Batcher], limits: ServiceLimits | None = None) -> None:
        self.batcher_factory = batcher_factory
        self.limits = limits or ServiceLimits()
        self.batcher = batcher_factory()
        self.restarts = 0
        self.last_error: str | None = None
        self._sessions: dict[str, Session] = {}
        self._owner: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._wakeup = threading.Event()
        self._stopping = threading.Event()
        self._ids = itertools.count(1)
        self._thread: threading.Thread | None = None
        self.start()

    # --- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name="batchscope-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        self.wake()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def ensure_running(self) -> bool:
        """Start a fresh engine if the thread died; True when it had to (the page says so)."""
        if self.alive or self._stopping.is_set():
            return False
        logger.warning("engine thread died (%s); starting a new one", self.last_error)
        self.batcher = self.batcher_factory()
        self.restarts += 1
        self.start()
        return True

    def wake(self) -> None:
        self._wakeup.set()

    # --- sessions -------------------------------------------------------------------------------------------
    def open_session(self, max_queue: int | None = None) -> Session:
        """A new client's handle; `max_queue` overrides the per-session limit (the API is one client of many users)."""
        with self._lock:
            session = Session(self, f"s{next(self._ids)}", max_queue or self.limits.max_queue_per_session)
            self._sessions[session.session_id] = session
        return session

    def close_session(self, session: Session) -> None:
        session.cancel_all()
        with self._lock:
            session.closed = True
            self._sessions.pop(session.session_id, None)

    @property
    def sessions(self) -> int:
        return len(self._sessions)

    def in_flight(self) -> int:
        with self._lock:
            return len(self._owner)

    def submit(self, session: Session, prompt: str | Sequence[int], params: RequestParams, request_id: str) -> Request:
        if not self.alive:
            raise RuntimeError("the engine is not running: reload the page to restart it")
        request = self.batcher.make_request(prompt, params, request_id)
        with self._lock:
            if session.closed:
                raise ValueError("this session is closed: reload the page")
            if len(self._owner) >= self.limits.max_queue_total:
                raise QueueFullError(
                    f"the engine is full: {len(self._owner)} requests are queued or running for everyone "
                    f"(max_queue_total={self.limits.max_queue_total}); try again in a moment"
                )
            if len(session.pending) >= session.max_queue:
                raise QueueFullError(
                    f"you already have {len(session.pending)} requests queued or running, the most one client may "
                    f"have (max_queue_per_session={session.max_queue}): wait for some to finish"
                )
            session.pending.add(request.request_id)
            self._owner[request.request_id] = session
            self.batcher.submit(request)
        self.wake()
        return request

    # --- the engine thread ------------------------------------------------------------------------------------
    def _loop(self) -> None:
        batcher = self.batcher
        try:
            while not self._stopping.is_set():
                self._reap_dead_sessions()
                if not batcher.has_work:
                    self._wakeup.wait(timeout=1.0)
                    self._wakeup.clear()
                    continue
                self._route(batcher.step())
        except Exception as exc:
            logger.exception("engine thread died")
            self.last_error = f"{type(exc).__name__}: {exc}"
            self._fail_in_flight(self.last_error)

    def _route(self, events: list[Event]) -> None:
        with self._lock:
            for event in events:
                if isinstance(event, StepEvent):
                    for session in self._sessions.values():
                        if session.pending:
                            session.inbox.put(event)
                    continue
                session = self._owner.get(event.request_id)
                if session is None:
                    continue
                session.inbox.put(event)
                if isinstance(event, FinishedEvent):
                    del self._owner[event.request_id]
                    session.pending.discard(event.request_id)

    def _reap_dead_sessions(self) -> None:
        """Cancel the requests of sessions that stopped polling (a closed tab) and forget them."""
        deadline = time.monotonic() - self.limits.session_timeout_s
        with self._lock:
            dead = [s for s in self._sessions.values() if s.pending and s.last_seen < deadline]
        for session in dead:
            logger.info("session %s went away; cancelling %d requests", session.session_id, len(session.pending))
            self.close_session(session)

    def _fail_in_flight(self, message: str) -> None:
        """The engine died: every request it held ends with an error, so no page waits forever."""
        now = time.perf_counter()
        with self._lock:
            owners, self._owner = self._owner, {}
            for request_id, session in owners.items():
                session.pending.discard(request_id)
                session.inbox.put(
                    FinishedEvent(
                        request_id=request_id,
                        reason=FinishReason.ERROR,
                        output_ids=(),
                        text="",
                        prompt_tokens=0,
                        arrival=now,
                        admitted=None,
                        first_token=None,
                        finished=now,
                        slot=None,
                        error=f"the engine stopped ({message}); reload the page to restart it",
                    )
                )
