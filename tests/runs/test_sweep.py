"""The sweep's plan (rates, requests per rate, seeded arrivals, the mix cycled) and one rate run in this process on the
tiny model: each lane answers every request once, in the schedule's order of arrival, on its own clock."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from batching.arrivals import TIMED
from batching.engine.batcher import Batcher, BatcherOptions
from batching.engine.builder import RequestBuilder
from batching.engine.events import FinishedEvent, TokenEvent
from batching.engine.params import RequestParams
from batching.engine.request import FinishReason
from batching.race import LaneStep
from batching.runs import CPU, WALL, LaneClock, RunRecord, StepClock
from batching.sweep import SweepSpec, auto_rates, capacity, format_rates, parse_rates, run_rate
from config.settings import ModelSettings
from model.loader import LoadedModel, load_model
from utils.metrics.sweep import Slo, record_point

CAPS = [2, 12, 3, 10, 2, 14]


def test_rates_are_parsed_sorted_and_deduplicated() -> None:
    assert parse_rates("8, 2 4,2") == (2.0, 4.0, 8.0)
    assert format_rates((2.0, 0.5, 16.0)) == "2, 0.5, 16"
    assert parse_rates(" Auto ") == () and format_rates(()) == "auto"  # picked for the machine


def test_auto_rates_span_from_below_the_lower_capacity_to_far_above_the_higher_in_even_log_steps() -> None:
    rates = auto_rates(8.0, 20.0)
    assert rates == (3.2, 4.6, 6.5, 9.4, 13.0, 19.0, 27.0, 39.0, 56.0, 80.0)  # 0.4 x 8 to 4 x 20
    assert auto_rates(20.0, 11.0, 8.0) == rates  # servers' capacities: from the lowest to the highest
    with pytest.raises(ValueError, match="served nothing"):
        auto_rates(float("nan"), 0.0)


def test_capacity_is_requests_finished_per_second_of_the_runs_clock() -> None:
    record = RunRecord("static", 1.0, end=5.0)
    for index in range(6):
        record.add(FinishedEvent(f"r{index}", FinishReason.LENGTH, (1,), "", 2, 1.0, 1.0, 2.0, 3.0, 0))
    assert capacity(record) == 1.5


@pytest.mark.parametrize(
    ("text", "message"),
    [("", "at least one"), ("2, fast", "'fast' is not a number"), ("0", "above 0"), ("inf", "above 0")],
)
def test_a_bad_rate_list_is_refused_naming_the_bad_part(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_rates(text)


def test_a_spec_without_rates_is_auto_and_counts_its_calibration_race_in_its_total() -> None:
    assert SweepSpec((), requests=4).auto and SweepSpec((), requests=4).total_requests == 11 * 4 * 2


def test_a_spec_refuses_unsorted_rates_and_requests_out_of_range() -> None:
    with pytest.raises(ValueError, match="ascending"):
        SweepSpec((4.0, 2.0))
    with pytest.raises(ValueError, match="requests=0"):
        SweepSpec((2.0,), requests=0)


def test_every_rate_gets_the_same_seeded_arrivals_closer_together() -> None:
    spec = SweepSpec((2.0, 8.0), requests=6, seed=3)
    slow, fast = spec.schedule(2.0), spec.schedule(8.0)
    assert slow.kind == TIMED and len(slow) == 6 and slow.due[0] == 0.0
    assert fast.due == pytest.approx(tuple(due / 4 for due in slow.due))  # same draws, a quarter of the gaps
    assert SweepSpec((2.0,), requests=6, seed=4).schedule(2.0).due != slow.due


def test_the_mix_is_cycled_to_the_requests_per_rate() -> None:
    assert SweepSpec((1.0,), requests=5).mix(["a", "b"]) == ["a", "b", "a", "b", "a"]
    with pytest.raises(ValueError, match="empty"):
        SweepSpec((1.0,), requests=5).mix([])
    assert SweepSpec((1.0, 2.0, 3.0), requests=5).total_requests == 30


def test_a_step_clock_counts_what_its_source_reads_while_it_runs_and_jumps_idle_gaps() -> None:
    readings = iter([10.0, 13.0, 13.0, 50.0, 51.5, 51.5])
    clock = StepClock(start=0.0, source=LaneClock("fake", lambda: next(readings)))
    clock.resume()  # reads 10
    assert clock() == 3.0  # reads 13: 3 s of the source since resume
    clock.pause()  # reads 13
    clock.sleep(2.0)  # an idle gap: jumped, not counted by the source
    clock.resume()  # reads 50 (whatever the source did meanwhile is not the lane's)
    assert clock() == 6.5  # 3 + 2 + 1.5
    assert CPU.read is time.thread_time and WALL.read is time.perf_counter


@pytest.fixture(scope="module")
def tiny(tiny_model_dirs: dict[str, Path]) -> LoadedModel:
    return load_model(ModelSettings(name_or_path=str(tiny_model_dirs["llama"]), device="cpu", dtype="float32"))


def test_one_rate_runs_both_lanes_on_the_same_arrivals_each_answering_every_request_once(tiny: LoadedModel) -> None:
    builder = RequestBuilder(tiny.tokenizer, 256, 200)
    requests = [
        builder.build([5 + i, 6, 7, 8 + i], RequestParams(cap, ignore_eos=True), f"r/{i}") for i, cap in enumerate(CAPS)
    ]
    spec = SweepSpec((50.0,), requests=len(requests), seed=1)
    schedule = spec.schedule(50.0)

    def make(mode: str, clock: StepClock) -> Batcher:
        return Batcher(tiny.model, tiny.tokenizer, BatcherOptions(max_batch_size=2, max_batched_tokens=64), mode, clock)

    steps: list[LaneStep] = []
    records = run_rate(make, requests, schedule, steps.append, CPU)
    assert set(records) == {"continuous", "static"}
    for mode, record in records.items():
        finished = {event.request_id: event for event in record.finished}
        assert sorted(finished) == sorted(r.request_id for r in requests), mode  # each once
        assert {rid: event.output_tokens for rid, event in finished.items()} == {
            r.request_id: r.max_new_tokens for r in requests
        }
        # Each request arrived at its scheduled time on this lane's clock (which started at 0).
        arrivals = {event.request_id: event.arrival - record.start for event in finished.values()}
        assert [arrivals[f"r/{i}"] for i in range(len(CAPS))] == pytest.approx(list(schedule.due), abs=1e-6)
        for event in finished.values():
            tokens = [t for t in record.tokens if t.request_id == event.request_id]
            assert [t.index for t in tokens] == list(range(event.output_tokens))  # in order, each once
            assert event.arrival <= tokens[0].time == event.first_token <= tokens[-1].time <= event.finished
        assert record.end == record.steps[-1].end  # the lane's wall time ends with its last step
        point = record_point(mode, 50.0, record, Slo(10.0, 10.0), spec.requests)
        assert (point.requests, point.completed, point.good) == (6, 6, 6)
        assert point.output_tokens == sum(CAPS)
    # The lanes ran in turn: what the hook saw is every lane's events, step by step.
    seen = [event for step in steps for event in step.events if isinstance(event, FinishedEvent | TokenEvent)]
    assert len(seen) == 2 * (len(CAPS) + sum(CAPS))
    assert {step.mode for step in steps} == {"continuous", "static"}
