"""The one `/metrics` reader on real pages (tests/remote/data/README.md): each sample by its name with its labels,
summed over label sets or split by one, `_created` stamps left out, and text that is not Prometheus' refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from batching.remote.prometheus import parse_page

VLLM = (Path(__file__).parent / "data" / "vllm-0.32-cpu-this-machine.prom").read_text(encoding="utf-8")


def test_a_counter_with_a_label_per_finish_reason_is_summed_or_split_by_it() -> None:
    page = parse_page(VLLM)
    reasons = page.by_label("vllm:request_success_total", "finished_reason")
    assert reasons == {"stop": 0.0, "length": 1.0, "abort": 0.0, "error": 0.0, "repetition": 0.0}
    assert page.total("vllm:request_success_total") == 1.0
    assert page.total("vllm:iteration_tokens_total_count") == 16.0  # the histogram's count: one per engine step


def test_what_a_page_lacks_is_none_or_empty_and_created_stamps_are_left_out() -> None:
    page = parse_page(VLLM)
    assert page.total("vllm:no_such_metric") is None and page.values("vllm:no_such_metric") == []
    assert page.by_label("vllm:num_requests_running", "finished_reason") == {}  # no sample has that label
    assert not [name for name in page.names() if name.endswith("_created")]


def test_a_page_that_is_not_prometheus_text_is_refused() -> None:
    with pytest.raises(ValueError):
        parse_page("<html><body>Not Found</body></html>")
