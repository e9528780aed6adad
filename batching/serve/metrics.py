"""Prometheus metrics with vLLM's names (under `batchscope:`), so dashboards and load generators read them as is.

Gauges (running, waiting, KV-cache use, slot occupancy) are read from the engine when scraped and cover everyone
using it, browser tabs included; so do the KV counters (preemptions, prefix-cache queries and hits), read from every
step's memory view, and the steps by how they ran (`engine_steps_total{path}`: eager, compiled, direct). Latency
histograms and the request counters cover the requests served through this API. The engine's restarts, by cause
(`engine_restarts_total{cause}`: exited, unresponsive, hung), are read from its client when scraped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from batching.engine.events import FinishedEvent, MemoryView, StepEvent, StepPath, WaitReason
from batching.engine.request import FinishReason
from batching.service import BatcherLoad

PREFIX = "batchscope:"
# OpenAI's and vLLM's finish reasons: a stop string and EOS are both "stop"; a cancelled request is "abort".
FINISH_REASONS = {
    FinishReason.EOS: "stop",
    FinishReason.STOP: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.CANCELLED: "abort",
    FinishReason.ERROR: "error",
}
_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)
_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


class _LoadCollector(Collector):
    def __init__(self, read: Callable[[], BatcherLoad]) -> None:
        self.read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        load = self.read()
        yield GaugeMetricFamily(PREFIX + "num_requests_running", "Requests in a slot of the engine.", load.running)
        yield GaugeMetricFamily(PREFIX + "num_requests_waiting", "Requests waiting for a slot.", load.waiting)
        yield GaugeMetricFamily(
            PREFIX + "kv_cache_usage_perc", "KV-cache usage, 0 to 1: blocks held by requests / the pool.", load.kv_usage
        )
        occupancy = load.running / load.slots if load.slots else 0.0
        yield GaugeMetricFamily(PREFIX + "slot_occupancy", "Busy slots / slots, 0 to 1.", occupancy)


class _RestartCollector(Collector):
    def __init__(self, read: Callable[[], Mapping[str, int]]) -> None:
        self.read = read

    def collect(self) -> Iterator[CounterMetricFamily]:
        restarts = CounterMetricFamily(
            PREFIX + "engine_restarts", "Engine processes restarted by the server, by cause.", labels=["cause"]
        )
        for cause, count in self.read().items():
            restarts.add_metric([cause], count)
        yield restarts


class ApiMetrics:
    """One registry per server: the engine's gauges and restarts plus what this API observed of its own requests."""

    def __init__(
        self, read_load: Callable[[], BatcherLoad], read_restarts: Callable[[], Mapping[str, int]] = dict
    ) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_LoadCollector(read_load))
        self.registry.register(_RestartCollector(read_restarts))

        def histogram(name: str, doc: str, buckets: tuple[float, ...] = _LATENCY_BUCKETS) -> Histogram:
            return Histogram(PREFIX + name, doc, buckets=buckets, registry=self.registry)

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(PREFIX + name, doc, labels, registry=self.registry)

        self.ttft = histogram("time_to_first_token_seconds", "Time to first token, from arrival.")
        self.itl = histogram("inter_token_latency_seconds", "Time between two tokens of one request.")
        self.e2e = histogram("e2e_request_latency_seconds", "From arrival to the last token.")
        self.queue = histogram("request_queue_time_seconds", "From arrival to a slot.")
        self.iteration_tokens = histogram(
            "iteration_tokens_total", "Tokens (prompt + decode) one engine step computed.", _TOKEN_BUCKETS
        )
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of finished requests.")
        self.generation_tokens = counter(
            "generation_tokens",
            "Tokens generated, counted as each is (a request that failed or was cancelled counts what it generated).",
        )
        self.success = counter("request_success", "Finished requests by reason.", ("finished_reason",))
        self.preemptions = counter("num_preemptions", "Cumulative number of preemptions from the engine.")
        self.prefix_queries = counter(
            "prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        )
        self.prefix_hits = counter("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        self.waiting = counter(
            "waiting_request_steps",
            "Steps requests in the batcher spent computing nothing, by why the scheduler left them out (one per "
            "request per step).",
            ("reason",),
        )
        for reason in WaitReason:  # every reason listed from the start, at 0
            self.waiting.labels(reason=reason.name.lower())
        self.steps = counter(
            "engine_steps",
            "Engine steps of the API's batcher by how they ran: eager, through a compiled graph (torch.compile's "
            "entry), or its graph called directly.",
            ("path",),
        )
        for path in get_args(StepPath):  # every path listed from the start, at 0
            self.steps.labels(path=path)
        self._kv_counters = (self.preemptions, self.prefix_queries, self.prefix_hits)
        self._last_totals = (0, 0, 0)  # the batcher's running totals at its previous step

    def observe_step(self, step: StepEvent) -> None:
        self.iteration_tokens.observe(step.prefill_tokens + step.decode_tokens)
        self.steps.labels(path=step.path).inc()
        for waiting in step.waiting:
            self.waiting.labels(reason=waiting.reason.name.lower()).inc()
        if step.memory is not None:
            self._observe_memory(step.memory)

    def _observe_memory(self, memory: MemoryView) -> None:
        """The counters move by what the batcher's running totals moved since its previous step; totals that went
        down mean a new batcher (the engine restarted), whose totals so far all count."""
        totals = (memory.preemptions, memory.prefix_queries, memory.prefix_hits)
        before = self._last_totals
        if any(now < then for now, then in zip(totals, before, strict=True)):
            before = (0, 0, 0)
        for counter, now, then in zip(self._kv_counters, totals, before, strict=True):
            counter.inc(now - then)
        self._last_totals = totals

    def observe_token_gap(self, seconds: float) -> None:
        self.itl.observe(seconds)

    def observe_finished(self, event: FinishedEvent) -> None:
        self.success.labels(finished_reason=FINISH_REASONS[event.reason]).inc()
        self.prompt_tokens.inc(event.prompt_tokens)
        self.e2e.observe(event.e2e_s)
        if event.ttft_s is not None:
            self.ttft.observe(event.ttft_s)
        if event.queue_s is not None:
            self.queue.observe(event.queue_s)
