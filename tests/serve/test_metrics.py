"""The API's Prometheus counters of engine steps, by how each ran (`batchscope:engine_steps_total{path}`)."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from batching.engine.events import StepEvent
from batching.serve.metrics import ApiMetrics
from batching.service import BatcherLoad


def test_engine_steps_are_counted_by_how_they_ran_every_path_listed_from_the_start() -> None:
    metrics = ApiMetrics(lambda: BatcherLoad(running=1, waiting=0, slots=8, kv_tokens=0, kv_capacity=1024))

    def by_path() -> dict[str, float]:
        families = text_string_to_metric_families(generate_latest(metrics.registry).decode())
        samples = [sample for family in families for sample in family.samples]
        return {s.labels["path"]: s.value for s in samples if s.name == "batchscope:engine_steps_total"}

    assert by_path() == {"eager": 0, "compiled": 0, "direct": 0}
    for index, path in enumerate(["eager", "compiled", "compiled", "direct", "direct", "direct"]):
        metrics.observe_step(StepEvent(index, index, index + 1, ("a",), 0, 1, path=path))
    assert by_path() == {"eager": 1, "compiled": 2, "direct": 3}


def test_engine_restarts_are_read_by_cause_when_scraped() -> None:
    restarts = {"exited": 0, "unresponsive": 0, "hung": 0}
    metrics = ApiMetrics(
        lambda: BatcherLoad(running=0, waiting=0, slots=8, kv_tokens=0, kv_capacity=1024), restarts.copy
    )

    def by_cause() -> dict[str, float]:
        families = text_string_to_metric_families(generate_latest(metrics.registry).decode())
        samples = [sample for family in families for sample in family.samples]
        return {s.labels["cause"]: s.value for s in samples if s.name == "batchscope:engine_restarts_total"}

    assert by_cause() == {"exited": 0, "unresponsive": 0, "hung": 0}
    restarts["exited"] += 2
    restarts["unresponsive"] += 1
    assert by_cause() == {"exited": 2, "unresponsive": 1, "hung": 0}
