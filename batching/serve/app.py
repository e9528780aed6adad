"""The OpenAI-compatible HTTP API over the shared engine: completions and chat completions (streaming or not),
models, health and Prometheus metrics. FastAPI parses and validates against this server's own limits; every error
is an OpenAI-style body with an HTTP error status (a 400 before the engine sees the request, a 5xx for a fault),
and the OpenAPI schema documents every status and content type the routes answer.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response, StreamingResponse
from jinja2 import TemplateError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from batching.engine.builder import RequestBuilder
from batching.engine.events import Event, FinishedEvent, TokenEvent
from batching.engine.params import RequestParams
from batching.engine.request import FinishReason
from batching.serve import responses
from batching.serve.body_limit import BodyLimit
from batching.serve.gateway import Gateway, Stream
from batching.serve.metrics import FINISH_REASONS
from batching.serve.schemas import (
    REFUSED,
    ChatCompletionRequest,
    CompletionRequest,
    GenerationFields,
    SamplingDefaults,
    ServedLimits,
    served_models,
)
from batching.serve.stops import StreamedText, cut
from batching.service import EngineDeadError, QueueFullError

logger = logging.getLogger(__name__)

RETRY_AFTER = {"Retry-After": "1"}  # a full engine, or one restarting: seconds until trying again is worth it


@dataclass(frozen=True)
class ApiConfig:
    """What the API serves and how: the model and its limits, the defaults of absent fields, an optional key."""

    limits: ServedLimits
    default_max_tokens: int
    sampling: SamplingDefaults
    api_key: str | None = None
    max_body_bytes: int | None = None  # a larger body is a 413 before anything reads it
    request_timeout_s: float | None = None  # a request still unanswered this long after it came is cancelled: 504


class ApiError(Exception):
    """An error with an HTTP status and an OpenAI-style body naming the offending field."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        kind: str = "invalid_request_error",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.headers = status, message, param, kind, headers

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def create_app(gateway: Gateway, config: ApiConfig) -> FastAPI:
    app = FastAPI(title="Batchscope", summary="An OpenAI-compatible API over Batchscope's continuous batcher")
    if config.max_body_bytes is not None:
        app.add_middleware(BodyLimit, limit=config.max_body_bytes)
    _install_error_handlers(app)
    _install_auth(app, config.api_key)

    @app.get("/health", responses=responses.HEALTH)
    async def health() -> Response:  # on the event loop: it answers as long as the loop does
        lifecycle = gateway.service.lifecycle
        if not lifecycle.alive:
            body = {"status": lifecycle.state.value, "reason": lifecycle.last_error}
            return JSONResponse(body, status_code=503, headers=RETRY_AFTER)
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models", responses=responses.MODELS)
    def models() -> Response:
        card = {"id": config.limits.model_id, "object": "model", "created": 0, "owned_by": "batchscope"}
        return JSONResponse({"object": "list", "data": [card]})

    @app.get("/metrics", response_class=Response, responses=responses.METRICS)  # its 200 is text/plain only
    def metrics() -> Response:
        return Response(generate_latest(gateway.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    builder = gateway.service.admission.builder(gateway.options)  # the engine's own checks

    async def completions(body: CompletionRequest, request: Request) -> Response:
        prompt = functools.partial(_completion_prompt, builder, body.one_prompt())
        return await _answered(_generate(gateway, config, body, prompt, "text_completion", request))

    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        prompt = functools.partial(_chat_prompt, builder, body)
        return await _answered(_generate(gateway, config, body, prompt, "chat.completion", request))

    # FastAPI reads each body's type from the annotation: this server's, whose fields carry its limits
    completion_body, chat_body = served_models(config.limits)
    completions.__annotations__["body"] = completion_body
    chat_completions.__annotations__["body"] = chat_body
    app.post("/v1/completions", responses=responses.generation(responses.Completion))(completions)
    app.post("/v1/chat/completions", responses=responses.generation(responses.ChatCompletion))(chat_completions)
    bodies = (completion_body, chat_body)
    app.openapi = lambda: _openapi(app, bodies, config.api_key is not None)  # type: ignore[method-assign]
    return app


def _openapi(app: FastAPI, bodies: tuple[type[BaseModel], ...], keyed: bool) -> dict[str, Any]:
    """FastAPI's schema, with three mends: the request bodies as pydantic states them (FastAPI's OpenAPI model
    turns every bound into a float, and the seed's 2**63 - 1 is no float), no 422 (a validation error is answered
    400 here), and the bearer key the /v1 routes require when the server has one."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
        components = schema.setdefault("components", {})
        schemas = components.setdefault("schemas", {})
        for body in bodies:
            exact = body.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(exact.pop("$defs", {}))
            schemas[body.__name__] = exact
        for name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(name, None)
        for path, operations in schema["paths"].items():
            for operation in operations.values():
                operation["responses"].pop("422", None)
                if keyed and path.startswith("/v1/"):
                    operation["security"] = [{"bearer": []}]
        if keyed:
            components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        app.openapi_schema = schema
    return app.openapi_schema


def _completion_prompt(builder: RequestBuilder, prompt: str | list[int]) -> list[int]:
    """A completion's prompt as token ids: text tokenised as `generate` would (with the model's BOS, if any)."""
    return prompt if isinstance(prompt, list) else builder.tokenize(prompt)


def _chat_prompt(builder: RequestBuilder, body: ChatCompletionRequest) -> list[int]:
    """The conversation through the tokenizer's chat template, tokenised as the template wrote it (no extra BOS)."""
    tokenizer = builder.tokenizer
    if not tokenizer.chat_template:
        raise ApiError(400, "this model has no chat template: use /v1/completions", "messages")
    try:
        text = tokenizer.apply_chat_template(body.conversation(), tokenize=False, add_generation_prompt=True)
    except TemplateError as exc:  # the template's own refusal (roles out of order, say)
        raise ApiError(400, f"the model's chat template refused these messages: {exc}", "messages") from None
    builder.check_length(str(text))
    ids: list[int] = tokenizer(str(text), add_special_tokens=False)["input_ids"]
    return ids


async def _answered(answer: Awaitable[Response]) -> Response:
    """`answer`, or a fault of ours as a 500 of one line, answered like any error: Starlette's last-resort handler
    would answer it too, then raise it on to the server, which closes the client's keep-alive connection."""
    try:
        return await answer
    except ApiError:
        raise
    except Exception as exc:
        logger.exception("a request failed")
        raise ApiError(500, f"internal error: {type(exc).__name__}", None, "server_error") from None


async def _generate(
    gateway: Gateway,
    config: ApiConfig,
    body: GenerationFields,
    prompt_ids: Callable[[], list[int]],
    kind: str,
    request: Request,
) -> Response:
    limits, arrived = config.limits, time.monotonic()
    if body.model is not None and body.model != limits.model_id:
        raise ApiError(400, f"model={body.model!r} is not served here: use {limits.model_id!r}", "model")

    def prepare() -> tuple[list[int], RequestParams]:
        """The prompt's ids (tokenised or rendered: work in proportion to the body) and the engine's parameters."""
        prompt = prompt_ids()
        cap = body.cap(config.default_max_tokens)
        room = limits.window - len(prompt)
        if room >= 1:  # else the prompt is too long, and the engine's check says so
            cap = min(cap, room)
        return prompt, body.request_params(cap, config.sampling)

    try:
        stream = await gateway.submit(prepare)
    except QueueFullError as exc:
        raise ApiError(429, str(exc), None, "rate_limit_error", RETRY_AFTER) from None
    except EngineDeadError as exc:
        raise ApiError(503, str(exc), None, "server_error", RETRY_AFTER) from None
    except ValueError as exc:
        raise ApiError(400, str(exc), _param_of(str(exc), kind)) from None
    reply = _Reply(kind, limits.model_id, stream, gateway, config.request_timeout_s, arrived)
    if body.stream:
        options = body.stream_options
        usage = bool(options and options.include_usage), bool(options and options.continuous_usage_stats)
        return StreamingResponse(_guarded(gateway, stream, reply.sse(*usage)), media_type="text/event-stream")
    try:
        finished = await reply.wait(request)
    except Overdue as overdue:
        gateway.cancel(stream.request.request_id)
        raise overdue.error from None
    finally:
        gateway.forget(stream.request.request_id)
    if finished is None:  # the client left before the answer was done
        gateway.cancel(stream.request.request_id)
        return Response(status_code=499)
    if finished.reason is FinishReason.ERROR:
        raise reply.fault(finished)
    return JSONResponse(reply.whole(finished))


async def _guarded(gateway: Gateway, stream: Stream, chunks: AsyncIterator[str]) -> AsyncIterator[str]:
    """Stream the chunks; a client that disconnects has its request cancelled (its slot frees on the next step).
    A fault once the headers are out is an error event, then the end (the status is already 200)."""
    request_id = stream.request.request_id
    finished = False
    try:
        async for chunk in chunks:
            yield chunk
        finished = True
    except Exception as exc:
        logger.exception("the stream of request %s failed", request_id)
        yield _sse(ApiError(500, f"internal error: {type(exc).__name__}", None, "server_error").body())
        yield "data: [DONE]\n\n"
    finally:
        if not finished:
            gateway.cancel(request_id)
        gateway.forget(request_id)


async def _disconnect(request: Request) -> None:
    """Returns when the client has gone (its body was read: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _param_of(message: str, kind: str) -> str:
    if message.startswith("max_new_tokens"):
        return "max_tokens"
    if message.startswith(("temperature", "top_k", "top_p", "repetition_penalty", "seed", "stop")):
        return message.split("=", 1)[0]
    return "messages" if kind == "chat.completion" else "prompt"


class Overdue(Exception):
    """A request outlived the server's deadline (`ApiConfig.request_timeout_s`); `error` is its 504."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"deadline of {timeout_s:g} s")
        message = (
            f"the request was not answered within this server's deadline of {timeout_s:g} s "
            "(BATCHSCOPE_SERVER__REQUEST_TIMEOUT_S) and was cancelled"
        )
        self.error = ApiError(504, message, None, "timeout_error")


class _Reply:
    """Builds one request's response bodies (whole, or SSE chunks) from its events, stop strings left out; a
    request past `timeout_s` since it `arrived` (time.monotonic) raises `Overdue`."""

    def __init__(
        self,
        kind: str,
        model_id: str,
        stream: Stream,
        gateway: Gateway,
        timeout_s: float | None,
        arrived: float,
    ) -> None:
        self.kind, self.model_id, self.stream, self.gateway = kind, model_id, stream, gateway
        self.params = stream.request.params
        self.timeout_s = timeout_s
        self.deadline = None if timeout_s is None else arrived + timeout_s
        self.chat = kind == "chat.completion"
        prefix = "chatcmpl" if self.chat else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    async def wait(self, request: Request) -> FinishedEvent | None:
        """The final event, or None if the client disconnected first: its going is heard as it happens (the
        server's `http.disconnect`), so its request is cancelled before the engine's next step."""
        final, gone = asyncio.ensure_future(self._final()), asyncio.ensure_future(_disconnect(request))
        try:
            await asyncio.wait((final, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            final.cancel()
            gone.cancel()
        return final.result() if final.done() and not final.cancelled() else None

    async def _final(self) -> FinishedEvent:
        while not isinstance(event := await self._next(), FinishedEvent):
            pass
        return event

    async def _next(self) -> Event:
        """The request's next event; raises Overdue once its deadline has passed."""
        if self.deadline is None or self.timeout_s is None:
            return await self.stream.events.get()
        try:
            return await asyncio.wait_for(self.stream.events.get(), self.deadline - time.monotonic())
        except TimeoutError:
            raise Overdue(self.timeout_s) from None

    def fault(self, finished: FinishedEvent) -> ApiError:
        """A request the engine failed: 503 when its engine process stopped (another is being started), else
        500."""
        lifecycle = self.gateway.service.lifecycle
        if lifecycle.alive and lifecycle.generation == self.stream.generation:
            return ApiError(500, f"the request failed in the engine: {finished.error}", None, "server_error")
        return ApiError(503, f"the request failed: {finished.error}", None, "server_error", RETRY_AFTER)

    def ending(self, finished: FinishedEvent) -> tuple[str, str]:
        """The whole answer, cut at its stop string, and its finish reason ("stop" when a stop string ended it)."""
        text, stopped = cut(finished.text, self.params.stop_strings)
        return text, "stop" if stopped else FINISH_REASONS[finished.reason]

    def whole(self, finished: FinishedEvent) -> dict[str, Any]:
        text, reason = self.ending(finished)
        choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        body = self._envelope(self.kind, [choice])
        body["usage"] = _usage(len(self.stream.request.prompt_ids), finished.output_tokens)
        body["timings"] = _timings(finished)
        return body

    async def sse(self, include_usage: bool, continuous_usage: bool) -> AsyncIterator[str]:
        """The answer as server-sent events: a chunk per piece of text no stop string can claim, the last with the
        finish reason, the usage if asked (in every chunk with vLLM's `continuous_usage_stats`), then [DONE]."""
        text = StreamedText(self.params.stop_strings)
        prompt_tokens = len(self.stream.request.prompt_ids)
        if self.chat:
            first = self._chunk("", None, role=True)
            if continuous_usage:
                first["usage"] = _usage(prompt_tokens, 0)
            yield _sse(first)
        while True:
            try:
                event = await self._next()
            except Overdue as overdue:
                self.gateway.cancel(self.stream.request.request_id)
                yield _sse(overdue.error.body())
                yield "data: [DONE]\n\n"
                return
            if isinstance(event, TokenEvent):
                piece = text.push(event.text)
                if not piece:
                    continue  # mid-character, or what may be the start of a stop string: it waits
                chunk = self._chunk(piece, None)
                if continuous_usage:
                    chunk["usage"] = _usage(prompt_tokens, event.index + 1)
                yield _sse(chunk)
            elif isinstance(event, FinishedEvent):
                if event.reason is FinishReason.ERROR:
                    yield _sse(self.fault(event).body())
                    yield "data: [DONE]\n\n"
                    return
                answer, reason = self.ending(event)
                last = self._chunk(text.rest(answer), reason)
                if continuous_usage:
                    last["usage"] = _usage(prompt_tokens, event.output_tokens)
                last["timings"] = _timings(event)
                yield _sse(last)
                if include_usage:
                    usage = self._envelope(self._chunk_kind, [])
                    usage["usage"] = _usage(prompt_tokens, event.output_tokens)
                    yield _sse(usage)
                yield "data: [DONE]\n\n"
                return

    @property
    def _chunk_kind(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def _chunk(self, piece: str, reason: str | None, role: bool = False) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None}
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if piece or role:
                delta["content"] = piece
            choice["delta"] = delta
        else:
            choice["text"] = piece
        return self._envelope(self._chunk_kind, [choice])

    def _envelope(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model_id, "choices": choices}


def _sse(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
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
        return _invalid(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return ApiError(exc.status_code, str(exc.detail), None, headers=exc.headers).response()  # 405's Allow

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:  # never a traceback to the client
        return ApiError(500, f"internal error: {type(exc).__name__}", None, "server_error").response()


def _invalid(exc: RequestValidationError) -> ApiError:
    """The most telling of pydantic's errors as one 400 naming its field: of a union's errors, one about the value
    over one about its type (a list of empty stop strings is a list: its string type error tells nothing)."""
    errors = exc.errors()
    first = min(errors, key=lambda error: (str(error.get("type", "")).endswith("_type"), -len(error.get("loc", ()))))
    kind = first.get("type")
    if kind == "json_invalid":
        return ApiError(400, "the request body is not valid JSON", None)
    param = _path(exc.body, tuple(first.get("loc", ())), kind == "missing")
    name = param.split(".", 1)[0] if param else ""
    if kind == "extra_forbidden":
        return ApiError(400, f"{param} is not supported by this server: leave it out", param)
    if name in REFUSED and param == name:
        value = first.get("input")
        shown = f"{name}={value!r}" if isinstance(value, int | float | str) else name
        return ApiError(400, f"{shown} is not supported: {REFUSED[name]}", name)
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    return ApiError(400, f"{param}: {message}" if param else message, param)


def _path(body: object, location: tuple[Any, ...], missing: bool) -> str | None:
    """The field an error's location names, as the request wrote it: pydantic's union members ("str",
    "list[int]") are steps of its own, not keys of the body, and are left out; a missing field ends the path."""
    steps = location[1:] if location[:1] == ("body",) else location
    parts, value = [], body
    for step in steps:
        key = isinstance(value, dict) and isinstance(step, str) and step in value
        index = isinstance(value, list) and isinstance(step, int) and 0 <= step < len(value)
        if key or index:
            value = value[step]  # type: ignore[index]
            parts.append(str(step))
    if missing and steps:
        parts.append(str(steps[-1]))
    return ".".join(parts) or None


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
