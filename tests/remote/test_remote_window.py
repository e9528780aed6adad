"""A server's figures over one window (a rate of a sweep) from its telemetry readings, and a fleet's replicas read
from a router's own list: on hand-made readings and the two list shapes the routers answer (checked against
vllm-router 0.1.17 and sglang-router 0.3.2)."""

from __future__ import annotations

import pytest

from batching.remote.fleet import replica_name, worker_urls
from batching.remote.telemetry import Telemetry
from batching.remote.window import load_shares, window_figures


def test_gauges_are_the_mean_and_peak_during_the_window_and_counters_the_move_from_before_to_after() -> None:
    before = Telemetry("vLLM", running=0, waiting=0, cache_usage=0.0, preemptions=3, finished=10)
    during = [
        Telemetry("vLLM", running=2, waiting=0, cache_usage=0.1, preemptions=3, finished=10),
        Telemetry("vLLM", running=4, waiting=3, cache_usage=0.5, preemptions=4, finished=12),
    ]
    after = Telemetry("vLLM", running=0, waiting=0, cache_usage=0.0, preemptions=5, finished=18)
    figures = window_figures(during, before, after)
    assert (figures.engine, figures.readings) == ("vLLM", 2)
    assert (figures.running_mean, figures.running_peak, figures.waiting_mean, figures.waiting_peak) == (3, 4, 1.5, 3)
    assert figures.cache_usage_mean == pytest.approx(0.3) and figures.cache_usage_peak == 0.5
    assert (figures.preemptions, figures.finished) == (2, 8)


def test_what_a_server_does_not_report_stays_none_never_zero() -> None:
    during = [Telemetry("TGI", running=1, waiting=2), Telemetry("TGI", running=3, waiting=0)]
    figures = window_figures(during, Telemetry("TGI", 0, 0), Telemetry("TGI", 0, 0))
    assert figures.running_peak == 3 and figures.waiting_mean == 1
    assert figures.cache_usage_mean is None and figures.cache_usage_peak is None
    assert figures.preemptions is None and figures.finished is None
    nothing = window_figures([], None, None)
    assert nothing.readings == 0 and nothing.engine is None and nothing.running_mean is None


def test_a_counter_with_no_sample_before_its_first_request_counts_from_zero() -> None:
    # ours labels request_success_total by finish reason: no sample at all until a request has finished
    figures = window_figures(
        [Telemetry("Batchscope", 1, 0)], Telemetry("Batchscope", 0, 0), Telemetry("Batchscope", 0, 0, finished=6)
    )
    assert figures.finished == 6


def test_load_shares_say_how_evenly_requests_were_spread_or_none_when_a_replica_does_not_count() -> None:
    assert load_shares({"a:1": 30.0, "b:2": 10.0}) == {"a:1": 0.75, "b:2": 0.25}
    assert load_shares({"a:1": 30.0, "b:2": None}) is None
    assert load_shares({"a:1": 0.0, "b:2": 0.0}) is None


def test_a_routers_worker_list_is_read_in_both_shapes_the_routers_answer() -> None:
    listed = {"workers": [{"url": "http://127.0.0.1:8001", "is_healthy": True}, {"url": "http://127.0.0.1:8002"}]}
    assert worker_urls(listed) == ("http://127.0.0.1:8001", "http://127.0.0.1:8002")  # GET /workers
    assert worker_urls({"urls": ["http://10.0.0.5:8000"]}) == ("http://10.0.0.5:8000",)  # vllm-router /list_workers
    assert worker_urls({"status": "ok"}) is None and worker_urls(["http://x"]) is None
    assert replica_name("http://10.0.0.5:8000") == "10.0.0.5:8000"
