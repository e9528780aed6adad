"""The page's prompt queue (validation, data editor edits) and the live view of a run (events -> placeholders):
`app.prompt_queue` and `app.live_run`."""

from __future__ import annotations

import math
import threading
from dataclasses import replace

import pytest

from app.live_run import CURSOR, LiveRun, request_sampling
from app.prompt_queue import PromptQueue, QueueError, has_edits
from batching.engine.batcher import Batcher
from batching.engine.events import FinishedEvent, StepEvent, TokenEvent
from batching.engine.options import BatcherOptions
from batching.engine.params import SamplingParams
from batching.engine.request import FinishReason
from batching.runs import RunRecord, ScheduledRun
from utils.plain_text import escape_markdown


def refuse_long(prompt: str, cap: int) -> None:
    """Stands in for the engine's check: prompts over 20 characters do not fit the context."""
    if len(prompt) > 20:
        raise ValueError(f"prompt has {len(prompt)} tokens, more than the 20 allowed: shorten it")


# --- the queue ---------------------------------------------------------------------------------------------------
def test_adding_a_prompt_stores_it_stripped_with_its_cap() -> None:
    queue = PromptQueue(max_items=4, max_cap=100)
    item = queue.add("  Where is my parcel?  ", 12)
    assert (item.prompt, item.max_new_tokens) == ("Where is my parcel?", 12)
    assert list(queue.frame()["prompt"]) == ["Where is my parcel?"]


@pytest.mark.parametrize("prompt", ["", "   ", "\n\t", None])
def test_an_empty_prompt_is_refused_and_the_queue_is_unchanged(prompt: object) -> None:
    queue = PromptQueue(max_items=4, max_cap=100)
    queue.add("kept", 5)
    with pytest.raises(QueueError, match="prompt is empty"):
        queue.add(prompt, 5)
    assert [item.prompt for item in queue.items] == ["kept"]


@pytest.mark.parametrize("cap", [0, -3, 101, 2.5, True, None, "", " ", "2.5", "-7", "0", "1e3", "+5", "12.0", "101"])
def test_a_cap_out_of_range_is_refused_with_the_allowed_range(cap: object) -> None:
    queue = PromptQueue(max_items=4, max_cap=100)
    with pytest.raises(QueueError, match="from 1 to 100"):
        queue.add("fine", cap)
    assert len(queue) == 0


def test_a_whole_float_cap_is_accepted_as_an_int() -> None:
    assert PromptQueue(4, 100).add("fine", 7.0).max_new_tokens == 7


@pytest.mark.parametrize(("typed", "cap"), [("12", 12), (" 7 ", 7), ("100", 100), ("1", 1)])
def test_a_cap_typed_as_digits_is_kept_exactly(typed: str, cap: int) -> None:
    assert PromptQueue(4, 100).add("fine", typed).max_new_tokens == cap


@pytest.mark.parametrize(
    ("typed", "shown"), [("2.5", "not '2.5'"), ("1e3", "not '1e3'"), ("-7", "not '-7'"), ("www.x.com", "not that text")]
)
def test_a_refused_cap_is_echoed_as_typed_unless_it_is_not_number_like(typed: str, shown: str) -> None:
    with pytest.raises(QueueError) as refused:
        PromptQueue(4, 100).add("fine", typed)
    assert str(refused.value) == f"max new tokens must be a whole number from 1 to 100, {shown}"


def test_the_editor_numbers_rows_from_1_like_the_messages_and_shows_caps_as_text() -> None:
    queue = PromptQueue(max_items=4, max_cap=100)
    for prompt in ("a", "b"):
        queue.add(prompt, 5)
    frame = queue.editor_frame()
    assert frame.index.tolist() == [1, 2] and frame["max_new_tokens"].tolist() == ["5", "5"]
    problems = queue.apply_edits({"edited_rows": {1: {"max_new_tokens": "2.5"}}})
    assert problems == ["row 2: max new tokens must be a whole number from 1 to 100, not '2.5'"]


def test_a_prompt_the_engine_refuses_is_refused_with_the_engines_message() -> None:
    queue = PromptQueue(max_items=4, max_cap=100)
    with pytest.raises(QueueError, match="more than the 20 allowed"):
        queue.add("this prompt is far too long for the model", 5, check=refuse_long)
    assert len(queue) == 0


