"""Start the API: `python -m batching.serve` (its own engine), or `start_background` inside another process that
already runs the shared engine (the Streamlit page, when `BATCHSCOPE_SERVER__PORT` is set).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType

import uvicorn
from transformers import GenerationConfig

from batching.allocator import allocator_state
from batching.command_line import OneLineParser
from batching.engine.events import FinishedEvent
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams
from batching.serve.app import ApiConfig, create_app
from batching.serve.gateway import Gateway
from batching.serve.kv_budget import available_memory_bytes, serving_pool
from batching.serve.schemas import SamplingDefaults, ServedLimits
from batching.service import EngineClient, EngineConfig, engine_options
from config.settings import ModelSettings, Settings, SettingsError, load_settings, setting_warnings
from model.loader import ModelLoadError, resolve_source
from utils.log_setup import configure_logging

logger = logging.getLogger(__name__)
DEFAULT_PORT = 8000
ENGINE_GAVE_UP = 3  # the exit code when the engine was restarted too often (`BATCHSCOPE_ENGINE__MAX_RESTARTS`)
GRACEFUL_EXIT_S = 5  # how long open connections may finish when the server exits


class ServeError(Exception):
    """Bad flags: one line on stderr, exit code 2."""


class ExitWhenGivenUp:
    """What the server does when its engine was restarted too often: it stops serving and exits non-zero
    (`ENGINE_GAVE_UP`), so that the process manager above it (systemd, Kubernetes) starts it afresh."""

    def __init__(self) -> None:
        self.code = 0
        self.server: uvicorn.Server | None = None

    def __call__(self, reason: str) -> None:
        logger.critical("the server exits: %s", reason)
        self.code = ENGINE_GAVE_UP
        if self.server is not None:
            self.server.should_exit = True

    def serve(self, server: uvicorn.Server) -> int:
        """Run `server` until it stops; the exit code."""
        self.server = server
        server.should_exit = server.should_exit or bool(self.code)
        server.run()
        return self.code


class StoppingServer(uvicorn.Server):
    """uvicorn's server, which tells the engine's supervisor first when a signal stops it: the same signal may
    reach the engine process (Ctrl+C, or systemd's SIGTERM to the whole group), which is then not restarted."""

    def __init__(self, config: uvicorn.Config, service: EngineClient) -> None:
        super().__init__(config)
        self.service = service

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.service.lifecycle.stop_restarting()
        super().handle_exit(sig, frame)


def api_config(settings: Settings, service: EngineClient, options: BatcherOptions) -> ApiConfig:
    """What the API takes (the engine's own limits for `options`) and what absent fields default to: the model's
    sampling defaults, the settings' `max_new_tokens`."""
    builder = service.admission.builder(options)
    window = min(builder.context_length, builder.kv_tokens or builder.context_length)
    limits = ServedLimits(
        model_id=settings.server.served_model_name or service.info.name,
        vocab_size=len(service.tokenizer),
        max_prompt_tokens=min(builder.max_prompt_tokens, window - 1),
        window=window,
    )
    sampling = sampling_defaults(settings.model)
    server = settings.server
    return ApiConfig(
        limits,
        settings.generation.max_new_tokens,
        sampling,
        server.api_key,
        server.max_body_bytes,
        server.request_timeout_s,
    )


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """A line to log when the API listens beyond this machine without a key (anyone who reaches it may use it)."""
    if api_key is not None or host == "localhost":
        return None
    try:
        if ipaddress.ip_address(host.strip("[]")).is_loopback:
            return None
    except ValueError:  # a host name: it may resolve to anything
        pass
    return (
        f"the API listens on {host}, beyond this machine, without an API key: anyone who can reach it may use it; "
        "set --api-key (or BATCHSCOPE_SERVER__API_KEY)"
    )


def sampling_defaults(model: ModelSettings) -> SamplingDefaults:
    """What a request that leaves a sampling field out gets, as on vLLM's server (`--generation-config auto`): the
    value the model's generation_config.json sets, else OpenAI's default (temperature 1: it samples). Its `do_sample`
    is not read, as vLLM does not: a client that wants greedy says temperature 0."""
    try:
        config = GenerationConfig.from_pretrained(
            resolve_source(model.name_or_path), revision=model.revision or "main", local_files_only=True
        )
    except (OSError, ValueError):  # none (the engine loaded the model, so a hub model's files are cached)
        return SamplingDefaults()
    names = ("temperature", "top_p", "top_k", "repetition_penalty")
    given = {name: value for name, value in config.to_diff_dict().items() if name in names and value is not None}
    return SamplingDefaults(**given)


@dataclass
class BackgroundServer:
    """A uvicorn server running in a daemon thread of this process."""

    server: uvicorn.Server
    thread: threading.Thread
    gateway: Gateway

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)
        self.gateway.close()


