"""The API's handle on the shared engine: one engine session for every HTTP request, and a thread that routes that
session's events to each request's asyncio queue (no per-request polling: a token reaches its stream at once).

A request is prepared (tokenised, its chat template rendered, checked) and queued in a worker thread: nothing that
grows with a request's size runs on the event loop, so one large request never stalls the others or `/health`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from batching.engine.events import Event, FinishedEvent, PreemptedEvent, StepEvent
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams
from batching.serve.metrics import ApiMetrics
from batching.service import BatcherLoad, EngineClient, Session, Submitted

logger = logging.getLogger(__name__)

PREPARE_THREADS = 2  # requests tokenised at once (the tokenizer's own work releases the interpreter lock)
Prepare = Callable[[], tuple[Sequence[int], RequestParams]]


@dataclass
class Stream:
    """One HTTP request's view of its engine request: its events arrive on `events`; `generation`: the engine
    process it was sent to (`EngineLifecycle.generation`)."""

    request: Submitted
    events: asyncio.Queue[Event]
    generation: int


class Gateway:
    """Submits on behalf of HTTP handlers (on the event loop) and feeds their queues from the engine's events."""

    def __init__(self, service: EngineClient, options: BatcherOptions, max_queue: int) -> None:
        self.service = service
        self.options = options
        self.max_queue = max_queue
        self.metrics = ApiMetrics(self.load, lambda: dict(service.lifecycle.restart_causes))
        self._session: Session = service.open_session(options, max_queue)
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, Stream]] = {}
        self._last_token: dict[str, float] = {}
        self._lock = threading.Lock()
        self._workers = ThreadPoolExecutor(PREPARE_THREADS, thread_name_prefix="batchscope-api-prepare")
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._route, name="batchscope-api-router", daemon=True)
        self._thread.start()

    def load(self) -> BatcherLoad:
        """What the API's batcher holds now (everyone's requests on it, browser tabs included)."""
        return self.service.load(self.options)

    async def submit(self, prepare: Prepare) -> Stream:
        """Prepare a request (its prompt's ids and parameters) and queue it, in a worker thread; raises what
        `prepare` raises, ValueError (bad input), QueueFullError (limits) or EngineDeadError."""
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._workers, self._submit_now, prepare, loop)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:  # the client left while its request was prepared: it runs for no one
            future.add_done_callback(self._drop)
            raise

    def _submit_now(self, prepare: Prepare, loop: asyncio.AbstractEventLoop) -> Stream:
        prompt, params = prepare()
        session = self._session_now()
        generation = self.service.lifecycle.generation  # read first: a restart after it is seen as one
        with self._lock:  # hold it so the router cannot see the first event before the stream is registered
            request = session.submit(prompt, params)
            stream = Stream(request, asyncio.Queue(), generation)
            self._streams[request.request_id] = (loop, stream)
        return stream

    def _drop(self, future: asyncio.Future[Stream]) -> None:
        if not future.cancelled() and future.exception() is None:
            request_id = future.result().request.request_id
            self.forget(request_id)
            self.cancel(request_id)

    def cancel(self, request_id: str) -> None:
        self._session.cancel(request_id)

    def forget(self, request_id: str) -> None:
        """The HTTP request is over: stop delivering to it (its last-token time goes with its finished event)."""
        with self._lock:
            self._streams.pop(request_id, None)

    def close(self) -> None:
        self._workers.shutdown(wait=False, cancel_futures=True)
        self._stopping.set()
        self._thread.join(timeout=2)
        self._session.close()

    def _session_now(self) -> Session:
        """The engine session, reopened if it was reaped."""
        if self._session.closed:
            self._session = self.service.open_session(self.options, self.max_queue)
        return self._session

    def _route(self) -> None:
        while not self._stopping.is_set():
            for event in self._session.poll(timeout=0.1):
                self._deliver(event)

    def _deliver(self, event: Event) -> None:
        if isinstance(event, StepEvent):
            self.metrics.observe_step(event)
            return
        if isinstance(event, PreemptedEvent):
            return  # counted from the steps' memory view; the stream waits for its request's next token
        with self._lock:
            target = self._streams.get(event.request_id)
        if isinstance(event, FinishedEvent):
            self.metrics.observe_finished(event)
            self._last_token.pop(event.request_id, None)  # only this thread touches it: a cancelled stream's too
        else:
            self.metrics.generation_tokens.inc()  # as it comes: the tokens of a request its engine's death ends count
            previous = self._last_token.get(event.request_id)
            if previous is not None:
                self.metrics.observe_token_gap(event.time - previous)
            self._last_token[event.request_id] = event.time
        if target is not None:
            loop, stream = target
            loop.call_soon_threadsafe(stream.events.put_nowait, event)
