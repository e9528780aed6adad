"""A queue run on a remote server, from the client: continuous (keep up to N requests in flight) or static (waves
of N, each waiting for its slowest answer), with client-side timings and the same events as our own engine.

The server batches however it batches; what this measures is what a client sees of it. Each of the N "lanes" is a
request slot on the client's side: a continuous run refills a lane the moment its answer ends, a static run holds
every lane of a wave until the wave's last answer ends. So the client-side charts read exactly like the built-in
engine's, sampled every `sample_every_s` instead of per engine step, and the page reuses them as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx2

from batching.engine.batcher import MODES, Mode
from batching.engine.events import Event, FinishedEvent, StepEvent, TokenEvent
from batching.engine.params import RequestParams
from batching.engine.request import FinishReason
from batching.remote.endpoint import Endpoint
from batching.remote.poller import POLL_EVERY_S, TelemetryPoller
from batching.remote.stream import Api, RemoteRequest, request_body, stream_answer
from batching.remote.telemetry import TelemetrySample
from batching.runs import RunRecord, drain

SAMPLE_EVERY_S = 0.1
UNKNOWN_TOKEN = -1  # a server streams text, not token ids
IDLE_EXIT_S = 120.0  # a run nobody submits to or closes for this long stops its thread


@dataclass(frozen=True)
class RemoteSubmitted:
    """A request the run took: its id, and when it arrived (the run's clock)."""

    request_id: str
    arrival: float


@dataclass
class _Job:
    request_id: str
    request: RemoteRequest
    due: float
    lane: int | None = None
    admitted: float | None = None
    first_token: float | None = None
    pieces: list[str] = field(default_factory=list)
    task: asyncio.Task[None] | None = None


@dataclass(frozen=True)
class RunSetup:
    """How a remote run talks to its server: which model and API, how many lanes, in which mode."""

    endpoint: Endpoint
    model: str
    lanes: int
    mode: Mode = "continuous"
    api: Api = "completions"
    system_prompt: str = ""  # chat: sent as the system message

    def __post_init__(self) -> None:
        if self.lanes < 1:
            raise ValueError(f"lanes={self.lanes} is not allowed: at least 1 request in flight")
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r} is not allowed: choose continuous or static")


