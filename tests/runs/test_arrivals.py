"""The arrival driver submits each request when its step or time comes, between engine steps."""

from __future__ import annotations

from pathlib import Path

import pytest

from batching.arrivals import AT_ONCE, PER_STEP, TIMED, ArrivalDriver, Schedule
from batching.bench.workloads import Workload, WorkloadRequest
from batching.engine.batcher import Batcher
from batching.engine.events import StepEvent
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams
from batching.runs import drive
from config.settings import ModelSettings
from model.loader import load_model


class FakeClock:
    """A clock that only moves when the driver sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_poisson_arrivals_are_reproducible_from_the_seed() -> None:
    first = Schedule.poisson(50, rate_per_s=4.0, seed=3)
    assert first == Schedule.poisson(50, rate_per_s=4.0, seed=3)
    assert first.due != Schedule.poisson(50, rate_per_s=4.0, seed=4).due
    assert first.kind == TIMED
    assert first.due[0] == 0.0
    assert list(first.due) == sorted(first.due)


def test_poisson_gaps_average_one_over_the_rate() -> None:
    schedule = Schedule.poisson(4001, rate_per_s=8.0, seed=0)
    assert schedule.due[-1] / 4000 == pytest.approx(1 / 8, rel=0.05)


def test_a_rate_must_be_positive() -> None:
    with pytest.raises(ValueError, match="rate"):
        Schedule.poisson(3, rate_per_s=0.0)


def _workload(**arrivals: list) -> Workload:
    count = len(next(iter(arrivals.values()))) if arrivals else 3
    rows = [{key: values[i] for key, values in arrivals.items()} for i in range(count)]
    return Workload("w", tuple(WorkloadRequest(prompt="p", max_new_tokens=2, **row) for row in rows))


def test_the_workload_decides_the_kind_unless_a_rate_is_given() -> None:
    assert _workload().schedule().kind == AT_ONCE
    steps = _workload(arrival_step=[0, None, 4]).schedule()
    assert (steps.kind, steps.due) == (PER_STEP, (0.0, 0.0, 4.0))
    times = _workload(arrival_s=[0.5, None]).schedule()
    assert (times.kind, times.due) == (TIMED, (0.5, 0.0))
    assert _workload(arrival_step=[1, 2]).schedule(rate_per_s=2.0, seed=1) == Schedule.poisson(2, 2.0, 1)


def test_timed_arrivals_are_submitted_once_their_time_has_passed() -> None:
    clock, submitted, arrivals = FakeClock(), [], {}

    def submit(index: int, arrival: float) -> None:
        submitted.append(index)
        arrivals[index] = arrival

    driver = ArrivalDriver(Schedule.timed([0.0, 0.3, 0.1]), submit, clock=clock, sleep=clock.sleep)
    driver.start()
    assert driver.release(0) == 1
    clock.now += 0.15
    driver.release(0)
    assert submitted == [0, 2]
    assert driver.wait_idle() == 1  # the engine is idle: sleep until the last one is due
    assert clock.slept == [pytest.approx(0.15)]
    assert submitted == [0, 2, 1]
    assert driver.done
    # Each request arrived at its scheduled time, even if it was submitted later (between steps).
    assert arrivals == {0: 100.0, 1: pytest.approx(100.3), 2: pytest.approx(100.1)}


def test_per_step_arrivals_wait_for_their_step_but_an_idle_engine_does_not_wait() -> None:
    submitted: list[int] = []
    driver = ArrivalDriver(Schedule.per_step([0, 2, 2, 9]), lambda index, _: submitted.append(index))
    driver.release(0)
    driver.release(1)
    assert submitted == [0]
    driver.release(2)
    assert submitted == [0, 1, 2]
    driver.wait_idle()  # nothing runs, so step 9 would never come: submit now
    assert submitted == [0, 1, 2, 3]


@pytest.fixture(scope="module")
def tiny_llama(tiny_model_dirs: dict[str, Path]):
    return load_model(ModelSettings(name_or_path=str(tiny_model_dirs["llama"]), device="cpu", dtype="float32"))


def test_a_request_due_before_step_k_joins_the_batch_at_step_k(tiny_llama) -> None:
    batcher = Batcher(tiny_llama.model, tiny_llama.tokenizer, BatcherOptions(max_batch_size=4))
    arrival_steps = [0, 1, 3, 3]

    def submit(index: int, _: float) -> None:
        batcher.add([5 + index, 6, 7], RequestParams(6, ignore_eos=True), request_id=f"q{index}")

    events = list(drive(batcher, ArrivalDriver(Schedule.per_step(arrival_steps), submit)))
    steps = [event for event in events if isinstance(event, StepEvent)]
    joined = {}
    for step in steps:
        for request_id in step.slots:
            if request_id is not None:
                joined.setdefault(request_id, step.index)
    assert [joined[f"q{index}"] for index in range(4)] == arrival_steps


def test_drive_sleeps_through_a_gap_with_nothing_to_do(tiny_llama) -> None:
    batcher = Batcher(tiny_llama.model, tiny_llama.tokenizer, BatcherOptions(max_batch_size=2))
    submitted_at = []

    def submit(index: int, _: float) -> None:
        submitted_at.append(driver.clock() - driver.started)
        batcher.add([9, 10], RequestParams(1, ignore_eos=True), request_id=f"q{index}")

    driver = ArrivalDriver(Schedule.timed([0.0, 0.2]), submit)
    events = list(drive(batcher, driver))
    assert submitted_at[1] >= 0.2
    assert sum(1 for event in events if isinstance(event, StepEvent)) == 2


def test_an_arrival_added_after_the_start_is_timed_whatever_the_kind() -> None:
    clock, submitted = FakeClock(), []
    driver = ArrivalDriver(
        Schedule.at_once(1), lambda index, _: submitted.append(index), clock=clock, sleep=clock.sleep
    )
    driver.start()
    driver.release(0)
    driver.add_at(0.5, lambda arrival: submitted.append(("late", arrival)))
    assert not driver.done
    clock.now += 0.2
    assert driver.release(7) == 0  # steps do not count for it: only its time does
    assert driver.wait_idle() == 1  # idle: jump to it
    assert clock.slept == [pytest.approx(0.3)]
    assert submitted == [0, ("late", pytest.approx(100.5))]
    assert driver.done and driver.submitted == 2


def test_a_late_arrival_before_the_next_scheduled_one_goes_first_and_drop_pending_forgets_both() -> None:
    clock, submitted = FakeClock(), []
    driver = ArrivalDriver(
        Schedule.timed([0.0, 1.0]), lambda index, _: submitted.append(index), clock=clock, sleep=clock.sleep
    )
    driver.start()
    driver.release(0)
    driver.add_at(0.4, lambda _: submitted.append("late"))
    driver.wait_idle()
    assert submitted == [0, "late"]
    driver.add_at(2.0, lambda _: submitted.append("later"))
    assert driver.drop_pending() == 2  # request 1 and "later"
    assert driver.done and driver.wait_idle() == 0
    with pytest.raises(ValueError, match="must be >= 0"):
        driver.add_at(-1.0, lambda _: None)
