"""The page's view of a race folds both lanes' real steps into per-lane answers, progress and charts' records."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from app.common.live_run import CURSOR
from app.common.streaming import shown
from app.race.lanes import RaceRun
from app.race.stream import RaceStream
from batching.arrivals import Schedule
from batching.engine.batcher import Batcher
from batching.engine.builder import RequestBuilder
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams
from batching.race import LaneStep, Race
from batching.runs import StepClock
from batching.service.messages import RaceEnded
from config.settings import ModelSettings
from model.loader import LoadedModel, load_model

CAPS = [2, 9, 3, 7, 4]


@pytest.fixture(scope="module")
def tiny(tiny_model_dirs: dict[str, Path]) -> LoadedModel:
    return load_model(ModelSettings(name_or_path=str(tiny_model_dirs["llama"]), device="cpu", dtype="float32"))


class InProcessRace:
    """A real race stepped in this process, polled the way the page polls the engine's: a few steps per poll."""

    def __init__(self, race: Race, steps_per_poll: int = 3) -> None:
        self.race = race
        self.steps_per_poll = steps_per_poll
        self.polls = 0

    def poll(self, timeout: float = 0.0) -> list[LaneStep | RaceEnded]:
        self.polls += 1
        messages: list[LaneStep | RaceEnded] = []
        for _ in range(self.steps_per_poll):
            step = self.race.step()
            if step is not None:
                messages.append(step)
            if self.race.done:
                walls = tuple((m, lane.run.record.start, lane.run.record.end) for m, lane in self.race.lanes.items())
                messages.append(RaceEnded("r", walls))
                break
        return messages


def start(tiny: LoadedModel) -> tuple[RaceRun, InProcessRace]:
    view = RaceRun("r/", slots=2)
    for index, cap in enumerate(CAPS):
        view.plan(f"prompt {index}", f"Q: prompt {index}\nA:", cap, 0.0)
    builder = RequestBuilder(tiny.tokenizer, 256, 200)
    requests = [
        builder.build(prompt, RequestParams(params.max_new_tokens, ignore_eos=True), rid)
        for prompt, params, rid in view.items()
    ]

    def make(mode: str, clock: StepClock) -> Batcher:
        return Batcher(tiny.model, tiny.tokenizer, BatcherOptions(max_batch_size=2), mode=mode, clock=clock)

    return view, InProcessRace(Race(make, requests, Schedule.at_once(len(requests))))


def test_a_race_view_follows_both_lanes_to_the_end(tiny: LoadedModel) -> None:
    view, source = start(tiny)
    assert [rid for _, _, rid in view.items()] == [f"r/{n}" for n in range(1, 6)]
    stream = RaceStream(view, source, text_every_s=0.0, chart_every_s=0.0)
    seen_running = set()
    while not (redraw := stream.tick()).done:
        for mode, index, drawn in redraw.answers:
            assert view.lanes[mode].views[index] is drawn
            if drawn.status == "running":
                seen_running.add(mode)
        line = view.progress_line()
        assert line.startswith("**running**") and "continuous:" in line and "static:" in line
    assert seen_running == {"continuous", "static"}
    assert view.done and view.completed
    for mode, lane in view.lanes.items():
        assert [v.finished.output_tokens for v in lane.views] == CAPS, mode
        assert lane.record.end == pytest.approx(lane.record.steps[-1].end)
        assert view.elapsed[mode] == lane.record.end
    assert view.speedup() == pytest.approx(view.lanes["static"].record.wall_s / view.lanes["continuous"].record.wall_s)
    assert view.progress_line().startswith("**finished** · continuous: 5 of 5 done")
    assert set(view.latency_frame("static")["request"]) == {f"#{n}" for n in range(1, 6)}


def test_a_stopped_race_is_not_fit_for_a_speedup_and_an_engine_failure_ends_it_with_the_message(
    tiny: LoadedModel,
) -> None:
    view, source = start(tiny)
    stream = RaceStream(view, source, text_every_s=0.0)
    stream.tick()
    view.stop()
    source.race.stop()
    while not stream.tick().done:
        pass
    assert view.stopped and not view.completed

    class DeadEngine:
        def poll(self, timeout: float = 0.0) -> list:
            raise RuntimeError("the engine stopped (killed); it is being restarted: try again in a moment")

    failed, _ = start(tiny)
    assert RaceStream(failed, DeadEngine()).tick().done
    assert failed.error and "engine stopped" in failed.error
    assert all(v.refused and "engine stopped" in v.refused for lane in failed.lanes.values() for v in lane.views)


class HeldPoll:
    """The race's source, whose next poll waits until the test lets it go (a script run caught mid-poll)."""

    def __init__(self, source: InProcessRace) -> None:
        self.source = source
        self.entered = threading.Event()
        self.release = threading.Event()
        self.hold_next = False

    @property
    def polls(self) -> int:
        return self.source.polls

    def poll(self, timeout: float = 0.0) -> list[LaneStep | RaceEnded]:
        if self.hold_next:
            self.hold_next = False
            self.entered.set()
            assert self.release.wait(30)
        return self.source.poll(timeout)


def test_a_newer_script_run_takes_the_race_over_once_the_older_one_has_folded_and_draws_every_change(
    tiny: LoadedModel,
) -> None:
    """Streamlit's fast reruns: a click starts a new script run while the old one still polls. The old one's fold
    ends before the new one snapshots what it draws, and the old one then stops without polling again; otherwise
    an answer finished by the old fold after the new run drew it would keep its cursor."""
    view, inner = start(tiny)
    source = HeldPoll(inner)
    old = RaceStream(view, source, text_every_s=0.0)
    old.tick()
    assert any(v.status == "running" for lane in view.lanes.values() for v in lane.views)

    source.hold_next = True
    old_tick = threading.Thread(target=old.tick)
    old_tick.start()
    assert source.entered.wait(30)
    made: list[RaceStream] = []
    new_run = threading.Thread(target=lambda: made.append(RaceStream(view, source, text_every_s=0.0)))
    new_run.start()
    new_run.join(0.3)
    assert new_run.is_alive(), "the new script run took the race while the old one was folding"
    source.release.set()
    old_tick.join(30)
    new_run.join(30)
    (new,) = made
    folded = inner.polls

    # The page draws every card as it is now, then streams the changes.
    drawn = {(mode, v.number): shown(v) for mode, lane in view.lanes.items() for v in lane.views}
    assert old.tick().superseded and inner.polls == folded  # the old run stops without taking any step
    while not (redraw := new.tick()).done:
        drawn.update({(mode, v.number): shown(v) for mode, _, v in redraw.answers})
    drawn.update({(mode, v.number): shown(v) for mode, _, v in redraw.answers})
    assert view.completed
    for mode, lane in view.lanes.items():
        for v in lane.views:
            assert drawn[(mode, v.number)] == shown(v) and CURSOR not in drawn[(mode, v.number)][1]
