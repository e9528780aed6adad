"""A serving engine's own telemetry, read into one shape: requests running, waiting, KV-cache use, preemptions, and
requests finished (the count a fleet's spread is read from).

Each engine names these differently (the table below, checked against real samples in tests/remote/data/); what an
engine does not expose stays None and the page says "not reported" rather than guessing. The Prometheus page is
read by the one `/metrics` reader (`prometheus.py`); llama.cpp's `/slots` JSON is read for its busy slots.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from batching.remote.prometheus import MetricsPage, parse_page


@dataclass(frozen=True)
class EngineNames:
    """Which metric names (first present wins) give each figure for one engine; sums over label sets (engines,
    data-parallel ranks), except the cache fraction, which is their mean."""

    engine: str
    prefix: str
    running: tuple[str, ...]
    waiting: tuple[str, ...]
    cache_usage: tuple[str, ...] = ()
    preemptions: tuple[str, ...] = ()
    finished: tuple[str, ...] = ()


ENGINES: tuple[EngineNames, ...] = (
    EngineNames(
        "vLLM",
        "vllm:",
        ("vllm:num_requests_running",),
        ("vllm:num_requests_waiting",),
        ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),  # the second is vLLM's name before 0.10
        ("vllm:num_preemptions_total",),
        ("vllm:request_success_total",),
    ),
    EngineNames(
        "SGLang",
        "sglang:",
        ("sglang:num_running_reqs",),
        ("sglang:num_queue_reqs",),
        ("sglang:token_usage",),
        finished=("sglang:e2e_request_latency_seconds_count",),  # its latency histogram's count: one per request
    ),
    EngineNames("TGI", "tgi_", ("tgi_batch_current_size",), ("tgi_queue_size",)),
    EngineNames(
        "llama.cpp",
        "llamacpp:",
        ("llamacpp:requests_processing",),
        ("llamacpp:requests_deferred",),
        ("llamacpp:kv_cache_usage_ratio",),  # dropped by later llama.cpp releases
    ),
    EngineNames(
        "Batchscope",
        "batchscope:",
        ("batchscope:num_requests_running",),
        ("batchscope:num_requests_waiting",),
        ("batchscope:kv_cache_usage_perc",),
        ("batchscope:num_preemptions_total",),
        ("batchscope:request_success_total",),
    ),
)
FIGURES = ("running", "waiting", "cache_usage", "preemptions")


@dataclass(frozen=True)
class Telemetry:
    """One reading of a server: which engine it looked like, and each figure (None: not reported)."""

    engine: str | None
    running: float | None = None
    waiting: float | None = None
    cache_usage: float | None = None  # 0 to 1
    preemptions: float | None = None  # cumulative since the server started
    finished: float | None = None  # requests finished, cumulative since the server started
    slots_busy: int | None = None  # llama.cpp `/slots`
    slots_total: int | None = None

    def reported(self) -> dict[str, bool]:
        return {name: getattr(self, name) is not None for name in FIGURES}


@dataclass(frozen=True)
class TelemetrySample:
    """A reading taken `time` (perf_counter) by the poller."""

    time: float
    telemetry: Telemetry


def parse_metrics(text: str) -> Telemetry:
    """A Prometheus `/metrics` page's text read into `Telemetry` (`telemetry_of`).

    Raises ValueError when the text is not Prometheus' format (Prometheus' parser's message)."""
    return telemetry_of(parse_page(text))


def telemetry_of(page: MetricsPage) -> Telemetry:
    """A `/metrics` page as `Telemetry`; the engine is the first in ENGINES with a figure there."""
    for names in ENGINES:
        if not any(name.startswith(names.prefix) for name in page.names()):
            continue
        return Telemetry(
            names.engine,
            running=_first(page, names.running, sum),
            waiting=_first(page, names.waiting, sum),
            cache_usage=_first(page, names.cache_usage, _mean),
            preemptions=_first(page, names.preemptions, sum),
            finished=_first(page, names.finished, sum),
        )
    return Telemetry(None)


def parse_slots(slots: object) -> tuple[int, int]:
    """llama.cpp's `/slots` answer: (slots processing a request, slots). ValueError if it is not that list."""
    if not isinstance(slots, list) or not all(isinstance(slot, dict) and "is_processing" in slot for slot in slots):
        raise ValueError("not a llama.cpp /slots answer: expected a list of slots with is_processing")
    return sum(1 for slot in slots if slot["is_processing"]), len(slots)


def with_slots(telemetry: Telemetry, busy: int, total: int) -> Telemetry:
    """Add llama.cpp's slot counts; they also stand for `running` when `/metrics` gave none (it is off by default)."""
    running = telemetry.running if telemetry.running is not None else float(busy)
    engine = telemetry.engine or "llama.cpp"
    return replace(telemetry, engine=engine, running=running, slots_busy=busy, slots_total=total)


def _first(page: MetricsPage, names: Sequence[str], combine: Callable[[list[float]], float]) -> float | None:
    for name in names:
        if values := page.values(name):
            return float(combine(values))
    return None


def _mean(values: Iterable[float]) -> float:
    items = list(values)
    return sum(items) / len(items)
