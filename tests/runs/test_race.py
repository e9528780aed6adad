"""A race steps a continuous and a static lane in turn, always the one behind, each on a clock of its own."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from batching.arrivals import Schedule
from batching.engine.batcher import Batcher
from batching.engine.builder import RequestBuilder
from batching.engine.events import FinishedEvent, StepEvent
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams
from batching.engine.request import FinishReason
from batching.race import Race, check_pause
from batching.runs import StepClock
from config.settings import ModelSettings
from model.loader import LoadedModel, load_model

CAPS = [2, 14, 3, 12, 2, 16, 4, 3]


@pytest.fixture(scope="module")
def tiny(tiny_model_dirs: dict[str, Path]) -> LoadedModel:
    return load_model(ModelSettings(name_or_path=str(tiny_model_dirs["llama"]), device="cpu", dtype="float32"))


def _race(tiny: LoadedModel, schedule: Schedule | None = None, pause_s: float = 0.0) -> Race:
    builder = RequestBuilder(tiny.tokenizer, 256, 200)
    requests = [
        builder.build([5 + i, 6, 7, 8 + i], RequestParams(cap, ignore_eos=True), f"r/{i + 1}")
        for i, cap in enumerate(CAPS)
    ]

    def make(mode: str, clock: StepClock) -> Batcher:
        options = BatcherOptions(max_batch_size=3, max_batched_tokens=64)
        return Batcher(tiny.model, tiny.tokenizer, options, mode=mode, clock=clock)

    return Race(make, requests, schedule or Schedule.at_once(len(requests)), pause_s)


def _run(race: Race) -> dict[str, list]:
    """Step the race to its end as the engine loop does: holding each step until slow motion allows it."""
    seen: dict[str, list] = {mode: [] for mode in race.lanes}
    while True:
        time.sleep(race.wait_s())
        lane_step = race.step()
        if lane_step is None:
            return seen
        seen[lane_step.mode].extend(lane_step.events)


def test_each_lane_answers_every_request_the_same_and_continuous_finishes_first(tiny: LoadedModel) -> None:
    race = _race(tiny)
    seen = _run(race)
    outputs = {}
    for mode, events in seen.items():
        finished = {e.request_id: e for e in events if isinstance(e, FinishedEvent)}
        assert len(finished) == len(CAPS)
        assert [finished[f"r/{i + 1}"].output_tokens for i in range(len(CAPS))] == CAPS
        outputs[mode] = {rid: e.output_ids for rid, e in finished.items()}
    assert outputs["continuous"] == outputs["static"]  # the same computation, scheduled differently
    records = {mode: lane.run.record for mode, lane in race.lanes.items()}
    assert len(records["continuous"].steps) < len(records["static"].steps)  # fewer steps, whatever the speed


def test_the_loop_always_steps_the_lane_that_is_behind_so_the_clocks_stay_one_step_apart(tiny: LoadedModel) -> None:
    race = _race(tiny)
    longest_step = 0.0
    while True:
        before = {mode: lane.elapsed for mode, lane in race.lanes.items() if not lane.finished}
        lane_step = race.step()
        if lane_step is None:
            break
        assert before[lane_step.mode] == min(before.values())
        steps = [e for e in lane_step.events if isinstance(e, StepEvent)]
        longest_step = max([longest_step, *(s.end - s.start for s in steps)])
        if len(before) == 2 and not lane_step.finished:
            gap = abs(race.lanes["continuous"].elapsed - race.lanes["static"].elapsed)
            assert gap <= 2 * longest_step + 0.005


def test_a_lane_clock_is_its_step_times_plus_its_idle_jumps_and_slow_motion_is_not_counted(tiny: LoadedModel) -> None:
    schedule = Schedule.timed([0.0, 0.0, 0.0, 2.0, 2.0, 4.0, 4.0, 4.0])
    race = _race(tiny, schedule, pause_s=0.01)
    started = time.perf_counter()
    _run(race)
    wall = time.perf_counter() - started
    for lane in race.lanes.values():
        record = lane.run.record
        arrivals = sorted(event.arrival - record.start for event in record.finished)
        assert arrivals == pytest.approx(list(schedule.due), abs=0.005)  # the same arrival times on each clock
        stepping = sum(step.end - step.start for step in record.steps)
        assert lane.clock.slept > 0  # it waited for the 2 s and 4 s arrivals by jumping, not sleeping
        # The clock covers the steps and the jumps; the pauses between steps (10 ms each) are not on it: counted,
        # they would add 10 ms a step, far more than the bookkeeping between two steps' events.
        assert stepping + lane.clock.slept <= record.wall_s < stepping + lane.clock.slept + 0.005 * len(record.steps)
    steps = sum(len(lane.run.record.steps) for lane in race.lanes.values())
    assert wall >= 0.01 * (steps - 1)  # the loop honoured slow motion between steps
    fresh = _race(tiny, pause_s=0.5)
    assert fresh.wait_s() == 0.0
    fresh.step()
    assert 0.4 < fresh.wait_s() <= 0.5  # a step holds the next one for the pause


def test_a_request_added_mid_race_arrives_on_both_lanes_at_the_same_clock_time(tiny: LoadedModel) -> None:
    race = _race(tiny)
    for _ in range(9):
        race.step()
    builder = RequestBuilder(tiny.tokenizer, 256, 200)
    at_s = race.add(builder.build([40, 41, 42], RequestParams(5, ignore_eos=True), "r/late"))
    assert at_s == pytest.approx(max(lane.elapsed for lane in race.lanes.values()))
    seen = _run(race)
    for mode, lane in race.lanes.items():
        late = next(e for e in seen[mode] if isinstance(e, FinishedEvent) and e.request_id == "r/late")
        assert late.output_tokens == 5
        assert late.arrival - lane.run.record.start == pytest.approx(at_s)


def test_stop_cancels_both_lanes_and_drops_what_has_not_arrived(tiny: LoadedModel) -> None:
    race = _race(tiny, Schedule.timed([0.0] * 4 + [50.0] * 4))
    for _ in range(4):
        race.step()
    race.stop()
    seen = _run(race)
    assert race.done
    for events in seen.values():
        reasons = {e.request_id: e.reason for e in events if isinstance(e, FinishedEvent)}
        assert "r/8" not in reasons  # never arrived
        assert FinishReason.CANCELLED in reasons.values()


def test_lanes_run_their_own_copies_of_each_request_and_bad_input_is_refused(tiny: LoadedModel) -> None:
    race = _race(tiny)
    _run(race)
    continuous, static = (race.lanes[mode].run.requests for mode in ("continuous", "static"))
    assert continuous.keys() == static.keys()
    assert all(continuous[rid] is not static[rid] for rid in continuous)
    with pytest.raises(ValueError, match="one per request"):
        Race(lambda mode, clock: pytest.fail("no batcher for a bad race"), [continuous["r/1"]], Schedule.at_once(2))
    with pytest.raises(ValueError, match="pause=2"):
        check_pause(2)
