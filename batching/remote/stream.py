"""One streamed answer from an OpenAI-compatible server: the request body, and the server-sent events read back.

`/v1/completions` takes the prompt as the page formats it (the Q/A template); `/v1/chat/completions` sends the
system prompt and the question as messages, for chat models. Both ask for the usage chunk at the end, so the
token counts are the server's own when it sends them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import httpx2

from batching.remote.endpoint import Endpoint, RemoteError, describe_status

Api = Literal["completions", "chat"]
APIS: tuple[Api, ...] = ("completions", "chat")
_PATHS = {"completions": "/completions", "chat": "/chat/completions"}


@dataclass(frozen=True)
class RemoteRequest:
    """What one prompt asks of the server: its text (formatted for completions), cap and sampling."""

    prompt: str
    max_tokens: int
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    seed: int | None = None
    question: str = ""  # chat: the user message (the prompt before formatting)
    system_prompt: str = ""  # chat: the system message


@dataclass(frozen=True)
class StreamResult:
    """How the answer ended, and the server's token counts when it sent a usage chunk."""

    finish_reason: str
    prompt_tokens: int | None
    completion_tokens: int | None


def request_body(request: RemoteRequest, model: str, api: Api) -> dict[str, Any]:
    """The JSON body: fields of OpenAI's schema only (some servers refuse anything else with a 422)."""
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
    if api == "chat":
        messages = [{"role": "system", "content": request.system_prompt}] if request.system_prompt else []
        body["messages"] = [*messages, {"role": "user", "content": request.question or request.prompt}]
    else:
        body["prompt"] = request.prompt
    return body


async def stream_answer(
    client: httpx2.AsyncClient, endpoint: Endpoint, body: dict[str, Any], api: Api, on_text: Callable[[str], None]
) -> StreamResult:
    """POST `body` and call `on_text` with each piece of answer text as it arrives; RemoteError if the server
    refuses, reports an error, or closes the stream before a finish reason."""
    path = _PATHS[api]
    async with client.stream("POST", endpoint.api + path, json=body) as response:
        if response.status_code != 200:
            text = (await response.aread()).decode("utf-8", errors="replace")
            raise RemoteError(describe_status(response.status_code, text, endpoint, "/v1" + path))
        finish: str | None = None
        usage: dict[str, Any] = {}
        try:
            async for event in httpx2.EventSource(response):
                if event.data.strip() == "[DONE]":
                    break
                chunk = _decode(event.data, endpoint)
                for choice in chunk.get("choices") or ():
                    piece = choice.get("text") if api == "completions" else (choice.get("delta") or {}).get("content")
                    if piece:
                        on_text(str(piece))
                    finish = choice.get("finish_reason") or finish
                usage = chunk.get("usage") or usage
        except httpx2.SSEError:
            raise RemoteError(
                f"{endpoint.root} did not answer with an event stream: is it OpenAI-compatible?"
            ) from None
    if finish is None:
        raise RemoteError(f"{endpoint.root} closed the stream before the answer finished")
    return StreamResult(finish, _count(usage, "prompt_tokens"), _count(usage, "completion_tokens"))


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
