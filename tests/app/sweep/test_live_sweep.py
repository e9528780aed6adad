"""The page's sweep (`app.sweep.live_sweep.LiveSweep`) driving the real engine process on the tiny model: one private
race per rate, one after the other; both lanes' points at every rate; the progress over the whole sweep; Stop leaving
the running rate out; a newer follower taking over. Counts and order of events, never speed."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from app.sweep.live_sweep import LiveSweep, SweepRace
from batching.arrivals import Schedule
from batching.engine.batcher import BatcherOptions
from batching.engine.params import RequestParams
from batching.service import EngineClient, EngineConfig
from batching.sweep import SweepSpec, auto_rates, format_rates
from config.settings import EngineSettings, LimitSettings, ModelSettings, TokenizerSettings
from tests.engine.helpers import random_prompts
from utils.metrics.sweep import Slo

OPTIONS = BatcherOptions(max_batch_size=2, max_batched_tokens=64, step_detail=False)
CAPS = [3, 9, 2, 7, 4]


@pytest.fixture(scope="module")
def client(tiny_model_dirs) -> Iterator[EngineClient]:
    config = EngineConfig(
        ModelSettings(name_or_path=str(tiny_model_dirs["qwen2"]), device="cpu", dtype="float32"),
        TokenizerSettings(),
        EngineSettings(compile_steps=False),
    )
    made = EngineClient(config, LimitSettings())
    yield made
    made.close()


class Starts:
    """Starts each rate's race on the engine, and keeps the order of starts and closes it saw."""

    def __init__(self, client: EngineClient, items: list, cpu_clock: bool = True) -> None:
        self.client = client
        self.items = items
        self.cpu_clock = cpu_clock
        self.log: list[str] = []

    def __call__(self, index: int, schedule: Schedule) -> SweepRace:
        self.log.append(f"start {index}")
        handle = self.client.private.start_race(OPTIONS, self.items, schedule, cpu_clock=self.cpu_clock)
        starts = self

        class Logged:
            def poll(self, timeout: float = 0.0):
                return handle.poll(timeout)

            def stop(self) -> None:
                handle.stop()

            def close(self) -> None:
                starts.log.append(f"close {index}")
                handle.close()

        return Logged()


def sweep_of(client: EngineClient, rates: tuple[float, ...], requests: int = 6) -> tuple[LiveSweep, Starts]:
    prompts = random_prompts(len(CAPS), vocab=300, seed=5, longest=10)
    mix = [(prompt, RequestParams(cap, ignore_eos=True)) for prompt, cap in zip(prompts, CAPS, strict=True)]
    spec = SweepSpec(rates, requests, seed=2)
    items = [(prompt, params, f"s/{number}") for number, (prompt, params) in enumerate(spec.mix(mix), start=1)]
    starts = Starts(client, items)
    return LiveSweep(spec, Slo(5.0, 5.0), OPTIONS.max_batch_size, starts), starts


def follow_to_the_end(sweep: LiveSweep, limit: int = 20_000) -> list[float]:
    """Tick until the sweep is over; the progress read after each tick."""
    follower = sweep.follow()
    seen = []
    for _ in range(limit):
        tick = sweep.tick(follower, 0.05)
        seen.append(sweep.progress())
        if tick.done:
            return seen
    raise AssertionError("the sweep did not end")


def test_a_sweep_races_every_rate_in_turn_and_keeps_both_lanes_points(client: EngineClient) -> None:
    sweep, starts = sweep_of(client, (2.0, 20.0, 200.0))
    sweep.begin()
    progress = follow_to_the_end(sweep)
    assert sweep.completed and sweep.error is None
    # One race at a time: each rate's race closed before the next one started.
    assert starts.log == ["start 0", "close 0", "start 1", "close 1", "start 2", "close 2"]
    assert [(p.series, p.rate) for p in sweep.points] == [
        (mode, rate) for rate in (2.0, 20.0, 200.0) for mode in ("continuous", "static")
    ]
    expected_tokens = sum(sweep.spec.mix(CAPS))
    for point in sweep.points:
        assert (point.requests, point.completed, point.good) == (6, 6, 6)
        assert point.output_tokens == expected_tokens
    for rate, lanes in sweep.records.items():
        for mode, record in lanes.items():
            arrivals = sorted(event.arrival - record.start for event in record.finished)
            assert arrivals == pytest.approx(sorted(sweep.spec.schedule(rate).due), abs=1e-6), (rate, mode)
            assert record.end == max(step.end for step in record.steps)
    assert progress == sorted(progress) and progress[-1] == 1.0  # the bar only moves forward, to the end
    assert sweep.requests_done() == sweep.spec.total_requests == 36
    assert re.fullmatch(r"Done: 3 of 3 rates swept, 6 requests each in \d+ s\.", sweep.progress_line())
    assert set(sweep.steps.values()) == {"eager steps"}
    assert sweep.lane_clock == "cpu"  # a CPU model on one torch thread: the lanes counted the engine thread's CPU