def start_background(service: EngineClient, settings: Settings, port: int) -> BackgroundServer:
    """Serve the API from this process on `port`, sharing `service`'s engine with whoever else uses it."""
    if (warning := exposure_warning(settings.server.host, settings.server.api_key)) is not None:
        logger.warning("%s", warning)
    gateway = Gateway(service, engine_options(settings), settings.limits.max_queue_total)
    app = create_app(gateway, api_config(settings, service, gateway.options))
    config = uvicorn.Config(app, host=settings.server.host, port=port, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="batchscope-api", daemon=True)
    thread.start()
    return BackgroundServer(server, thread, gateway)


def warm_up(service: EngineClient, options: BatcherOptions, timeout_s: float = 60.0) -> None:
    """One tiny request before serving, so the first client does not pay for the first forward pass."""
    session = service.open_session(options)
    request = session.submit([0, 1, 2], RequestParams(2, ignore_eos=True))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(isinstance(e, FinishedEvent) and e.request_id == request.request_id for e in session.poll(0.1)):
            break
    session.close()


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        error_type=ServeError,
        prog="python -m batching.serve",
        description="Serve the engine over an OpenAI-compatible API.",
    )
    parser.add_argument("--host", help="default: BATCHSCOPE_SERVER__HOST (127.0.0.1)")
    parser.add_argument("--port", type=int, help=f"default: BATCHSCOPE_SERVER__PORT, else {DEFAULT_PORT}")
    parser.add_argument("--model", help="builtin, a hub id or a local folder (default: settings)")
    parser.add_argument("--api-key", help="require this bearer key (default: BATCHSCOPE_SERVER__API_KEY)")
    parser.add_argument(
        "--no-compile",
        action="store_true",
        help="start at once and run every step eager (BATCHSCOPE_ENGINE__COMPILE_STEPS=false does too); by default "
        "the compiled steps' graphs are made before the port opens",
    )
    parser.add_argument(
        "--kv-cache-mb",
        type=float,
        help="KV memory of the served batcher in MiB (default: BATCHSCOPE_BATCHING__KV_CACHE_MB or __KV_CACHE_TOKENS "
        "when set, else 4 whole contexts a slot within a quarter of the memory available)",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


def _with_flags(settings: Settings, args: argparse.Namespace) -> Settings:
    """The settings with what the command line gives instead (flags win over the environment)."""
    model = settings.model.model_copy(update={"name_or_path": args.model} if args.model else {})
    server = settings.server.model_copy(
        update={k: v for k, v in {"host": args.host, "api_key": args.api_key}.items() if v is not None}
    )
    engine = settings.engine.model_copy(update={"compile_steps": False} if args.no_compile else {})
    # Counted as set (`model_fields_set`), as the environment's would be: the pool is what the flag says.
    pool = {} if args.kv_cache_mb is None else {"kv_cache_mb": args.kv_cache_mb}
    batching = settings.batching.model_copy(update=pool)
    return settings.model_copy(update={"model": model, "server": server, "engine": engine, "batching": batching})


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.port is not None and not 1 <= args.port <= 65535:
            raise ServeError(f"--port {args.port} is not allowed: must be in [1, 65535]")
        settings = load_settings()
        configure_logging(getattr(logging, args.log_level.upper()))
        logger.info("malloc: %s", allocator_state())  # the engine process, forked from this one, runs on it too
        if args.kv_cache_mb is not None and not 0 < args.kv_cache_mb <= 1_048_576:
            raise ServeError(f"--kv-cache-mb {args.kv_cache_mb} is not allowed: must be in (0, 1048576]")
        settings = _with_flags(settings, args)
        for warning in setting_warnings():
            logger.warning("%s", warning)
        if (exposed := exposure_warning(settings.server.host, settings.server.api_key)) is not None:
            logger.warning("%s", exposed)
        options = engine_options(settings)
        # The graphs every step of this batcher will use are made before the engine says it is ready (each line
        # logged as it goes), so no request waits on a compiler; --no-compile starts at once, eager.
        prepare = options if settings.engine.compile_steps else None
        config = EngineConfig(settings.model, settings.tokenizer, settings.engine, prepare=prepare)
        exit_when_given_up = ExitWhenGivenUp()
        service = EngineClient(config, settings.limits, on_give_up=exit_when_given_up)
        given = bool({"kv_cache_tokens", "kv_cache_mb"} & settings.batching.model_fields_set)
        options, pool_line = serving_pool(options, service.info.geometry, given, available_memory_bytes())
        logger.info("%s", pool_line)
    except (ServeError, SettingsError, ModelLoadError, ValueError) as exc:
        print(f"serve: error: {exc}", file=sys.stderr)
        return 2
    if not settings.engine.compile_steps:
        logger.info("compiled steps are off: every step runs eager")
    warm_up(service, options)
    gateway = Gateway(service, options, settings.limits.max_queue_total)
    app = create_app(gateway, api_config(settings, service, options))
    port = args.port or settings.server.port or DEFAULT_PORT
    logger.info("serving %s on http://%s:%d/v1", service.info.name, settings.server.host, port)
    served = uvicorn.Config(
        app,
        host=settings.server.host,
        port=port,
        log_level=args.log_level,
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_EXIT_S,
    )
    try:
        return exit_when_given_up.serve(StoppingServer(served, service))
    finally:
        gateway.close()
        service.close()
