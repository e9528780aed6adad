"""The load sweep's figures on hand-made records (no clock read): vLLM's metric definitions, SLO attainment, goodput
(DistServe's: the highest rate where 90% met it, read between two swept rates), the knees, and the headline in words."""

from __future__ import annotations

import math

import numpy as np
import pytest

from batching.engine.events import FinishedEvent, TokenEvent
from batching.engine.request import FinishReason
from batching.runs import RunRecord
from utils.metrics.sweep import (
    Goodput,
    RequestTiming,
    Slo,
    SweepPoint,
    goodput,
    goodput_ratio,
    headline,
    knee,
    knees,
    points_frame,
    readable_frame,
    record_point,
    record_timings,
    servers_headline,
    sweep_point,
)

SLO = Slo(ttft_s=0.5, tpot_s=0.1)


def timing(arrival: float, chunks: list[float], tokens: int | None = None, ok: bool = True) -> RequestTiming:
    return RequestTiming(arrival, tuple(chunks), len(chunks) if tokens is None else tokens, ok)


def test_a_requests_latencies_are_vllms_ttft_from_arrival_e2e_to_the_last_chunk_tpot_without_the_first() -> None:
    one = timing(1.0, [1.3, 1.4, 1.6, 1.7])
    assert one.ttft == pytest.approx(0.3)
    assert one.e2e == pytest.approx(0.7)
    assert one.itl == pytest.approx((0.1, 0.2, 0.1))
    assert one.tpot == pytest.approx((0.7 - 0.3) / 3)  # (latency - ttft) / (output tokens - 1)


def test_tpot_counts_the_servers_tokens_when_a_chunk_carries_several() -> None:
    bundled = timing(0.0, [0.2, 0.5], tokens=4)  # two chunks, four tokens (the usage chunk's count)
    assert bundled.tpot == pytest.approx(0.3 / 3)
    assert bundled.itl == pytest.approx((0.3,))


def test_a_one_token_answer_has_no_tpot_and_meets_the_tpot_target_as_vllms_goodput_counts_it() -> None:
    single = timing(0.0, [0.2])
    assert single.tpot is None
    assert SLO.met(single)
    assert not SLO.met(timing(0.0, [0.6]))  # TTFT over 0.5 s


def test_a_request_that_failed_or_never_streamed_is_not_served_and_never_meets_the_target() -> None:
    assert not timing(0.0, [0.1, 0.2], ok=False).served
    assert not timing(0.0, []).served
    assert not SLO.met(timing(0.0, [0.1, 0.2], ok=False))


def test_the_target_needs_both_ttft_and_tpot_within_bounds() -> None:
    assert SLO.met(timing(0.0, [0.5, 0.6, 0.7]))  # bounds are inclusive
    assert not SLO.met(timing(0.0, [0.1, 0.5, 0.9]))  # TPOT 0.4 s
    with pytest.raises(ValueError, match="TTFT target"):
        Slo(0.0, 0.1)


def test_engine_records_give_each_request_its_token_times_as_chunks() -> None:
    record = RunRecord("continuous", 0.0, end=2.0)
    for index, at in enumerate([0.4, 0.5, 0.7]):
        record.add(TokenEvent("a", 10 + index, "x", index, at))
    record.add(TokenEvent("b", 11, "y", 0, 0.9))
    record.add(_finished("a", 0.1, 0.4, 0.7, 3))
    record.add(_finished("b", 0.6, 0.9, 0.9, 1, FinishReason.CANCELLED))
    a, b = record_timings(record)
    assert a.chunks == (0.4, 0.5, 0.7) and a.arrival == 0.1 and a.output_tokens == 3 and a.served
    assert not b.served  # cancelled: not a served request


def _finished(rid: str, arrival: float, first: float, end: float, tokens: int, reason=FinishReason.LENGTH):
    return FinishedEvent(rid, reason, tuple(range(tokens)), "", 4, arrival, arrival, first, end, 0)


def test_a_points_percentiles_and_throughput_match_vllms_formulas() -> None:
    rng = np.random.default_rng(7)
    timings = []
    for index in range(40):
        arrival = index * 0.1
        gaps = rng.uniform(0.01, 0.2, size=int(rng.integers(1, 9)))
        chunks = arrival + rng.uniform(0.05, 1.0) + np.concatenate([[0.0], np.cumsum(gaps)[:-1]])
        timings.append(timing(arrival, list(chunks)))
    duration = max(t.chunks[-1] for t in timings)
    point = sweep_point("continuous", 10.0, timings, duration, SLO)
    # vLLM's calculate_metrics, written out with numpy (vllm/benchmarks/serve.py).
    ttfts = [t.chunks[0] - t.arrival for t in timings]
    e2els = [t.chunks[-1] - t.arrival for t in timings]
    tpots = [
        (e - f) / (t.output_tokens - 1) for t, e, f in zip(timings, e2els, ttfts, strict=True) if t.output_tokens > 1
    ]
    all_tpots = [
        (e - f) / (t.output_tokens - 1) if t.output_tokens > 1 else 0.0
        for t, e, f in zip(timings, e2els, ttfts, strict=True)
    ]
    itls = [b - a for t in timings for a, b in zip(t.chunks, t.chunks[1:], strict=False)]
    for q in (50, 90, 99):
        assert getattr(point, f"ttft_p{q}") == pytest.approx(np.percentile(ttfts, q))
        assert getattr(point, f"tpot_p{q}") == pytest.approx(np.percentile(tpots, q))
        assert getattr(point, f"itl_p{q}") == pytest.approx(np.percentile(itls, q))
        assert getattr(point, f"e2e_p{q}") == pytest.approx(np.percentile(e2els, q))
    good = sum(f <= SLO.ttft_s and p <= SLO.tpot_s for f, p in zip(ttfts, all_tpots, strict=True))
    assert point.good == good and point.attainment == pytest.approx(good / 40)
    total = sum(t.output_tokens for t in timings)
    assert point.output_throughput == pytest.approx(total / duration)
    assert point.request_throughput == pytest.approx(40 / duration)


