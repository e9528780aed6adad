"""The live view of a run (events -> placeholders, `app.common.live_run`): statuses, streaming text, stops and
refusals, the replays, and each request's sampling seed."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from app.common.live_run import CURSOR, LiveRun, request_sampling
from batching.engine.batcher import Batcher
from batching.engine.events import FinishedEvent, StepEvent, TokenEvent
from batching.engine.options import BatcherOptions
from batching.engine.params import SamplingParams
from batching.engine.request import FinishReason
from batching.runs import RunRecord, ScheduledRun
from utils.plain_text import escape_markdown


def finished(request_id: str, text: str, tokens: int, slot: int, reason=FinishReason.EOS, t0: float = 100.0):
    return FinishedEvent(
        request_id=request_id,
        reason=reason,
        output_ids=tuple(range(tokens)),
        text=text,
        prompt_tokens=5,
        arrival=t0,
        admitted=t0 + 0.1,
        first_token=t0 + 0.2,
        finished=t0 + 1.0,
        slot=slot,
    )


def two_prompt_run() -> LiveRun:
    run = LiveRun(start=100.0, owner_prefix="s1/", slots=2)
    for number in (1, 2):
        run.plan(f"question {number}", f"Q: question {number}\nA:", 8, offset_s=0.0)
    return run


def test_a_planned_prompt_is_scheduled_until_submitted_then_waits_for_a_slot() -> None:
    run = two_prompt_run()
    late = run.plan("later", "Q: later\nA:", 8, offset_s=5.0)
    assert [view.number for view in run.due(100.0)] == [1, 2]
    assert late.status == "scheduled" and "5.0 s" in late.status_line()
    run.submitted(run.views[0], "s1/1", 100.0)
    assert run.views[0].status == "waiting" and run.views[0].status_line() == "waiting for a free slot"
    assert run.next_due_s() == 0.0


def test_events_stream_into_the_right_view_with_a_cursor_until_done() -> None:
    run = two_prompt_run()
    run.submitted(run.views[0], "s1/1", 100.0)
    run.submitted(run.views[1], "s1/2", 100.0)
    run.fold(
        [
            TokenEvent("s1/1", 7, " Use", 0, 100.2),
            StepEvent(0, 100.1, 100.2, ("s1/1", "s2/1"), prefill_tokens=5, decode_tokens=0),
        ]
    )
    first, second = run.views
    assert first.status == "running" and first.slot == 0
    assert run.progress_line(now=100.5) == "**running** · 0 of 2 done · 1 in a slot · 1 waiting · 0.5 s"
    assert first.shown_text() == "Use" + CURSOR
    assert first.status_line().startswith("in slot 1 · 1 tokens · TTFT 0.20 s")
    assert second.status == "waiting"
    assert run.others_seen
    run.fold(
        [TokenEvent("s1/1", 8, " the link.\nQ: next", 1, 100.3), finished("s1/1", " Use the link.\nQ: next", 2, 0)]
    )
    assert first.status == "done" and first.shown_text() == "Use the link."
    assert first.status_line() == "done (slot 1) · 2 tokens · TTFT 0.20 s · latency 1.00 s"
    assert not run.done and math.isnan(run.record.end)
    run.fold([finished("s1/2", " ok", 1, 1, reason=FinishReason.LENGTH, t0=100.5)])
    assert run.done and run.completed
    assert run.record.end == pytest.approx(101.5)
    assert second.status_line().startswith("done (hit its cap) (slot 2)")
    assert run.counts()["done"] == 2
    assert run.progress_line(now=999.0) == "**finished** · 2 of 2 done · 0 in a slot · 0 waiting · 1.5 s"
    assert run.labels() == {"s1/1": "#1", "s1/2": "#2"}


def test_events_of_other_sessions_never_land_in_this_run() -> None:
    run = two_prompt_run()
    run.submitted(run.views[0], "s1/1", 100.0)
    run.fold([TokenEvent("s2/1", 1, "x", 0, 100.1), finished("s2/1", "x", 1, 0)])
    assert run.views[0].text == "" and run.views[0].finished is None


def test_stop_drops_prompts_not_yet_sent_and_a_stopped_run_is_not_compared() -> None:
    run = two_prompt_run()
    run.submitted(run.views[0], "s1/1", 100.0)
    run.stop()
    assert run.views[1].status == "refused"
    assert "1 not run" in run.progress_line(now=100.0)
    run.fold([finished("s1/1", "", 0, 0, reason=FinishReason.CANCELLED)])
    assert run.done and not run.completed
    assert run.views[0].status_line().startswith("cancelled")


def test_the_progress_line_counts_stopped_and_failed_requests_apart_from_done_ones() -> None:
    run = LiveRun(start=100.0, owner_prefix="s1/", slots=2)
    for number in (1, 2, 3, 4):
        run.submitted(run.plan(f"q{number}", f"Q: q{number}\nA:", 8, 0.0), f"s1/{number}", 100.0)
    run.plan("q5", "Q: q5\nA:", 8, 5.0)
    run.fold([finished("s1/1", " ok", 1, 0)])
    run.stop()
    run.fold(
        [
            finished("s1/2", "", 0, 1, reason=FinishReason.CANCELLED),
            finished("s1/3", " partial", 2, 0, reason=FinishReason.CANCELLED),
            finished("s1/4", "", 0, 1, reason=FinishReason.ERROR),
        ]
    )
    assert run.done
    assert run.counts() == {
        "scheduled": 0, "waiting": 0, "running": 0, "done": 1, "cancelled": 2, "failed": 1, "refused": 1
    }  # fmt: skip
    assert run.progress_line(now=200.0) == (
        "**stopped** · 1 of 5 done · 0 in a slot · 0 waiting · 2 cancelled · 1 failed · 1 not run · 1.0 s"
    )


def test_a_refused_prompt_says_why_and_does_not_hold_the_run_open() -> None:
    run = two_prompt_run()
    run.refuse(run.views[0], "the engine is full")
    run.submitted(run.views[1], "s1/2", 100.0)
    run.fold([finished("s1/2", "ok", 1, 0)])
    assert run.views[0].status_line() == "not run: the engine is full"
    assert run.done and not run.completed


HOSTILE = "![pwned](http://evil.example/x.png) [click](http://evil.example) **loud**"


def test_a_servers_error_text_in_a_status_line_is_shown_as_text() -> None:
    run = two_prompt_run()
    run.refuse(run.views[0], HOSTILE)
    run.submitted(run.views[1], "s1/2", 100.0)
    run.fold([replace(finished("s1/2", "", 0, 0, reason=FinishReason.ERROR), error=HOSTILE)])
    assert run.views[0].status_line() == f"not run: {escape_markdown(HOSTILE)}"
    assert run.views[1].status_line().endswith(f" · {escape_markdown(HOSTILE)}")
    assert "](" not in run.views[1].status_line() and "**" not in run.views[0].status_line()


def test_latency_frame_runs_to_now_for_requests_still_going() -> None:
    run = two_prompt_run()
    run.submitted(run.views[0], "s1/1", 100.0)
    run.submitted(run.views[1], "s1/2", 100.5)
    run.fold([TokenEvent("s1/1", 1, "a", 0, 100.25)])
    frame = run.latency_frame(now=101.0).set_index("request")
    assert frame.loc["#1", "first_token_s"] == pytest.approx(0.25)
    assert frame.loc["#1", "finished_s"] == pytest.approx(1.0)
    assert frame.loc["#2", "first_token_s"] == pytest.approx(1.0)  # still waiting: the wait runs to now
    assert not frame["done"].any()


def replay(run: LiveRun, batcher: Batcher) -> tuple[list, RunRecord]:
    """What the page does through the engine process, here on a local batcher: run `replay_queue()`, keep it."""
    items, schedule = run.replay_queue()

    def build(index: int, arrival: float):
        prompt, params, request_id = items[index]
        return batcher.builder.build(prompt, params, request_id=request_id, arrival=arrival)

    scheduled = ScheduledRun(batcher, schedule, build)
    events = list(scheduled.events())
    run.keep_replay(scheduled.record)
    return events, scheduled.record


def test_replay_runs_the_same_prompts_on_a_private_batcher(tiny_model_dirs) -> None:
    from config.settings import ModelSettings
    from model.loader import load_model

    loaded = load_model(ModelSettings(name_or_path=str(tiny_model_dirs["llama"])))
    run = LiveRun(start=0.0, owner_prefix="s1/", slots=2, sampling=SamplingParams())
    for number, cap in ((1, 3), (2, 6), (3, 2)):
        view = run.plan(f"question {number}", f"Q: question {number}\nA:", cap, offset_s=0.0 if number < 3 else 0.05)
        run.submitted(view, f"s1/{number}", 0.0)
    static = Batcher(loaded.model, loaded.tokenizer, BatcherOptions(max_batch_size=2), mode="static")
    events, record = replay(run, static)
    assert run.replays["static"] is record and run.replayed == 1
    assert record is not None and record.mode == "static"
    assert sorted(e.request_id for e in record.finished) == ["s1/1", "s1/2", "s1/3"]
    assert len(events) == len(record.steps) + len(record.finished) + len(record.tokens)
    assert any(step.idle_held for step in record.steps)  # the short answer held its slot in the first wave
    third = next(e for e in record.finished if e.request_id == "s1/3")
    assert third.arrival - record.start == pytest.approx(0.05, abs=0.01)
    assert record.end == record.steps[-1].end >= max(e.finished for e in record.finished)


def test_the_comparison_replays_in_abba_order_and_keeps_each_modes_faster_run(tiny_model_dirs) -> None:
    from batching.runs import RunRecord
    from config.settings import ModelSettings
    from model.loader import load_model

    loaded = load_model(ModelSettings(name_or_path=str(tiny_model_dirs["llama"])))
    run = LiveRun(start=0.0, owner_prefix="s1/", slots=2)
    for number in (1, 2, 3):
        run.submitted(run.plan(f"q{number}", f"Q: q{number}\nA:", number + 1, offset_s=0.0), f"s1/{number}", 0.0)
    instant, endless = RunRecord("static", 0.0, end=0.0), RunRecord("continuous", 0.0, end=1e9)
    order = []
    while (mode := run.next_replay) is not None:
        order.append(mode)
        if run.replayed == 2:  # pretend the first runs took no time (static) and forever (continuous)
            run.replays.update(static=instant, continuous=endless)
        replay(run, Batcher(loaded.model, loaded.tokenizer, BatcherOptions(max_batch_size=2), mode=mode))
    assert order == ["continuous", "static", "static", "continuous"] and run.replayed == 4
    assert run.replays["static"] is instant  # the faster record is kept
    assert run.replays["continuous"] is not endless and run.replays["continuous"].mode == "continuous"
    assert len(run.replays["continuous"].finished) == 3


# --- per-request sampling seeds -----------------------------------------------------------------------------------
def test_each_request_samples_with_its_own_seed_derived_from_the_chosen_one() -> None:
    sampling = SamplingParams(do_sample=True, temperature=0.7, top_k=5, seed=41)
    run = LiveRun(start=0.0, owner_prefix="s1/", slots=2, sampling=sampling)
    views = [run.plan("same?", "Q: same?\nA:", 4, 0.0) for _ in range(3)]
    params = [run.params(view) for view in views]
    assert [p.sampling.seed for p in params] == [41, 42, 43]
    assert all(p.sampling == replace(sampling, seed=p.sampling.seed) for p in params)  # nothing else changes
    assert request_sampling(sampling, 1) == sampling  # a single prompt samples exactly as the seed says
    assert [p.max_new_tokens for p in params] == [4, 4, 4]


def sampled_answers(loaded, seed: int, copies: int) -> list[tuple[int, ...]]:
    """`copies` identical prompts, sampled on a private batcher through the same path as the page's replays."""
    sampling = SamplingParams(do_sample=True, temperature=5.0, seed=seed)  # flat: answers depend on the seed
    run = LiveRun(start=0.0, owner_prefix="s1/", slots=4, sampling=sampling)
    for number in range(1, copies + 1):
        run.submitted(run.plan("same?", "Q: same question\nA:", 6, 0.0), f"s1/{number}", 0.0)
    replay(run, Batcher(loaded.model, loaded.tokenizer, BatcherOptions(max_batch_size=4), mode="continuous"))
    finished = {event.request_id: event.output_ids for event in run.replays["continuous"].finished}
    return [finished[f"s1/{number}"] for number in range(1, copies + 1)]


def test_identical_prompts_sampled_get_different_answers_and_the_same_ones_run_after_run(tiny_model_dirs) -> None:
    from tests.engine.helpers import loaded as load

    loaded = load(str(tiny_model_dirs["llama"]))
    first = sampled_answers(loaded, seed=7, copies=8)
    assert len(set(first)) > 1  # with one seed for all, eight identical prompts gave eight identical answers
    assert sampled_answers(loaded, seed=7, copies=8) == first  # reproducible
    assert sampled_answers(loaded, seed=8, copies=8)[:7] == first[1:]  # request n with seed s = n-1 with seed s+1