def test_the_queue_refuses_more_prompts_than_its_limit() -> None:
    queue = PromptQueue(max_items=2, max_cap=100)
    queue.add("one", 1)
    queue.add("two", 2)
    with pytest.raises(QueueError, match="at most 2 prompts"):
        queue.add("three", 3)
    assert [item.prompt for item in queue.items] == ["one", "two"]


def test_replacing_the_queue_is_all_or_nothing() -> None:
    queue = PromptQueue(max_items=3, max_cap=100)
    queue.add("old", 1)
    with pytest.raises(QueueError, match=r"prompt 2: .*more than the 20 allowed"):
        queue.replace_all([("short", 5), ("this one is much too long to fit", 5)], check=refuse_long)
    with pytest.raises(QueueError, match="4 prompts, more than the 3"):
        queue.replace_all([("a", 1)] * 4)
    assert [item.prompt for item in queue.items] == ["old"]
    queue.replace_all([("a", 1), ("b", 2)])
    assert [(item.prompt, item.max_new_tokens) for item in queue.items] == [("a", 1), ("b", 2)]


def test_items_keep_unique_ids_across_clear_and_replace() -> None:
    queue = PromptQueue(max_items=3, max_cap=100)
    first = queue.add("a", 1).item_id
    queue.clear()
    assert len(queue) == 0
    queue.replace_all([("b", 1)])
    assert queue.items[0].item_id != first


def test_editor_edits_change_caps_and_deleted_rows_go() -> None:
    queue = PromptQueue(max_items=5, max_cap=100)
    for prompt in ("a", "b", "c"):
        queue.add(prompt, 10)
    problems = queue.apply_edits({"edited_rows": {0: {"max_new_tokens": 3}}, "deleted_rows": [1], "added_rows": []})
    assert problems == []
    assert [(item.prompt, item.max_new_tokens) for item in queue.items] == [("a", 3), ("c", 10)]


def test_a_tables_edits_apply_once_even_when_two_script_runs_find_them() -> None:
    """Streamlit's fast reruns: the script run a click starts and the one still going can both find the table's
    change set. Applied twice, deleting row 1 would also delete the row after it."""
    queue = PromptQueue(max_items=5, max_cap=100)
    for prompt in ("a", "b", "c", "d"):
        queue.add(prompt, 10)
    version = queue.table_version
    delta = {"edited_rows": {}, "deleted_rows": [1], "added_rows": []}
    results = []
    threads = [threading.Thread(target=lambda: results.append(queue.apply_table_edits(version, delta))) for _ in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results, key=lambda r: r is None) == [[], None]
    assert [item.prompt for item in queue.items] == ["a", "c", "d"]
    assert queue.table_version == version + 1  # the table is drawn afresh, under a new key
    queue.replace_all([("x", 5)])
    queue.clear()
    assert queue.table_version == version + 3  # a whole new queue is a new table too


def test_a_bad_edit_is_refused_with_its_row_and_the_others_apply() -> None:
    queue = PromptQueue(max_items=5, max_cap=100)
    for prompt in ("a", "b"):
        queue.add(prompt, 10)
    problems = queue.apply_edits({"edited_rows": {"0": {"max_new_tokens": 0}, "1": {"max_new_tokens": 20}}})
    assert len(problems) == 1 and problems[0].startswith("row 1:") and "from 1 to 100" in problems[0]
    assert [item.max_new_tokens for item in queue.items] == [10, 20]


def test_edits_to_rows_that_do_not_exist_are_ignored() -> None:
    queue = PromptQueue(max_items=5, max_cap=100)
    queue.add("a", 10)
    assert queue.apply_edits({"edited_rows": {5: {"max_new_tokens": 3}, 0: {"prompt": "x"}}}) == []
    assert [(item.prompt, item.max_new_tokens) for item in queue.items] == [("a", 10)]


def test_has_edits_tells_an_empty_change_set_from_a_real_one() -> None:
    assert not has_edits(None)
    assert not has_edits({"edited_rows": {}, "added_rows": [], "deleted_rows": []})
    assert has_edits({"edited_rows": {0: {"max_new_tokens": 1}}})
    assert has_edits({"deleted_rows": [0]})


# --- a run -----------------------------------------------------------------------------------------------------------
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
