"""The page's streaming loop without Streamlit: prompts submitted when due, events folded, redraws throttled.

Runs on the real shared engine (a tiny random Llama); only the loop's clock is stepped by hand where the test is
about timing, so the figures do not depend on how busy the machine is.
"""

from __future__ import annotations

import time

import pytest

from app.common.live_run import CURSOR, LiveRun
from app.common.prompt_queue import PromptQueue
from app.common.streaming import CHART_COST_FACTOR, Redraw, RunStream, join_new_items
from batching.engine.options import BatcherOptions
from batching.engine.params import SamplingParams
from batching.engine.request import FinishReason
from batching.service import EngineClient, EngineConfig
from config.settings import EngineSettings, LimitSettings, ModelSettings, TokenizerSettings
from tests.engine.helpers import loaded


@pytest.fixture(scope="module")
def llama(tiny_model_dirs):
    return loaded(str(tiny_model_dirs["llama"]))


@pytest.fixture(scope="module")
def client(tiny_model_dirs):
    """The real engine process on the tiny llama, as the page uses it."""
    config = EngineConfig(
        ModelSettings(name_or_path=str(tiny_model_dirs["llama"]), device="cpu", dtype="float32"),
        TokenizerSettings(),
        EngineSettings(compile_steps=False),
    )
    made = EngineClient(config, LimitSettings(max_queue_per_session=8, max_queue_total=8))
    yield made
    made.close()


@pytest.fixture
def session(client):
    opened = client.open_session(BatcherOptions(max_batch_size=2, max_batched_tokens=64))
    yield opened
    opened.close()


