"""A race in the engine process: both lanes stream, a prompt added mid-race joins both, Stop cancels both, slow
motion slows the steps but not the clocks, and a race nobody watches is closed."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from batching.arrivals import Schedule
from batching.engine.events import FinishedEvent, StepEvent, TokenEvent
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams
from batching.engine.request import FinishReason
from batching.race import LaneStep
from batching.service import EngineClient, EngineConfig, RaceHandle
from batching.service.messages import RaceEnded
from config.settings import EngineSettings, LimitSettings, ModelSettings, TokenizerSettings
from tests.engine.helpers import random_prompts

OPTIONS = BatcherOptions(max_batch_size=4, max_batched_tokens=64)
SESSION_TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def client(tiny_model_dirs) -> Iterator[EngineClient]:
    config = EngineConfig(
        ModelSettings(name_or_path=str(tiny_model_dirs["qwen2"]), device="cpu", dtype="float32"),
        TokenizerSettings(),
        EngineSettings(session_timeout_s=SESSION_TIMEOUT_S, compile_steps=False),
    )
    made = EngineClient(config, LimitSettings())
    yield made
    made.close()


def items(count: int, first: int = 0) -> list:
    prompts = random_prompts(count, vocab=300, seed=11 + first, longest=12)
    caps = [3, 20, 4, 18, 3, 16, 5, 4, 22, 3]
    return [(p, RequestParams(caps[i % len(caps)], ignore_eos=True), f"x/{first + i}") for i, p in enumerate(prompts)]


def follow(race: RaceHandle, until_s: float = 60.0) -> tuple[dict[str, list[LaneStep]], RaceEnded]:
    """Every lane step until the race ends."""
    lanes: dict[str, list[LaneStep]] = {"continuous": [], "static": []}
    deadline = time.monotonic() + until_s
    while time.monotonic() < deadline:
        for message in race.poll(timeout=0.05):
            if isinstance(message, RaceEnded):
                return lanes, message
            lanes[message.mode].append(message)
    raise AssertionError("the race did not end")


def events_of(steps: list[LaneStep], kind: type) -> list:
    return [event for step in steps for event in step.events if isinstance(event, kind)]


def test_both_lanes_stream_while_the_race_runs_and_answer_everything_alike(client: EngineClient) -> None:
    queue = items(10)
    race = client.private.start_race(OPTIONS, queue, Schedule.at_once(len(queue)))
    try:
        lanes, ended = follow(race)
    finally:
        race.close()
    assert ended.error is None
    finished = {mode: {e.request_id: e for e in events_of(steps, FinishedEvent)} for mode, steps in lanes.items()}
    for mode in lanes:
        assert {rid: e.output_tokens for rid, e in finished[mode].items()} == {
            rid: params.max_new_tokens for _, params, rid in queue
        }, mode
    assert {r: e.output_ids for r, e in finished["continuous"].items()} == {
        r: e.output_ids for r, e in finished["static"].items()
    }
    # Tokens of both lanes were streamed before either lane finished: they ran in turn, not one after the other.
    order = [(step.mode, bool(events_of([step], TokenEvent))) for steps in lanes.values() for step in steps]
    assert any(mode == "static" and tokens for mode, tokens in order)
    first_static = next(i for i, step in enumerate(lanes["static"]) if events_of([step], TokenEvent))
    assert lanes["static"][first_static].elapsed < lanes["continuous"][-1].elapsed
    # Each lane's clock covers its own steps (and, with every request due at once, nothing to wait for); continuous
    # needs fewer steps than static's waves, whatever this machine's speed.
    walls = {mode: end - start for mode, start, end in ended.walls}
    for mode, steps in lanes.items():
        assert walls[mode] >= sum(s.end - s.start for s in events_of(steps, StepEvent))
    assert len(events_of(lanes["continuous"], StepEvent)) < len(events_of(lanes["static"], StepEvent))


def test_a_prompt_added_mid_race_joins_both_lanes_and_stop_cancels_both(client: EngineClient) -> None:
    queue = [(prompt, RequestParams(200, ignore_eos=True), rid) for prompt, _, rid in items(8)]
    # Slow motion keeps the lanes busy long enough (an idle lane would jump straight to the 30 s arrivals).
    race = client.private.start_race(OPTIONS, queue, Schedule.timed([0.0] * 6 + [30.0, 30.0]), pause_s=0.01)
    try:
        while not any(isinstance(m, LaneStep) and m.elapsed > 0 for m in race.poll(timeout=0.05)):
            pass
        race.add([9, 10, 11], RequestParams(6, ignore_eos=True), "x/late")
        time.sleep(0.3)
        race.stop()
        lanes, ended = follow(race)
    finally:
        race.close()
    assert ended.error is None
    for mode, steps in lanes.items():
        finished = {e.request_id: e for e in events_of(steps, FinishedEvent)}
        assert "x/6" not in finished and "x/7" not in finished, mode  # due at 30 s: never arrived
        assert "x/late" in finished, mode  # it arrived before Stop (or was cancelled waiting), on each lane
        assert any(e.reason is FinishReason.CANCELLED for e in finished.values()), mode


def test_slow_motion_slows_the_steps_but_not_the_clocks(client: EngineClient) -> None:
    queue = items(6)
    results = {}
    for pause in (0.0, 0.03, 0.0):
        race = client.private.start_race(OPTIONS, queue, Schedule.at_once(len(queue)), pause_s=pause)
        started = time.monotonic()
        try:
            lanes, ended = follow(race)
        finally:
            race.close()
        real = time.monotonic() - started
        steps = sum(len(events_of(s, StepEvent)) for s in lanes.values())
        walls = {mode: end - start for mode, start, end in ended.walls}
        results.setdefault(pause, []).append((real, steps, walls))
    real, steps, walls = results[0.03][0]
    assert real >= 0.03 * (steps - 1)
    fastest = min(r[2]["continuous"] + r[2]["static"] for r in results[0.0])
    paused = 0.03 * (steps - 1)
    # The pauses are on neither clock: counted, they would add `paused` (about 10x the clocks) to the sum.
    assert walls["continuous"] + walls["static"] < fastest + paused / 2


def test_a_race_nobody_polls_is_closed_and_adding_to_an_ended_race_fails_that_prompt(client: EngineClient) -> None:
    queue = items(2)
    race = client.private.start_race(OPTIONS, queue, Schedule.timed([0.0, 300.0]))
    deadline = time.monotonic() + SESSION_TIMEOUT_S + 5
    while race.race_id in client.router.races and time.monotonic() < deadline:
        time.sleep(0.1)
    assert race.race_id not in client.router.races
    deadline = time.monotonic() + 5
    while client.lifecycle.stats.private and time.monotonic() < deadline:  # the engine dropped its lanes too
        time.sleep(0.05)
    assert client.lifecycle.stats.private == 0
    ended_race = client.private.start_race(OPTIONS, items(1), Schedule.at_once(1))
    follow(ended_race)
    ended_race.add([5, 6], RequestParams(2), "x/too-late")
    deadline = time.monotonic() + 10
    failed: list[FinishedEvent] = []
    while len(failed) < 2 and time.monotonic() < deadline:
        for message in ended_race.poll(timeout=0.05):
            if isinstance(message, LaneStep):
                failed += events_of([message], FinishedEvent)
    ended_race.close()
    assert [e.reason for e in failed] == [FinishReason.ERROR, FinishReason.ERROR]
    assert "already ended" in (failed[0].error or "")


def test_bad_race_input_is_refused_before_anything_starts(client: EngineClient) -> None:
    with pytest.raises(ValueError, match="one per request"):
        client.private.start_race(OPTIONS, items(2), Schedule.at_once(3))
    with pytest.raises(ValueError, match="pause=5"):
        client.private.start_race(OPTIONS, items(2), Schedule.at_once(2), pause_s=5)
    with pytest.raises(ValueError, match="max_new_tokens"):
        client.private.start_race(OPTIONS, [([5, 6], RequestParams(0), "x/0")], Schedule.at_once(1))
