"""Start the API: `python -m batching.serve` (its own engine), or `start_background` inside another process that
already runs the shared engine (the Streamlit page, when `BATCHSCOPE_SERVER__PORT` is set).
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

import uvicorn

from batching.engine.events import FinishedEvent
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams, SamplingParams
from batching.serve.app import ApiConfig, create_app
from batching.serve.gateway import Gateway
from batching.service import EngineClient, EngineConfig, engine_options
from config.settings import Settings, SettingsError, load_settings, setting_warnings
from model.loader import ModelLoadError
from utils.log_setup import configure_logging

logger = logging.getLogger(__name__)
DEFAULT_PORT = 8000


class ServeError(Exception):
    """Bad flags: one line on stderr, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ServeError(message)


def api_config(settings: Settings, model_name: str) -> ApiConfig:
    """What absent request fields default to: the settings' generation defaults."""
    gen = settings.generation
    sampling = SamplingParams(gen.do_sample, gen.temperature, gen.top_k, gen.top_p, gen.repetition_penalty, gen.seed)
    return ApiConfig(
        model_id=settings.server.served_model_name or model_name,
        default_max_tokens=gen.max_new_tokens,
        default_sampling=sampling,
        api_key=settings.server.api_key,
    )


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
    gateway = Gateway(service, engine_options(settings), settings.limits.max_queue_total)
    app = create_app(gateway, service.tokenizer, api_config(settings, service.info.name))
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
    parser = _Parser(prog="python -m batching.serve", description="Serve the engine over an OpenAI-compatible API.")
    parser.add_argument("--host", help="default: BATCHSCOPE_SERVER__HOST (127.0.0.1)")
    parser.add_argument("--port", type=int, help=f"default: BATCHSCOPE_SERVER__PORT, else {DEFAULT_PORT}")
    parser.add_argument("--model", help="builtin, a hub id or a local folder (default: settings)")
    parser.add_argument("--api-key", help="require this bearer key (default: BATCHSCOPE_SERVER__API_KEY)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.port is not None and not 1 <= args.port <= 65535:
            raise ServeError(f"--port {args.port} is not allowed: must be in [1, 65535]")
        settings = load_settings()
        configure_logging(getattr(logging, args.log_level.upper()))
        model_settings = settings.model.model_copy(update={"name_or_path": args.model} if args.model else {})
        server = settings.server.model_copy(
            update={k: v for k, v in {"host": args.host, "api_key": args.api_key}.items() if v is not None}
        )
        settings = settings.model_copy(update={"model": model_settings, "server": server})
        for warning in setting_warnings():
            logger.warning("%s", warning)
        options = engine_options(settings)
        service = EngineClient(EngineConfig(settings.model, settings.tokenizer, settings.engine), settings.limits)
    except (ServeError, SettingsError, ModelLoadError, ValueError) as exc:
        print(f"serve: error: {exc}", file=sys.stderr)
        return 2
    warm_up(service, options)
    gateway = Gateway(service, options, settings.limits.max_queue_total)
    app = create_app(gateway, service.tokenizer, api_config(settings, service.info.name))
    port = args.port or settings.server.port or DEFAULT_PORT
    logger.info("serving %s on http://%s:%d/v1", service.info.name, settings.server.host, port)
    try:
        uvicorn.run(app, host=settings.server.host, port=port, log_level=args.log_level, access_log=False)
    finally:
        gateway.close()
        service.close()
    return 0