def test_failed_requests_count_against_attainment_and_out_of_the_latencies() -> None:
    timings = [timing(0.0, [0.1, 0.2]), timing(0.0, [0.1, 0.2]), timing(0.0, [9.0, 9.5], ok=False), timing(0.0, [])]
    point = sweep_point("static", 1.0, timings, 10.0, SLO)
    assert (point.requests, point.completed, point.failed, point.good) == (4, 2, 2, 2)
    assert point.attainment == 0.5
    assert point.ttft_p99 == pytest.approx(0.1)  # the failed one's 9 s is not a latency
    assert point.output_tokens == 4


def test_a_lane_records_point_takes_its_wall_time_as_the_duration() -> None:
    record = RunRecord("static", 0.0, end=4.0)
    for index, at in enumerate([1.0, 2.0]):
        record.add(TokenEvent("a", index, "", index, at))
    record.add(_finished("a", 0.5, 1.0, 2.0, 2))
    point = record_point("static", 2.0, record, SLO, sent=2)
    assert point.duration_s == 4.0 and point.output_throughput == 0.5
    assert point.requests == 2 and point.completed == 1  # one of the two sent never finished


def point(series: str, rate: float, good: int, requests: int = 10, ttft: float = 0.1) -> SweepPoint:
    values = {f"{m}_p{q}": ttft for m in ("ttft", "tpot", "itl", "e2e") for q in (50, 90, 99)}
    return SweepPoint(series, rate, requests, requests, 1.0, 100, good, **values)


def test_goodput_is_the_highest_rate_up_to_which_every_rate_met_the_goal() -> None:
    points = [point("continuous", r, g) for r, g in [(1, 10), (2, 9), (4, 9), (8, 8), (16, 2)]]
    found = goodput(points, "continuous")
    assert found.swept == 4 and found.rate == 4 and not found.whole_sweep  # 4/s: exactly 90%; 8/s: 80%


def test_goodput_is_where_attainment_crosses_the_goal_on_the_log_rate_axis_between_two_rates() -> None:
    points = [point("static", r, g, requests=20) for r, g in [(2, 20), (4, 19), (8, 15), (16, 3)]]
    found = goodput(points, "static")
    assert found.swept == 4  # 95% at 4/s, 75% at 8/s: the 90% crossing is a quarter of the way, in log rate
    assert found.rate == pytest.approx(4 * 2**0.25)


def test_goodput_is_the_highest_rate_that_met_the_goal_even_after_a_near_miss_below_it() -> None:
    points = [point("static", r, g) for r, g in [(1, 8), (2, 10), (4, 9), (8, 1)]]
    found = goodput(points, "static")
    assert found.swept == 4 and found.rate == 4  # 80% at 1/s does not undo 90% at 4/s


def test_goodput_is_none_when_no_rate_met_the_goal_and_a_lower_bound_when_the_highest_did() -> None:
    low = goodput([point("static", r, 5) for r in (2, 4)], "static")
    assert low.rate is None and low.swept is None and low.lowest == 2
    high = goodput([point("continuous", r, 10) for r in (2, 4)], "continuous")
    assert high.rate == 4 and high.whole_sweep


def test_the_knee_of_a_latency_curve_is_the_last_rate_before_it_takes_off() -> None:
    rates = [1, 2, 4, 8, 16, 32]
    assert knee(rates, [0.10, 0.10, 0.11, 0.12, 0.9, 2.5]) == 8
    assert knee(rates, [0.10, 0.11, 0.30, 1.5, 1.9, 2.0]) == 4  # static: it takes off early, then the queue is full


def test_a_straight_or_flat_curve_has_no_knee() -> None:
    rates = [1, 2, 4, 8, 16]
    assert knee(rates, [1, 2, 3, 4, 5]) is None  # a straight line on the chart's log-rate axis
    assert knee(rates, [0.10, 0.10, 0.11, 0.12, 0.15]) is None  # rising, but not even doubling
    assert knee([1, 2], [0.1, 5.0]) is None  # too few points
    assert knee(rates, [0.1, 0.1, 0.1, 0.1, 0.1]) is None


