"""The page's prompt queue: validation, the data editor's edits, the limits (`app.common.prompt_queue`)."""

from __future__ import annotations

import threading

import pytest

from app.common.prompt_queue import PromptQueue, QueueError, has_edits


def refuse_long(prompt: str, cap: int) -> None:
    """Stands in for the engine's check: prompts over 20 characters do not fit the context."""
    if len(prompt) > 20:
        raise ValueError(f"prompt has {len(prompt)} tokens, more than the 20 allowed: shorten it")


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
