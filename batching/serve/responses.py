"""The API's answers as its OpenAPI schema documents them: every status code and content type each route can answer
(`GENERATION`, `HEALTH`, `MODELS`, `METRICS`), and the bodies' shapes. The routes build their bodies as plain
dicts; these models describe them (the schemathesis test checks each answer against them)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

FinishReason = Literal["stop", "length", "abort"]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: int


class ErrorBody(BaseModel):
    """OpenAI's error body: what went wrong, its kind, the field it names (if one), the HTTP status."""

    error: ErrorDetail


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Timings(BaseModel):
    """llama.cpp-style timings in milliseconds, on the engine's clock."""

    queue_ms: float | None
    ttft_ms: float | None
    decode_ms: float | None
    e2e_ms: float
    tokens_per_s: float | None


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: FinishReason
    logprobs: None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    timings: Timings


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    timings: Timings


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class Health(BaseModel):
    """`ok`; else `restarting` (the engine died or stopped making progress) or `gave up` (restarted too often: the
    server is exiting), with the reason."""

    status: str
    reason: str | None = None


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


_RETRY = {"Retry-After": {"description": "Seconds after which trying again is worth it", "schema": {"type": "string"}}}


# With OpenAPI 3.1 an event stream's `schema` describes each event (data: a chunk as JSON, an error, or [DONE])
_STREAM = {
    "schema": {
        "type": "object",
        "required": ["data"],
        "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"}},
    }
}
_AUTH = _error("A missing or wrong API key, when the server has one (`BATCHSCOPE_SERVER__API_KEY`)")
_FAULT = _error("A fault of the server, with the error's first line")


def generation(answer: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    """A completion route's answers: the answer (JSON, or server-sent events when `stream` is true) or an error."""
    return {
        200: {
            "model": answer,
            "description": "The answer as JSON; with `stream`, server-sent events: chunks, then `data: [DONE]` (a "
            'fault once the stream has begun is a `data: {"error": {...}}` event before it)',
            "content": {"text/event-stream": _STREAM},
        },
        400: _error(
            "A bad request, refused before it reaches the engine: malformed JSON, an unknown or unsupported field "
            "(named), a value out of range, another model's name, a prompt beyond the context"
        ),
        401: _AUTH,
        413: _error("A body over the server's limit (`BATCHSCOPE_SERVER__MAX_BODY_BYTES`), refused before it is read"),
        429: {
            **_error("The engine is full (`BATCHSCOPE_LIMITS__MAX_QUEUE_TOTAL`): try again in a moment"),
            "headers": _RETRY,
        },
        499: {"description": "The client went away before the answer was done (it never reads this)"},
        500: _FAULT,
        504: _error(
            "Not answered within the server's deadline (`BATCHSCOPE_SERVER__REQUEST_TIMEOUT_S`, none by default)"
        ),
        503: {
            **_error("The engine process stopped or went silent; the server is restarting it"),
            "headers": _RETRY,
        },
    }


HEALTH: dict[int | str, dict[str, Any]] = {
    200: {"model": Health, "description": "The engine is up"},
    503: {
        "model": Health,
        "description": "The engine is being restarted, or was restarted too often",
        "headers": _RETRY,
    },
    500: _FAULT,
}
MODELS: dict[int | str, dict[str, Any]] = {
    200: {"model": ModelList, "description": "The served model"},
    401: _AUTH,
    500: _FAULT,
}
METRICS: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Prometheus' text format, with vLLM's metric names under `batchscope:`",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    },
    500: _FAULT,
}
