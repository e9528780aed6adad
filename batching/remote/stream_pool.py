"""The streaming client for callers in plain threads (the load sweep's arrivals, the vLLM peer's): one event loop in
a thread of its own and one connection pool, every answer streamed there by `stream.stream_answer`.

A request is sent the moment it is submitted (its clock starts just before the POST, on the loop) and many stream at
once, as `vllm bench serve` sends them from its own event loop; whoever submitted hears of each answer once, when
it ends, with its `StreamResult`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import httpx2

from batching.remote.endpoint import Endpoint
from batching.remote.stream import Api, StreamResult, stream_answer


class StreamPool:
    """`with StreamPool(endpoint, connections) as pool: pool.submit(body, done)`: `done(result)` is called in the
    pool's thread as each answer ends; leaving the block waits for every answer submitted."""

    def __init__(
        self,
        endpoint: Endpoint,
        connections: int,
        api: Api = "completions",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.endpoint = endpoint
        self.connections = max(1, connections)
        self.api = api
        self.clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: httpx2.AsyncClient | None = None
        self._closing: asyncio.Event | None = None
        self._ready = threading.Event()
        self._answers: list[concurrent.futures.Future[None]] = []
        self._thread = threading.Thread(target=self._run, name="batchscope-streams", daemon=True)

    def __enter__(self) -> StreamPool:
        self._thread.start()
        self._ready.wait()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        concurrent.futures.wait(self._answers)
        assert self._loop is not None and self._closing is not None
        self._loop.call_soon_threadsafe(self._closing.set)
        self._thread.join()
        for answer in self._answers:
            answer.result()  # a `done` that raised says so here

    def submit(self, body: dict[str, Any], done: Callable[[StreamResult], object]) -> None:
        """Send `body` now; `done` gets its answer when it ends."""
        assert self._loop is not None, "submit inside `with StreamPool(...)`"
        self._answers.append(asyncio.run_coroutine_threadsafe(self._answer(body, done), self._loop))

    async def _answer(self, body: dict[str, Any], done: Callable[[StreamResult], object]) -> None:
        assert self._client is not None
        done(await stream_answer(self._client, self.endpoint, body, self.api, clock=self.clock))

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        limits = httpx2.Limits(max_connections=self.connections, max_keepalive_connections=self.connections)
        endpoint = self.endpoint
        async with httpx2.AsyncClient(timeout=endpoint.timeout(), headers=endpoint.headers(), limits=limits) as client:
            self._client, self._loop, self._closing = client, asyncio.get_running_loop(), asyncio.Event()
            self._ready.set()
            await self._closing.wait()