def test_lanes_count_wall_time_unless_the_sweep_asks_for_cpu_time(client: EngineClient) -> None:
    sweep, starts = sweep_of(client, (100.0,), requests=3)
    starts.cpu_clock = False
    sweep.begin()
    follow_to_the_end(sweep)
    assert sweep.completed and sweep.lane_clock == "wall"


def test_auto_rates_come_from_a_first_race_of_every_request_at_once(client: EngineClient) -> None:
    sweep, starts = sweep_of(client, (), requests=5)
    sweep.begin()
    assert sweep.calibrating and sweep.progress_line().startswith("Picking the rates: every request at once")
    progress = follow_to_the_end(sweep)
    assert sweep.completed and set(sweep.capacities) == {"continuous", "static"}
    rates = sweep.spec.rates
    assert rates == auto_rates(sweep.capacities["static"], sweep.capacities["continuous"])
    assert starts.log[:2] == ["start -1", "close -1"]  # the calibration race, then each rate in order
    assert starts.log[2:] == [f"{verb} {index}" for index in range(len(rates)) for verb in ("start", "close")]
    assert [p.rate for p in sweep.points] == [rate for rate in rates for _ in ("continuous", "static")]
    assert list(sweep.records) == list(rates)  # the calibration race is no point of the sweep
    assert progress == sorted(progress) and progress[-1] == 1.0
    assert sweep.requests_done() == (len(rates) + 1) * 5 * 2
    line = sweep.rates_line()
    assert line is not None and line.startswith(f"Rates picked for this machine: {format_rates(rates)} requests/s")


def test_stop_leaves_the_running_rate_out_and_keeps_the_rates_done(client: EngineClient) -> None:
    sweep, starts = sweep_of(client, (50.0, 100.0, 200.0), requests=10)
    sweep.begin()
    follower = sweep.follow()
    while not sweep.records:  # the first rate, to its end
        sweep.tick(follower, 0.05)
    sweep.stop()  # the second rate has started: it is cancelled on both lanes
    follow_to_the_end(sweep)
    assert sweep.stopped and sweep.done and not sweep.completed
    assert list(sweep.records) == [50.0]
    assert [p.rate for p in sweep.points] == [50.0, 50.0]
    assert starts.log == ["start 0", "close 0", "start 1", "close 1"]  # the third rate never started
    assert re.fullmatch(r"Stopped: 1 of 3 rates swept, 10 requests each in \d+ s\.", sweep.progress_line())


def test_a_newer_follower_takes_the_sweep_over_and_the_older_one_stops(client: EngineClient) -> None:
    sweep, _ = sweep_of(client, (100.0,), requests=4)
    sweep.begin()
    older = sweep.follow()
    newer = sweep.follow()
    assert sweep.tick(older, 0.0).superseded
    while not sweep.tick(newer, 0.05).done:
        pass
    assert sweep.completed


def test_a_mix_the_engine_refuses_starts_nothing(client: EngineClient) -> None:
    spec = SweepSpec((2.0,), requests=2)
    items = [("hello", RequestParams(10_000), f"s/{n}") for n in (1, 2)]  # a cap beyond the context
    sweep = LiveSweep(spec, Slo(1.0, 1.0), 2, Starts(client, items))
    with pytest.raises(ValueError, match="max_new_tokens"):
        sweep.begin()
