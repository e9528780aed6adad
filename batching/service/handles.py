"""What a client hands out: a `Session` on a shared batcher, a `PrivateBatcher` with its `PrivateRun`s, a race.

All are thin: the client does the bookkeeping and the talking to the engine process; these only hold an inbox the
client's receiver thread fills, and read it.
"""

from __future__ import annotations

import itertools
import math
import queue
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from batching.arrivals import Schedule
from batching.engine.events import Event
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams
from batching.race import LaneStep, check_pause
from batching.runs import RunRecord, drain
from batching.service.messages import RaceEnded, RacePace, RunEnded, StopRace

Item = tuple[str | Sequence[int], RequestParams, str]  # (prompt, params, request id)


class SessionLink(Protocol):
    """What a session asks of its client (`batching.service.client.EngineClient`)."""

    def submit(self, session: Session, prompt: str | Sequence[int], params: RequestParams) -> Submitted: ...
    def cancel(self, request_ids: Sequence[str]) -> None: ...
    def cancel_all(self, session: Session) -> None: ...
    def close_session(self, session: Session) -> None: ...


class PrivateLink(Protocol):
    """What a private batcher and a race ask of their client (`batching.service.private.PrivateRuns`)."""

    def run_private(self, private: PrivateBatcher, items: Sequence[Item], schedule: Schedule) -> PrivateRun: ...
    def close_private(self, private: PrivateBatcher) -> None: ...
    def race_add(self, race: RaceHandle, item: Item) -> None: ...
    def race_send(self, message: RacePace | StopRace) -> None: ...
    def close_race(self, race: RaceHandle) -> None: ...


class QueueFullError(ValueError):
    """A request was refused because a queue limit was reached; the message says which."""


class EngineDeadError(RuntimeError):
    """The engine process stopped; the message is one line saying what happened and what to do."""


@dataclass(frozen=True)
class Submitted:
    """A request the engine accepted: its id, when it arrived (perf_counter, the engine's clock), what it asked."""

    request_id: str
    arrival: float
    prompt_ids: tuple[int, ...]
    params: RequestParams


@dataclass(frozen=True)
class BatcherLoad:
    """What one shared batcher holds now (for gauges): requests in a slot and waiting, KV tokens held, and its block
    pool's blocks held by requests (0 of 0 before its first step)."""

    running: int
    waiting: int
    slots: int
    kv_tokens: int
    kv_capacity: int
    kv_blocks_in_use: int = 0
    kv_blocks: int = 0

    @property
    def kv_usage(self) -> float:
        """vLLM's KV-cache usage, 0 to 1: blocks held by requests / the pool's blocks (cached free blocks count as
        free); positions holding tokens / every slot's context when the pool is not known yet."""
        if self.kv_blocks:
            return self.kv_blocks_in_use / self.kv_blocks
        return self.kv_tokens / self.kv_capacity if self.kv_capacity else 0.0


class Session:
    """One client's (a browser tab's) handle on the shared batcher chosen by `options`.

    It sees its own token and finished events, and every step of that batcher (to draw the whole batch).
    """

    def __init__(self, client: SessionLink, session_id: str, options: BatcherOptions, max_queue: int) -> None:
        self.service = client
        self.session_id = session_id
        self.options = options
        self.max_queue = max_queue
        self.inbox: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.pending: dict[str, BatcherOptions] = {}  # request id -> its batcher; the client's lock guards it
        self.last_seen = time.monotonic()
        self.closed = False
        self._counter = itertools.count(1)

    def next_request_id(self) -> str:
        return f"{self.session_id}/{next(self._counter)}"

    def owns(self, request_id: str) -> bool:
        return request_id.startswith(self.session_id + "/")

    def submit(self, prompt: str | Sequence[int], params: RequestParams) -> Submitted:
        """Check and queue a request; raises ValueError (bad input), QueueFullError (limits) or EngineDeadError."""
        return self.service.submit(self, prompt, params)

    def poll(self, timeout: float = 0.0) -> list[Event]:
        """Every event for this session since the last poll; waits up to `timeout` for the first one.

        Polling is how the client knows the tab is still there: a session silent for `session_timeout_s` is
        dropped and its requests cancelled.
        """
        self.last_seen = time.monotonic()
        return drain(self.inbox, timeout)

    def cancel(self, request_id: str) -> None:
        self.service.cancel([request_id])

    def cancel_all(self) -> None:
        """Cancel this session's waiting and running requests (the Stop button)."""
        self.service.cancel_all(self)

    def close(self) -> None:
        self.service.close_session(self)