class RemoteRun:
    """Submit prompts (now or at a planned time), poll their events; a thread of its own talks to the server.

    Same surface as a tab's engine session (`submit`, `poll`, `cancel_all`), so the page's streaming loop drives
    either. `record` collects every event (mode, lanes as slots); `telemetry()` is the server's own view meanwhile.
    """

    def __init__(
        self,
        setup: RunSetup,
        start: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
        sample_every_s: float = SAMPLE_EVERY_S,
        telemetry_every_s: float | None = POLL_EVERY_S,
    ) -> None:
        """`telemetry_every_s` None: no telemetry polling (the server's own view is not wanted)."""
        self.setup = setup
        self.clock = clock
        self.sample_every_s = sample_every_s
        self.record = RunRecord(setup.mode, clock() if start is None else start, slots=setup.lanes)
        self._events: queue.Queue[Event] = queue.Queue()
        self._ids = itertools.count(1)
        self._jobs: list[_Job] = []  # submitted, not yet finished, in submission order
        self._lanes: list[str | None] = [None] * setup.lanes
        self._seen: list[str | None] = [None] * setup.lanes  # who held each lane during this sample window
        self._held: set[str] = set()  # static: finished, still holding a lane until the wave ends
        self._window_tokens = 0
        self._steps = itertools.count()
        self._closed = False
        self._cancelled = False
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self.poller = (
            TelemetryPoller(setup.endpoint, telemetry_every_s, clock).start() if telemetry_every_s is not None else None
        )
        self._thread = threading.Thread(target=self._thread_main, name="batchscope-remote", daemon=True)
        self._thread.start()
        self._ready.wait(10)

    # --- the page's side (any thread) -----------------------------------------------------------------------
    def submit(self, prompt: str, params: RequestParams, at: float | None = None) -> RemoteSubmitted:
        """Queue `prompt`; it is sent when due (`at` seconds after the run's start, default now) and a lane is free."""
        if not self.running:
            raise RuntimeError("this remote run has ended: press Generate for a new one")
        now = self.clock()
        due = now if at is None else max(now, self.record.start + at)
        sampling = params.sampling
        request = RemoteRequest(
            prompt=prompt,
            max_tokens=params.max_new_tokens,
            temperature=sampling.temperature if sampling.do_sample else 0.0,
            top_p=sampling.top_p if sampling.do_sample else 1.0,
            seed=sampling.seed,
            question=prompt,
            system_prompt=self.setup.system_prompt,
        )
        job = _Job(f"{self.setup.mode}-{next(self._ids)}", request, due)
        self._call(self._jobs.append, job)
        return RemoteSubmitted(job.request_id, due)

    def poll(self, timeout: float = 0.0) -> list[Event]:
        """The events since the last poll, waiting up to `timeout` s for the first."""
        return drain(self._events, timeout)

    def cancel_all(self) -> None:
        """Stop every request: those in flight are cut, those waiting end as cancelled."""
        self._call(self._cancel_all)

    def close(self) -> None:
        """No more submissions: the thread ends once every request has finished."""
        self._call(setattr, self, "_closed", True)

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    @property
    def done(self) -> bool:
        """Closed and every request finished (the record is complete)."""
        return not self._thread.is_alive()

    def telemetry(self) -> list[TelemetrySample]:
        return self.poller.samples() if self.poller is not None else []

    def _call(self, function: Callable[..., object], *args: object) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop stopped meanwhile
            loop.call_soon_threadsafe(self._then_wake, function, args)

    # --- the run's thread ---------------------------------------------------------------------------------
    def _then_wake(self, function: Callable[..., object], args: tuple[object, ...]) -> None:
        function(*args)
        if self._wake is not None:
            self._wake.set()

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._main())
        finally:
            if self.poller is not None:
                self.poller.stop()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._ready.set()
        endpoint = self.setup.endpoint
        limits = httpx2.Limits(max_connections=self.setup.lanes + 2, max_keepalive_connections=self.setup.lanes)
        async with httpx2.AsyncClient(timeout=endpoint.timeout(), headers=endpoint.headers(), limits=limits) as client:
            idle_since = self.clock()
            next_sample = self.clock() + self.sample_every_s
            while True:
                now = self.clock()
                self._admit(client, now)
                if now >= next_sample:
                    self._sample(now)
                    next_sample = now + self.sample_every_s
                busy = any(job.task is not None for job in self._jobs)
                if self._jobs:
                    idle_since = now
                elif self._closed or now - idle_since > IDLE_EXIT_S:
                    break
                waits = [next_sample - now] if busy else [IDLE_EXIT_S]
                waits += [job.due - now for job in self._jobs if job.task is None]
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), max(0.001, min(waits)))
            self._sample(self.clock())

    def _admit(self, client: httpx2.AsyncClient, now: float) -> None:
        """Send what is due into free lanes: any free lane (continuous), or a whole new wave (static)."""
        due = [job for job in self._jobs if job.task is None and job.due <= now]
        if self.setup.mode == "static" and any(lane is not None for lane in self._lanes):
            return  # the wave in flight keeps every lane until its last answer ends
        for lane, occupant in enumerate(self._lanes):
            if not due:
                return
            if occupant is None:
                self._start(client, due.pop(0), lane, now)

    def _start(self, client: httpx2.AsyncClient, job: _Job, lane: int, now: float) -> None:
        job.lane, job.admitted = lane, now
        self._lanes[lane] = self._seen[lane] = job.request_id
        job.task = asyncio.create_task(self._answer(client, job))

    async def _answer(self, client: httpx2.AsyncClient, job: _Job) -> None:
        setup = self.setup

        def on_text(text: str) -> None:
            now = self.clock()
            if job.first_token is None:
                job.first_token = now
            self._emit(TokenEvent(job.request_id, UNKNOWN_TOKEN, text, len(job.pieces), now))
            job.pieces.append(text)
            self._window_tokens += 1

        body = request_body(job.request, setup.model, setup.api)
        try:
            result = await stream_answer(client, setup.endpoint, body, setup.api, on_text, self.clock)
        except asyncio.CancelledError:
            self._finish(job, FinishReason.CANCELLED, None, 0, len(job.pieces))
            return
        self._finish(job, result.reason, result.error, result.prompt_tokens or 0, result.output_tokens)

    def _finish(self, job: _Job, reason: FinishReason, error: str | None, prompt_tokens: int, tokens: int) -> None:
        now = self.clock()
        if job in self._jobs:
            self._jobs.remove(job)
        self._emit(
            FinishedEvent(
                job.request_id,
                reason,
                (UNKNOWN_TOKEN,) * tokens,
                "".join(job.pieces),
                prompt_tokens,
                job.due,
                job.admitted,
                job.first_token,
                now,
                job.lane,
                error,
            )
        )
        if job.lane is not None:
            if self.setup.mode == "continuous":
                self._lanes[job.lane] = None
            else:
                self._held.add(job.request_id)
                if all(lane is None or lane in self._held for lane in self._lanes):  # the wave's last answer
                    self._lanes = [None] * self.setup.lanes
                    self._held.clear()
        if not self._jobs:
            self.record.end = now
        if self._wake is not None:
            self._wake.set()

    def _cancel_all(self) -> None:
        self._cancelled = True
        for job in list(self._jobs):
            if job.task is None:
                self._finish(job, FinishReason.CANCELLED, None, 0, 0)
            else:
                job.task.cancel()

    def _sample(self, now: float) -> None:
        """One client-side 'step': who held each lane during the last window, and the tokens that arrived in it."""
        if all(lane is None for lane in self._seen):
            return
        steps = self.record.steps
        start = steps[-1].end if steps else self.record.start
        held = tuple(rid for rid in self._seen if rid is not None and rid in self._held)
        self._emit(
            StepEvent(
                next(self._steps),
                max(start, now - self.sample_every_s),
                now,
                tuple(self._seen),
                0,
                self._window_tokens,
                held,
            )
        )
        self._window_tokens = 0
        self._seen = list(self._lanes)

    def _emit(self, event: Event) -> None:
        self.record.add(event)
        self._events.put(event)
