"""The OpenAI-compatible HTTP API over the shared engine: completions and chat completions (streaming or not),
models, health and Prometheus metrics. FastAPI parses and validates; every error is an OpenAI-style body.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from transformers import PreTrainedTokenizerBase

from batching.engine.events import FinishedEvent, TokenEvent
from batching.engine.params import RequestParams, SamplingParams
from batching.serve.gateway import Gateway, Stream
from batching.serve.metrics import FINISH_REASONS
from batching.serve.schemas import ChatCompletionRequest, CompletionRequest, GenerationFields
from batching.service import QueueFullError


@dataclass(frozen=True)
class ApiConfig:
    """What the API serves and how: the model id clients name, the defaults of absent fields, an optional key."""

    model_id: str
    default_max_tokens: int
    default_sampling: SamplingParams
    api_key: str | None = None


class ApiError(Exception):
    """An error with an HTTP status and an OpenAI-style body naming the offending field."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}
        return JSONResponse(body, status_code=self.status)


def create_app(gateway: Gateway, tokenizer: PreTrainedTokenizerBase, config: ApiConfig) -> FastAPI:
    app = FastAPI(title="Batchscope", summary="An OpenAI-compatible API over Batchscope's continuous batcher")
    _install_error_handlers(app)
    _install_auth(app, config.api_key)

    @app.get("/health")
    def health() -> Response:
        if not gateway.service.alive:
            return JSONResponse({"status": "engine stopped"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        card = {"id": config.model_id, "object": "model", "created": 0, "owned_by": "batchscope"}
        return {"object": "list", "data": [card]}

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(gateway.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await _generate(gateway, config, body, body.one_prompt(), "text_completion", request)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await _generate(gateway, config, body, _chat_prompt(tokenizer, body), "chat.completion", request)

    return app


def _chat_prompt(tokenizer: PreTrainedTokenizerBase, body: ChatCompletionRequest) -> list[int]:
    """The conversation through the tokenizer's chat template, tokenised as the template wrote it (no extra BOS)."""
    if not tokenizer.chat_template:
        raise ApiError(400, "this model has no chat template: use /v1/completions", "messages")
    text = tokenizer.apply_chat_template(body.conversation(), tokenize=False, add_generation_prompt=True)
    ids: list[int] = tokenizer(str(text), add_special_tokens=False)["input_ids"]
    return ids


async def _generate(
    gateway: Gateway, config: ApiConfig, body: GenerationFields, prompt: str | list[int], kind: str, request: Request
) -> Response:
    if body.model is not None and body.model != config.model_id:
        raise ApiError(400, f"model={body.model!r} is not served here: use {config.model_id!r}", "model")
    try:
        params = body.request_params(config.default_max_tokens, config.default_sampling)
        stream = gateway.submit(prompt, params)
    except QueueFullError as exc:
        raise ApiError(429, str(exc), None, "rate_limit_error") from None
    except RuntimeError as exc:
        raise ApiError(503, str(exc), None, "server_error") from None
    except ValueError as exc:
        raise ApiError(400, str(exc), _param_of(str(exc), kind)) from None
    reply = _Reply(kind, config.model_id, stream, params)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(_guarded(gateway, stream, reply.sse(include_usage)), media_type="text/event-stream")
    try:
        finished = await reply.wait(request)
    finally:
        gateway.forget(stream.request.request_id)
    if finished is None:  # the client left before the answer was done
        gateway.cancel(stream.request.request_id)
        return Response(status_code=499)
    return JSONResponse(reply.whole(finished))


async def _guarded(gateway: Gateway, stream: Stream, chunks: AsyncIterator[str]) -> AsyncIterator[str]:
    """Stream the chunks; a client that disconnects has its request cancelled (its slot frees on the next step)."""
    request_id = stream.request.request_id
    finished = False
    try:
        async for chunk in chunks:
            yield chunk
        finished = True
    finally:
        if not finished:
            gateway.cancel(request_id)
        gateway.forget(request_id)


def _param_of(message: str, kind: str) -> str:
    if message.startswith("max_new_tokens"):
        return "max_tokens"
    if message.startswith(("temperature", "top_k", "top_p", "repetition_penalty", "seed", "stop")):
        return message.split("=", 1)[0]
    return "messages" if kind == "chat.completion" else "prompt"


class _Reply:
    """Builds one request's response bodies (whole, or SSE chunks) from its events."""

    def __init__(self, kind: str, model_id: str, stream: Stream, params: RequestParams) -> None:
        self.kind, self.model_id, self.stream, self.params = kind, model_id, stream, params
        prefix = "chatcmpl" if kind == "chat.completion" else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    async def wait(self, request: Request) -> FinishedEvent | None:
        """The final event, or None if the client disconnected first."""
        while True:
            try:
                event = await asyncio.wait_for(self.stream.events.get(), timeout=0.5)
            except TimeoutError:
                if await request.is_disconnected():
                    return None
                continue
            if isinstance(event, FinishedEvent):
                return event

    def whole(self, finished: FinishedEvent) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": FINISH_REASONS[finished.reason], "logprobs": None}
        if self.kind == "chat.completion":
            choice["message"] = {"role": "assistant", "content": finished.text}
        else:
            choice["text"] = finished.text
        body = self._envelope(self.kind, [choice])
        body["usage"] = _usage(finished)
        body["timings"] = _timings(finished)
        if finished.error:
            body["error"] = {"message": finished.error, "type": "server_error", "param": None, "code": 500}
        return body

    async def sse(self, include_usage: bool) -> AsyncIterator[str]:
        chunk_kind = "chat.completion.chunk" if self.kind == "chat.completion" else "text_completion"
        chat = self.kind == "chat.completion"
        if chat:
            first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None, "logprobs": None}
            yield _sse(self._envelope(chunk_kind, [first]))
        while True:
            event = await self.stream.events.get()
            if isinstance(event, TokenEvent):
                if not event.text:
                    continue  # mid-character: the text comes with the next token
                piece: dict[str, Any] = {"content": event.text} if chat else {}
                choice: dict[str, Any] = {"index": 0, "finish_reason": None, "logprobs": None}
                choice.update({"delta": piece} if chat else {"text": event.text})
                yield _sse(self._envelope(chunk_kind, [choice]))
            elif isinstance(event, FinishedEvent):
                last: dict[str, Any] = {"index": 0, "finish_reason": FINISH_REASONS[event.reason], "logprobs": None}
                if chat:
                    last["delta"] = {}
                else:
                    last["text"] = ""
                final = self._envelope(chunk_kind, [last])
                final["timings"] = _timings(event)
                if event.error:
                    final["error"] = {"message": event.error, "type": "server_error", "param": None, "code": 500}
                yield _sse(final)
                if include_usage:
                    usage = self._envelope(chunk_kind, [])
                    usage["usage"] = _usage(event)
                    yield _sse(usage)
                yield "data: [DONE]\n\n"
                return

    def _envelope(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model_id, "choices": choices}


def _sse(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def _usage(event: FinishedEvent) -> dict[str, int]:
    return {
        "prompt_tokens": event.prompt_tokens,
        "completion_tokens": event.output_tokens,
        "total_tokens": event.prompt_tokens + event.output_tokens,
    }


def _timings(event: FinishedEvent) -> dict[str, float | None]:
    """Per-request timings, as llama.cpp's server reports them (milliseconds), from the engine's own clock."""
    decode_ms = None
    if event.first_token is not None:
        decode_ms = (event.finished - event.first_token) * 1000
    per_s = (event.output_tokens - 1) / (decode_ms / 1000) if decode_ms and event.output_tokens > 1 else None
    return {
        "queue_ms": None if event.queue_s is None else event.queue_s * 1000,
        "ttft_ms": None if event.ttft_s is None else event.ttft_s * 1000,
        "decode_ms": decode_ms,
        "e2e_ms": event.e2e_s * 1000,
        "tokens_per_s": per_s,
    }


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        location = [str(part) for part in first.get("loc", ()) if part != "body"]
        if first.get("type") == "json_invalid":
            return ApiError(400, "the request body is not valid JSON", None).response()
        message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
        param = ".".join(location) or None
        return ApiError(400, f"{param}: {message}" if param else message, param).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return ApiError(exc.status_code, str(exc.detail), None).response()

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:  # never a traceback to the client
        return ApiError(500, f"internal error: {type(exc).__name__}", None, "server_error").response()


def _install_auth(app: FastAPI, api_key: str | None) -> None:
    if api_key is None:
        return

    @app.middleware("http")
    async def require_key(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if request.url.path.startswith("/v1/") and request.headers.get("authorization") != f"Bearer {api_key}":
            return ApiError(
                401, "a valid API key is required: send Authorization: Bearer <key>", None, "authentication_error"
            ).response()
        return await call_next(request)