class SteppedClock:
    """A clock the test moves forward by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def new_run(session, start: float, caps: list[int], offsets: list[float] | None = None) -> LiveRun:
    run = LiveRun(start, session.session_id + "/", 2, SamplingParams())
    for number, (cap, offset) in enumerate(zip(caps, offsets or [0.0] * len(caps), strict=True), start=1):
        run.plan(f"q{number}", f"Q: question {number}\nA:", cap, offset)
    return run


def run_to_end(stream: RunStream, limit_s: float = 60.0) -> list[Redraw]:
    redraws, deadline = [], time.monotonic() + limit_s
    while time.monotonic() < deadline:
        redraws.append(stream.tick())
        if redraws[-1].done:
            return redraws
    raise AssertionError("the run did not finish")


def test_a_stream_submits_every_prompt_and_ends_with_each_final_answer_drawn(session) -> None:
    run = new_run(session, time.perf_counter(), [3, 5, 2])
    redraws = run_to_end(RunStream(run, session, compare=False))
    assert run.completed and [view.finished.output_tokens for view in run.views] == [3, 5, 2]
    last_drawn = {}
    for redraw in redraws:
        for index, view in redraw.answers:
            last_drawn[index] = (view.status_line(), view.shown_text())
    # The last thing drawn for each card is its final state: the answer without a cursor, and its latency.
    assert set(last_drawn) == {0, 1, 2}
    for index, view in enumerate(run.views):
        status, text = last_drawn[index]
        assert status.startswith("done") and "latency" in status
        assert text == view.answer and CURSOR not in text
    assert redraws[-1].done and redraws[-1].progress and redraws[-1].live_charts


def test_a_prompt_is_submitted_only_when_its_arrival_time_comes(session) -> None:
    clock = SteppedClock()
    run = new_run(session, clock.now, [2, 2], offsets=[0.0, 5.0])
    stream = RunStream(run, session, compare=False, clock=clock)
    stream.tick()
    assert run.views[0].request_id is not None and run.views[1].status == "scheduled"
    clock.now += 4.9
    stream.tick()
    assert run.views[1].status == "scheduled"
    clock.now += 0.1
    stream.tick()
    assert run.views[1].request_id == session.session_id + "/2"


def test_a_prompt_the_engine_refuses_ends_with_the_engines_message(session) -> None:
    run = new_run(session, time.perf_counter(), [2, 100_000])
    run_to_end(RunStream(run, session, compare=False))
    assert run.views[0].finished.reason == FinishReason.LENGTH
    assert run.views[1].status == "refused" and "max_new_tokens" in run.views[1].refused
    assert run.views[1].status_line().startswith("not run: ")


def test_answers_are_redrawn_only_when_changed_and_at_most_once_per_interval(session) -> None:
    clock = SteppedClock()
    run = new_run(session, clock.now, [2, 2], offsets=[60.0, 60.0])  # both stay scheduled: nothing changes
    stream = RunStream(run, session, compare=False, clock=clock, text_every_s=0.125)
    assert stream.tick().answers == []  # the page drew every card already; nothing changed since
    run.views[0].refused = "stopped before it was sent"  # a change, but within the same interval
    assert stream.tick().answers == []
    assert stream.pause() == 0.125
    clock.now += 0.125
    assert [index for index, _ in stream.tick().answers] == [0]
    clock.now += 0.125
    assert stream.tick().answers == []  # drawn once; unchanged since


def test_charts_wait_in_proportion_to_what_drawing_them_cost(session) -> None:
    clock = SteppedClock()
    run = new_run(session, clock.now, [2], offsets=[60.0])
    stream = RunStream(run, session, compare=False, clock=clock, chart_every_s=0.5)
    first = stream.tick()
    assert first.progress and first.live_charts
    drawn_at = clock.now
    clock.now += 0.25  # drawing the charts took 0.25 s: the next redraw waits 4 x 0.25 s from when it started
    stream.charts_drawn(drawn_at)
    clock.now = drawn_at + CHART_COST_FACTOR * 0.25 - 0.125
    assert not stream.tick().progress
    clock.now = drawn_at + CHART_COST_FACTOR * 0.25
    assert stream.tick().progress
    stream.charts_drawn(clock.now)  # a cheap draw: the floor is the chart interval
    clock.now += 0.375
    assert not stream.tick().progress
    clock.now += 0.125
    assert stream.tick().progress


@pytest.mark.parametrize("compare", [True, False])
def test_the_last_live_charts_are_skipped_only_when_the_comparison_follows(session, compare: bool) -> None:
    run = new_run(session, time.perf_counter(), [2])
    last = run_to_end(RunStream(run, session, compare=compare))[-1]
    assert last.done and last.progress
    assert last.live_charts is not compare


def test_the_live_charts_are_drawn_at_the_end_of_a_stopped_run_even_with_the_comparison_on(session) -> None:
    run = new_run(session, time.perf_counter(), [2, 2], offsets=[0.0, 60.0])
    stream = RunStream(run, session, compare=True)
    assert not stream.tick().done
    run.stop()  # the second prompt is dropped before it was sent: no comparison follows
    last = run_to_end(stream)[-1]
    assert last.done and not run.completed and last.live_charts


def test_queue_items_added_mid_run_join_it_once_at_the_moment_they_were_seen() -> None:
    queue = PromptQueue(max_items=8, max_cap=50)
    first = queue.add("first", 4)
    run = LiveRun(100.0, "s1/", 2)
    run.plan(first.prompt, "F:first", first.max_new_tokens, 0.0)
    joined = {first.item_id}
    queue.add("second", 6)
    views = join_new_items(run, queue.items, joined, lambda prompt: f"F:{prompt}", now=102.5)
    assert [(v.number, v.prompt, v.formatted, v.max_new_tokens, v.offset_s) for v in views] == [
        (2, "second", "F:second", 6, 2.5)
    ]
    assert join_new_items(run, queue.items, joined, lambda prompt: prompt, now=103.0) == []
    assert len(run.views) == 2


class CountedSession:
    """The real session, counting the polls and submissions made through it."""

    def __init__(self, session) -> None:
        self.session = session
        self.polls = 0
        self.submitted = 0

    def submit(self, prompt, params):
        self.submitted += 1
        return self.session.submit(prompt, params)

    def poll(self, timeout: float = 0.0):
        self.polls += 1
        return self.session.poll(timeout)


def test_a_newer_script_runs_stream_takes_the_run_over_and_the_older_one_neither_polls_nor_submits(session) -> None:
    """Streamlit's fast reruns leave the old script run going until its next Streamlit call: it must not take
    events or send prompts the new one would then never see."""
    clock = SteppedClock()
    counted = CountedSession(session)
    run = new_run(session, clock.now, [3, 4, 2], offsets=[0.0, 0.0, 0.5])
    old = RunStream(run, counted, compare=False, clock=clock)
    old.tick()
    new = RunStream(run, counted, compare=False, clock=clock)
    clock.now += 1.0  # the third prompt is due
    polls, submitted = counted.polls, counted.submitted
    redraw = old.tick()
    assert redraw.superseded and not redraw.answers and not redraw.done
    assert (counted.polls, counted.submitted) == (polls, submitted) and run.views[2].status == "scheduled"
    deadline = time.monotonic() + 60
    while not new.tick().done:
        assert time.monotonic() < deadline
    assert run.completed and counted.submitted == 3
    assert [view.finished.output_tokens for view in run.views] == [3, 4, 2]