class PrivateRun:
    """A queue running on a private batcher: iterate `events()`; afterwards `record` holds the whole run."""

    def __init__(self, mode: str, slots: int) -> None:
        self.inbox: queue.SimpleQueue[tuple[Event, ...] | RunEnded | EngineDeadError] = queue.SimpleQueue()
        self.record = RunRecord(mode, math.nan, slots=slots)

    def events(self) -> Iterator[Event]:
        """The run's events as its steps happen; raises EngineDeadError, or RuntimeError if the run failed."""
        while True:
            message = self.inbox.get()
            if isinstance(message, EngineDeadError):
                raise message
            if isinstance(message, RunEnded):
                self.record.start, self.record.end = message.start, message.end
                if message.error is not None:
                    raise RuntimeError(f"the private run failed: {message.error}")
                return
            self.record.extend(message)
            yield from message

    def complete(self) -> RunRecord:
        for _ in self.events():
            pass
        return self.record


class PrivateBatcher:
    """A batcher of this client's own in the engine process (same loop, its own clock). Close it when done."""

    def __init__(self, client: PrivateLink, batcher_id: str, mode: str, options: BatcherOptions) -> None:
        self.client = client
        self.batcher_id = batcher_id
        self.mode = mode
        self.options = options
        self.current: PrivateRun | None = None

    def run(self, items: Sequence[Item], schedule: Schedule) -> PrivateRun:
        """Run (prompt, params, request id) items arriving on `schedule`; raises ValueError for bad input."""
        return self.client.run_private(self, items, schedule)

    def close(self) -> None:
        self.client.close_private(self)

    def __enter__(self) -> PrivateBatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


RaceMessage = LaneStep | RaceEnded


class RaceHandle:
    """A race of the client's own (`batching.race`): poll its lanes' steps; add, slow down, stop, close.

    Polling is how the client knows the tab is still there: a race not polled for `session_timeout_s` is closed.
    """

    def __init__(self, client: PrivateLink, race_id: str, options: BatcherOptions) -> None:
        self.client = client
        self.race_id = race_id
        self.options = options
        self.inbox: queue.SimpleQueue[RaceMessage | EngineDeadError] = queue.SimpleQueue()
        self.last_seen = time.monotonic()
        self.ended: RaceEnded | None = None

    def poll(self, timeout: float = 0.0) -> list[RaceMessage]:
        """Every lane step (and the end) since the last poll; waits up to `timeout` for the first one.

        Raises EngineDeadError if the engine stopped.
        """
        self.last_seen = time.monotonic()
        messages: list[RaceMessage] = []
        try:
            message = self.inbox.get(timeout=timeout) if timeout > 0 else self.inbox.get_nowait()
            while True:
                if isinstance(message, EngineDeadError):
                    raise message
                if isinstance(message, RaceEnded):
                    self.ended = message
                messages.append(message)
                message = self.inbox.get_nowait()
        except queue.Empty:
            pass
        return messages

    def add(self, prompt: str | Sequence[int], params: RequestParams, request_id: str) -> None:
        """A prompt typed during the race joins every lane at the same clock time; ValueError for bad input."""
        self.client.race_add(self, (prompt, params, request_id))

    def set_pause(self, pause_s: float) -> None:
        """Slow motion: seconds between the race's steps (0 to 1), counted on neither clock."""
        self.client.race_send(RacePace(self.race_id, check_pause(pause_s)))

    def stop(self) -> None:
        """Cancel both lanes: running requests end cancelled, those yet to arrive never arrive."""
        self.client.race_send(StopRace(self.race_id))

    def close(self) -> None:
        self.client.close_race(self)
