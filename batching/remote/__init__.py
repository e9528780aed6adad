"""Watch a real serving engine: runs of the page's queue on any OpenAI-compatible server, timed from the client,
next to the server's own telemetry (vLLM, SGLang, TGI, llama.cpp, transformers serve, ours)."""

from batching.remote.dispatch import MODES, SAMPLE_EVERY_S, UNKNOWN_TOKEN, Mode, RemoteRun, RemoteSubmitted, RunSetup
from batching.remote.endpoint import Endpoint, RemoteError, endpoint_from_settings, fetch_model, parse_url
from batching.remote.poller import TelemetryPoller
from batching.remote.stream import APIS, Api
from batching.remote.telemetry import ENGINES, Telemetry, TelemetrySample, parse_metrics, parse_slots
from batching.remote.warmup import WARM_UP_QUESTION, WARM_UP_TOKENS, WarmUp, warm_up

__all__ = [
    "APIS",
    "ENGINES",
    "MODES",
    "SAMPLE_EVERY_S",
    "UNKNOWN_TOKEN",
    "WARM_UP_QUESTION",
    "WARM_UP_TOKENS",
    "Api",
    "Endpoint",
    "Mode",
    "RemoteError",
    "RemoteRun",
    "RemoteSubmitted",
    "RunSetup",
    "Telemetry",
    "TelemetryPoller",
    "TelemetrySample",
    "WarmUp",
    "endpoint_from_settings",
    "fetch_model",
    "parse_metrics",
    "parse_slots",
    "parse_url",
    "warm_up",
]
