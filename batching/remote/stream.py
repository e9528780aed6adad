"""The one streaming client of an OpenAI-compatible server: the request body, and the server-sent events of one answer
read back as they arrive into one `StreamResult`.

Every caller streams through it: the remote view's runs and warm-ups (`dispatch`, `warmup`), the load sweep's timed
requests and the vLLM peer's (`stream_pool`, from their threads). `/v1/completions` takes the prompt as text (the
page's Q/A template) or as token ids; `/v1/chat/completions` sends the system prompt and the question as messages,
for chat models. Both ask for the usage chunk at the end, so the token counts are the server's own when it sends
them. Each event with a choice is a chunk, its arrival time kept (as `vllm bench serve` times a request: the first
gives TTFT, the gaps ITL, the last the latency); its text and, from vLLM with `return_token_ids`, its token ids are
kept in order. Whatever goes wrong (a refusal, an error mid-answer, a dropped stream, no finish reason, the
answer's time up) ends the result with one line in `error`, never an exception: the answer's one event.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx2

from batching.engine.request import FinishReason
from batching.remote.endpoint import Endpoint, RemoteError, describe_failure, describe_status

Api = Literal["completions", "chat"]
APIS: tuple[Api, ...] = ("completions", "chat")
_PATHS = {"completions": "/completions", "chat": "/chat/completions"}
# OpenAI's finish reasons but "stop" as our engine's; any other a server invents (TGI's "eos_token") is taken as EOS
_REASONS = {"length": FinishReason.LENGTH, "abort": FinishReason.CANCELLED}


@dataclass(frozen=True)
class RemoteRequest:
    """What one prompt asks of the server: its text (formatted for completions) or token ids, cap and sampling."""

    prompt: str | Sequence[int]
    max_tokens: int
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    seed: int | None = None
    question: str = ""  # chat: the user message (the prompt before formatting)
    system_prompt: str = ""  # chat: the system message
    ignore_eos: bool = False  # vLLM's (and ours): every answer runs to its cap
    token_ids: bool = False  # vLLM's `return_token_ids`: each chunk lists its tokens' ids


@dataclass
class StreamResult:
    """One streamed answer as it came back: when it was sent and each chunk arrived, its text and token ids, how it
    ended, and the server's token counts when it sent a usage chunk; `error` is the one line saying why it failed."""

    started: float
    chunks: list[float] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    first_token: float | None = None  # the first chunk with text or token ids
    ended: float | None = None
    finish_reason: str | None = None  # OpenAI's word
    stop_reason: object = None  # vLLM's: the stop string or token id that ended it, None for EOS
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def output_tokens(self) -> int:
        """The server's count, else the pieces of text that streamed (a server that sends no usage chunk)."""
        return len(self.pieces) if self.completion_tokens is None else self.completion_tokens

    @property
    def reason(self) -> FinishReason:
        """How it ended in our engine's words: "stop" is EOS unless the server names what stopped it."""
        if self.error is not None or self.finish_reason is None:
            return FinishReason.ERROR
        if self.finish_reason == "stop":
            return FinishReason.EOS if self.stop_reason is None else FinishReason.STOP
        return _REASONS.get(self.finish_reason, FinishReason.EOS)


def request_body(request: RemoteRequest, model: str, api: Api = "completions") -> dict[str, Any]:
    """The JSON body: fields of OpenAI's schema, and vLLM's extensions only when asked for (some servers refuse
    anything else with a 422: `transformers serve` refuses `ignore_eos`)."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": request.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": request.temperature,
        "top_p": request.top_p,
    }
    if request.seed is not None:
        body["seed"] = request.seed
    if request.ignore_eos:
        body["ignore_eos"] = True
    if request.token_ids:
        body["return_token_ids"] = True
    if api == "chat":
        messages = [{"role": "system", "content": request.system_prompt}] if request.system_prompt else []
        body["messages"] = [*messages, {"role": "user", "content": request.question or str(request.prompt)}]
    else:
        body["prompt"] = request.prompt if isinstance(request.prompt, str) else list(request.prompt)
    return body


async def stream_answer(
    client: httpx2.AsyncClient,
    endpoint: Endpoint,
    body: dict[str, Any],
    api: Api = "completions",
    on_text: Callable[[str], object] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> StreamResult:
    """POST `body` and read its answer as it streams, calling `on_text` with each piece of text as it arrives,
    within the endpoint's time for one answer. Failures end the result with its `error`; a cancellation of the
    calling task still cancels it."""
    result = StreamResult(clock())
    try:
        async with asyncio.timeout(endpoint.request_timeout_s):
            await _read_stream(client, endpoint, body, api, result, on_text, clock)
    except Exception as exc:  # every failure is the answer's one line; the caller's other answers go on
        result.error = describe_failure(exc, endpoint)
    result.ended = clock()
    return result


async def _read_stream(
    client: httpx2.AsyncClient,
    endpoint: Endpoint,
    body: dict[str, Any],
    api: Api,
    result: StreamResult,
    on_text: Callable[[str], object] | None,
    clock: Callable[[], float],
) -> None:
    """The answer's events into `result`; RemoteError if the server refuses, reports an error, sends something
    else than an event stream, or closes it before a finish reason."""
    path = _PATHS[api]
    async with client.stream("POST", endpoint.api + path, json=body) as response:
        if response.status_code != 200:
            text = (await response.aread()).decode("utf-8", errors="replace")
            raise RemoteError(describe_status(response.status_code, text, endpoint, "/v1" + path))
        try:
            async for event in httpx2.EventSource(response):
                if event.data.strip() == "[DONE]":
                    break
                _read_chunk(result, _decode(event.data, endpoint), api, clock(), on_text)
        except httpx2.SSEError:
            raise RemoteError(
                f"{endpoint.root} did not answer with an event stream: is it OpenAI-compatible?"
            ) from None
    if result.finish_reason is None:
        raise RemoteError(f"{endpoint.root} closed the stream before the answer finished")


def _read_chunk(
    result: StreamResult, chunk: dict[str, Any], api: Api, now: float, on_text: Callable[[str], object] | None
) -> None:
    choices = chunk.get("choices") or ()
    if choices:
        result.chunks.append(now)
    for choice in choices:
        piece = choice.get("text") if api == "completions" else (choice.get("delta") or {}).get("content")
        ids = [int(token) for token in choice.get("token_ids") or ()]
        if (piece or ids) and result.first_token is None:
            result.first_token = now
        result.token_ids += ids
        if piece:
            result.pieces.append(str(piece))
            if on_text is not None:
                on_text(str(piece))
        if choice.get("finish_reason"):
            result.finish_reason, result.stop_reason = str(choice["finish_reason"]), choice.get("stop_reason")
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        result.prompt_tokens = _count(usage, "prompt_tokens")
        result.completion_tokens = _count(usage, "completion_tokens")


def _decode(data: str, endpoint: Endpoint) -> dict[str, Any]:
    try:
        chunk = json.loads(data)
    except ValueError:
        raise RemoteError(f"{endpoint.root} sent a stream event that is not JSON: {data[:80]!r}") from None
    if not isinstance(chunk, dict):
        raise RemoteError(f"{endpoint.root} sent a stream event that is not a JSON object")
    error = chunk.get("error")
    if error:
        message = error.get("message", error) if isinstance(error, dict) else error
        raise RemoteError(f"{endpoint.root} reported an error mid-answer: {str(message)[:200]}")
    return chunk


def _count(usage: dict[str, Any], key: str) -> int | None:
    value = usage.get(key)
    return int(value) if isinstance(value, int | float) else None
