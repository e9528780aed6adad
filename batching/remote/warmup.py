"""One short request before a remote comparison is timed, so neither run meets a cold server.

A server's first answers can pay for its own start (vLLM's CPU build is several times slower to its first tokens;
`transformers serve` starts its batching thread then: docs/benchmarks.md): whichever run came first would be
timed cold and the other warm. The warm-up is one short question in the run's own model, API and template, so it
also finds a wrong model name or key before anything starts, and the shared system prompt is in the server's prefix
cache for both runs alike. Nothing of it reaches a run's record.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx2

from batching.remote.dispatch import RunSetup
from batching.remote.endpoint import RemoteError
from batching.remote.stream import RemoteRequest, StreamResult, request_body, stream_answer

WARM_UP_QUESTION = "Hello?"
WARM_UP_TOKENS = 4


@dataclass(frozen=True)
class WarmUp:
    """The warm-up's answer: how long it took, start to end, and its tokens (the server's count, else the pieces
    of text that streamed)."""

    seconds: float
    tokens: int


def warm_up(
    setup: RunSetup, prompt: str, question: str = WARM_UP_QUESTION, clock: Callable[[], float] = time.perf_counter
) -> WarmUp:
    """Send `prompt` (chat: `question`, with the setup's system prompt) for `WARM_UP_TOKENS` greedy tokens and wait
    for the whole answer; RemoteError with one line saying the warm-up failed, and why, if it did."""
    request = RemoteRequest(prompt, WARM_UP_TOKENS, question=question, system_prompt=setup.system_prompt)
    result = asyncio.run(_answer(setup, request, clock))
    if result.error is not None:  # whatever failed, the page shows one line and starts nothing
        raise RemoteError(f"the warm-up request failed, so nothing was run: {result.error}")
    return WarmUp((result.ended or result.started) - result.started, result.output_tokens)


async def _answer(setup: RunSetup, request: RemoteRequest, clock: Callable[[], float]) -> StreamResult:
    endpoint = setup.endpoint
    async with httpx2.AsyncClient(timeout=endpoint.timeout(), headers=endpoint.headers()) as client:
        return await stream_answer(
            client, endpoint, request_body(request, setup.model, setup.api), setup.api, None, clock
        )