def test_a_throughput_curves_knee_is_where_it_stops_following_the_rate() -> None:
    rates = [1, 2, 4, 8, 16, 32]
    assert knee(rates, [10, 20, 40, 80, 85, 84], saturating=True) == 8


def test_knees_are_found_for_each_series_and_column() -> None:
    points = [point("static", r, 10, ttft=t) for r, t in [(1, 0.1), (2, 0.1), (4, 0.1), (8, 2.0)]]
    assert knees(points, ["ttft_p90"]) == {("static", "ttft_p90"): 4}


def test_the_headline_says_what_each_schedule_sustains_and_the_ratio() -> None:
    continuous, static = Goodput("continuous", 24.0, 24.0, 2.0, 64.0), Goodput("static", 6.0, 6.0, 2.0, 64.0)
    assert headline(continuous, static, SLO) == (
        "At TTFT p90 ≤ 500 ms and TPOT p90 ≤ 100 ms, continuous sustains 24 requests/s, static 6 — 4.0× the load."
    )
    assert goodput_ratio(continuous, static) == 4.0
    between = headline(Goodput("continuous", 104.2, 100, 12, 290), Goodput("static", 23.4, 17, 12, 290), SLO)
    assert between.endswith("continuous sustains 104 requests/s, static 23.4 — 4.5× the load.")


def test_the_headline_says_at_least_when_continuous_met_the_target_at_every_rate() -> None:
    text = headline(
        Goodput("continuous", 64.0, 64.0, 2.0, 64.0), Goodput("static", 8.0, 8.0, 2.0, 64.0), Slo(1.0, 0.05)
    )
    assert "TTFT p90 ≤ 1 s and TPOT p90 ≤ 50 ms" in text
    assert "continuous sustains at least 64 requests/s, static 8 — at least 8.0× the load." in text


def test_the_headline_when_static_never_met_the_target_bounds_the_ratio_from_below() -> None:
    text = headline(Goodput("continuous", 12.0, 12.0, 2.0, 32.0), Goodput("static", None, None, 2.0, 32.0), SLO)
    assert "static met it at no rate swept (not even 2 requests/s) — over 6.0× the load." in text
    assert math.isnan(
        goodput_ratio(Goodput("continuous", 12.0, 12.0, 2.0, 32.0), Goodput("static", None, None, 2.0, 32.0))
    )


def test_the_headline_when_neither_or_both_always_met_it_says_what_to_change() -> None:
    neither = headline(Goodput("continuous", None, None, 2, 8), Goodput("static", None, None, 2, 8), SLO)
    assert "neither schedule met the target" in neither and "lower rates or a looser target" in neither
    both = headline(Goodput("continuous", 8, 8, 2, 8), Goodput("static", 8, 8, 2, 8), SLO)
    assert "both schedules met the target at every rate swept" in both and "add higher rates" in both


def test_servers_side_by_side_are_named_best_first_with_the_winner_and_its_ratio() -> None:
    found = {"B": Goodput("B", 2.2, 2.0, 0.5, 8.0), "A": Goodput("A", 3.1, 3.0, 0.5, 8.0)}
    assert servers_headline(found, Slo(1.0, 0.1)) == (
        "At TTFT p90 ≤ 1 s and TPOT p90 ≤ 100 ms, A sustains 3.1 requests/s, B 2.2 — A the most, 1.4× B."
    )
    found["C"] = Goodput("C", None, None, 0.5, 8.0)
    assert servers_headline(found, SLO).endswith(
        "A sustains 3.1 requests/s, B 2.2, C met it at no rate swept — A the most, 1.4× B."
    )


def test_the_servers_headline_bounds_a_winner_that_held_everywhere_and_names_none_when_two_did() -> None:
    held, broke = Goodput("A", 8.0, 8.0, 1.0, 8.0), Goodput("B", 2.0, 2.0, 1.0, 8.0)
    assert servers_headline({"A": held, "B": broke}, SLO).endswith("A the most, at least 4.0× B.")
    both = servers_headline({"A": held, "B": Goodput("B", 8.0, 8.0, 1.0, 8.0)}, SLO)
    assert "A and B both held to the highest rate: add higher rates." in both
    lone = servers_headline({"B": Goodput("B", None, None, 1.0, 8.0)}, SLO)
    assert "no server met the target at any rate swept (not even 1 requests/s)" in lone
    assert servers_headline({"B": broke}, SLO).endswith("B sustains 2 requests/s.")


def test_the_frames_hold_every_point_with_derived_figures_and_milliseconds_for_reading() -> None:
    points = [point("static", 2.0, 9), point("continuous", 2.0, 10)]
    frame = points_frame(points)
    assert list(frame["series"]) == ["continuous", "static"]
    assert {"attainment", "output_throughput", "ttft_p90", "failed"} <= set(frame.columns)
    readable = readable_frame(points)
    assert readable.loc[0, "TTFT p90 (ms)"] == 100.0 and readable.loc[0, "met the target"] == "90%"
