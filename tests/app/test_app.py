"""The page, driven by Streamlit's AppTest: queue editing, bad input, a full run, its charts, comparison and errors,
and the views (the race, the shared engine) sharing one queue while each keeps its own run.

AppTest sees each placeholder's final value only; the streaming itself is checked in tests/browser/test_browser.py.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from streamlit.dataframe_util import convert_arrow_bytes_to_pandas_df
from streamlit.testing.v1 import AppTest

from app.common.live_run import CURSOR, LiveRun
from app.race.lanes import RaceRun
from batching.engine.mask_view import ALLOWED, cell_kinds
from batching.engine.params import RequestParams
from batching.engine.request import FinishReason
from config.settings import ModelSettings
from model.loader import BUILTIN_4BIT_NAME, load_model
from model.prompting import extract_answer, format_prompt
from tests.engine.helpers import reference
from tests.helpers import KEEP_EAGER, ROOT
from utils import export
from utils.charts import run as run_charts
from utils.metrics.attention_mask import padded_rectangle
from utils.metrics.run import summarize
from utils.plain_text import card_heading_html

APP = str(ROOT / "streamlit_app.py")
VIEWS = {"race": "app/race/page.py", "shared": "app/shared_engine/page.py", "remote": "app/remote/page.py"}
CAP = 8  # the default cap in these tests: short answers keep runs fast


@pytest.fixture
def tiny_env(monkeypatch: pytest.MonkeyPatch, tiny_model_dirs: dict[str, Path]) -> Path:
    """Point the app at the tiny random llama, with a small default cap."""
    for name in [n for n in os.environ if n.startswith("BATCHSCOPE_") and n != KEEP_EAGER]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("BATCHSCOPE_MODEL__NAME_OR_PATH", str(tiny_model_dirs["llama"]))
    monkeypatch.setenv("BATCHSCOPE_GENERATION__MAX_NEW_TOKENS", str(CAP))
    return tiny_model_dirs["llama"]


def open_app() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=90)
    at.run()
    assert not at.exception, at.exception
    return at


def button(at: AppTest, label: str):
    return next(b for b in at.button if b.label == label)


def add(at: AppTest, prompt: str, cap: int | str | None = None) -> None:
    """Type a prompt (and a cap, as text in the cap box) and press Add."""
    at.text_input(key="new_prompt").set_value(prompt)
    if cap is not None:
        at.text_input(key="new_cap").set_value(str(cap))
    button(at, "Add").click().run()
    assert not at.exception, at.exception


def queue_rows(at: AppTest) -> list[tuple[str, int]]:
    return [(item.prompt, item.max_new_tokens) for item in at.session_state.queue.items]


def errors(at: AppTest) -> list[str]:
    """The error boxes' text as the page shows it (the Markdown escapes that keep typed text literal, undone)."""
    return [re.sub(r"\\(.)", r"\1", element.value) for element in at.error]


def edit_table(at: AppTest, edited: dict | None = None, deleted: list[int] | None = None) -> None:
    """What the data editor sends after a person edits cells or deletes rows (AppTest cannot edit it directly)."""
    key = f"queue_editor_{at.session_state.queue.table_version}"
    at.session_state[key] = {"edited_rows": edited or {}, "added_rows": [], "deleted_rows": deleted or []}
    at.run()
    assert not at.exception, at.exception


def view_shown(at: AppTest) -> str:
    """Which view the page shows, told by the sidebar control only that view draws."""
    keys = {widget.key for widget in [*at.slider, *at.text_input, *at.checkbox]}
    return "race" if "slow_motion" in keys else "remote" if "remote_url" in keys else "shared"


def open_view(at: AppTest, view: str) -> None:
    """Pick a view in the navigation (AppTest switches to its page file)."""
    at.switch_page(VIEWS[view]).run()
    assert not at.exception, at.exception
    assert view_shown(at) == view


def shared_run(at: AppTest) -> LiveRun:
    """The run the shared engine's view started (its live view)."""
    return at.session_state.shared_run.run


def race_run(at: AppTest) -> RaceRun:
    """The race the race view started (both lanes' view)."""
    return at.session_state.race_run.run


def generate(at: AppTest, view: str = "shared") -> LiveRun | RaceRun | None:
    """Press Generate with the queue run on the shared engine (then replayed to compare), or raced; returns the run
    that view keeps (None if nothing started)."""
    if view_shown(at) != view:
        open_view(at, view)
    button(at, "Generate").click().run()
    assert not at.exception, at.exception
    kept = at.session_state.get(f"{view}_run")
    return None if kept is None else kept.run


def no_comparison(at: AppTest) -> None:
    """Run on the shared engine without the static replays afterwards."""
    open_view(at, "shared")
    at.checkbox(key="compare").uncheck().run()


def charts_by_title(at: AppTest) -> dict[str, list[dict]]:
    """Each chart on the page by its title, in page order (continuous column first), with its data as frames."""
    found: dict[str, list[dict]] = {}
    for element in at.get("vega_lite_chart"):
        spec = json.loads(element.proto.spec)
        frames = [convert_arrow_bytes_to_pandas_df(dataset.data.data) for dataset in element.proto.datasets]
        found.setdefault(spec["title"], []).append({"spec": spec, "data": pd.concat(frames, ignore_index=True)})
    return found


# --- the page and its queue ---------------------------------------------------------------------------------------
def test_page_shows_the_model_and_an_empty_queue(tiny_env: Path) -> None:
    at = open_app()
    model_line = next(c.value for c in at.caption if "parameters" in c.value)
    assert "llama" in model_line and "cpu" in model_line and "float32" in model_line
    assert re.search(r"\d+\.\d M parameters", model_line)
    assert queue_rows(at) == []
    assert at.text_input(key="new_cap").value == str(CAP)
    assert not at.error


def test_the_sidebar_counts_live_batchers_and_new_batch_sizes_replace_idle_ones(
    tiny_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATCHSCOPE_ENGINE__MAX_SHARED_BATCHERS", "2")
    at = open_app()
    add(at, "Hi", 2)
    no_comparison(at)
    for slots in (1, 2, 3):  # each batch size is a shared batcher of its own
        at.slider(key="batch_size").set_value(slots).run()
        run = generate(at)
        assert run.completed and run.slots == slots
    at.run()
    line = next(c.value for c in at.sidebar.caption if "Batchers live" in c.value)
    assert line == "Batchers live: 2 (at most 2 shared)"
    # The test session turns compiling off (tests/conftest.py), and the sidebar says so with the setting's name.
    captions = [c.value for c in at.sidebar.caption]
    assert any(line.startswith("Decode steps: eager (compiling is off") for line in captions), captions


def test_adding_a_prompt_queues_it_and_clears_the_input(tiny_env: Path) -> None:
    at = open_app()
    add(at, "How do I track my order?")
    add(at, "What's your return policy?", 5)
    add(at, "Do you offer gift wrapping?")  # the cap box keeps the last cap
    assert queue_rows(at) == [
        ("How do I track my order?", CAP),
        ("What's your return policy?", 5),
        ("Do you offer gift wrapping?", 5),
    ]
    assert at.text_input(key="new_prompt").value == ""
    assert not at.error


def test_an_empty_prompt_gets_an_inline_message_and_changes_nothing(tiny_env: Path) -> None:
    at = open_app()
    add(at, "kept")
    add(at, "   ")
    assert any("prompt is empty" in message for message in errors(at))
    assert queue_rows(at) == [("kept", CAP)]


@pytest.mark.parametrize("cap", [0, 100_000])
def test_a_cap_out_of_range_gets_an_inline_message_and_keeps_the_prompt(tiny_env: Path, cap: int) -> None:
    at = open_app()
    add(at, "How long does shipping take?", cap)
    assert any("max new tokens must be a whole number from 1 to 511" in message for message in errors(at))
    assert queue_rows(at) == []
    assert at.text_input(key="new_prompt").value == "How long does shipping take?"  # nothing else changed


def test_a_prompt_beyond_the_context_is_refused(tiny_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHSCOPE_TOKENIZER__MAX_PROMPT_TOKENS", "64")
    at = open_app()
    add(at, "Where is my parcel? " * 30)
    assert any("more than the 64 allowed: shorten it" in message for message in errors(at))
    assert queue_rows(at) == []


def test_too_many_prompts_are_refused(tiny_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHSCOPE_LIMITS__MAX_QUEUE_PER_SESSION", "2")
    at = open_app()
    add(at, "one")
    add(at, "two")
    add(at, "three")
    assert any("at most 2 prompts" in message for message in errors(at))
    button(at, "Load example").click().run()  # 11 customer-support prompts
    assert any("11 prompts, more than the 2" in message for message in errors(at))
    assert queue_rows(at) == [("one", CAP), ("two", CAP)]


def test_load_example_fills_the_queue_with_the_customer_support_queries_by_default(tiny_env: Path) -> None:
    at = open_app()
    assert at.selectbox(key="example").value == "customer-support"
    button(at, "Load example").click().run()
    rows = queue_rows(at)
    assert len(rows) == 11 and rows[0] == ("How do I track my order?", CAP)


def test_load_example_loads_another_reference_workload_with_its_caps(tiny_env: Path) -> None:
    at = open_app()
    at.selectbox(key="example").set_value("seed-ragged").run()
    button(at, "Load example").click().run()
    assert [cap for _, cap in queue_rows(at)] == [6, 50, 300, 30, 180, 45]
    assert not at.error


def test_a_workload_that_does_not_fit_the_model_is_refused_whole(tiny_env: Path) -> None:
    at = open_app()
    add(at, "kept")
    at.selectbox(key="example").set_value("seed-blog").run()  # a 448-token cap: more than the tiny context allows
    button(at, "Load example").click().run()
    assert any(message.startswith("seed-blog: prompt") for message in errors(at))
    assert queue_rows(at) == [("kept", CAP)]


def test_editing_a_cap_in_the_table_changes_the_queue(tiny_env: Path) -> None:
    at = open_app()
    for prompt in ("a?", "b?", "c?"):
        add(at, prompt)
    edit_table(at, edited={1: {"max_new_tokens": 3}})
    assert queue_rows(at) == [("a?", CAP), ("b?", 3), ("c?", CAP)]
    edit_table(at, edited={0: {"max_new_tokens": 2}})  # the next edit applies on top, once
    assert queue_rows(at) == [("a?", 2), ("b?", 3), ("c?", CAP)]


def test_a_bad_cap_edit_gets_an_inline_message_and_changes_nothing(tiny_env: Path) -> None:
    at = open_app()
    add(at, "a?")
    edit_table(at, edited={0: {"max_new_tokens": 0}})
    assert any("row 1: max new tokens must be a whole number from 1 to 511" in m for m in errors(at))
    assert queue_rows(at) == [("a?", CAP)]


@pytest.mark.parametrize(
    ("typed", "message"),
    [
        ("2.5", "must be a whole number from 1 to 511, not '2.5'"),
        ("-7", "must be a whole number from 1 to 511, not '-7'"),
        ("0", "must be a whole number from 1 to 511, not 0"),
        ("1e3", "must be a whole number from 1 to 511, not '1e3'"),
        ("", "is empty: type a whole number from 1 to 511"),
        (None, "is empty: type a whole number from 1 to 511"),
    ],
)
def test_a_cap_typed_in_the_table_is_refused_as_typed_naming_the_row_as_the_table_shows_it(
    tiny_env: Path, typed: str | None, message: str
) -> None:
    at = open_app()
    for prompt in ("a?", "b?", "c?"):
        add(at, prompt)
    table = at.dataframe[0].value  # the queue's editor: its index is what the person sees
    assert table.index.tolist() == [1, 2, 3] and table["max_new_tokens"].tolist() == [str(CAP)] * 3
    edit_table(at, edited={1: {"max_new_tokens": typed}})  # the second row, index 2
    assert errors(at) == [f"row 2: max new tokens {message}"]
    assert queue_rows(at) == [("a?", CAP), ("b?", CAP), ("c?", CAP)]


def test_a_cap_typed_in_the_table_is_kept_exactly_when_valid(tiny_env: Path) -> None:
    at = open_app()
    add(at, "a?")
    edit_table(at, edited={0: {"max_new_tokens": "25"}})
    assert queue_rows(at) == [("a?", 25)] and not at.error


@pytest.mark.parametrize("typed", ["2.5", "-7", "0", "", "1e3", " ", "12abc"])
def test_a_cap_typed_in_the_box_is_refused_as_typed_and_nothing_is_added(tiny_env: Path, typed: str) -> None:
    at = open_app()
    add(at, "How long does shipping take?", typed)
    (message,) = errors(at)
    assert message.startswith("max new tokens ") and "a whole number from 1 to 511" in message
    assert queue_rows(at) == []
    assert at.text_input(key="new_prompt").value == "How long does shipping take?"


def test_deleting_rows_in_the_table_removes_them(tiny_env: Path) -> None:
    at = open_app()
    for prompt in ("a?", "b?", "c?"):
        add(at, prompt)
    edit_table(at, deleted=[0, 2])
    assert queue_rows(at) == [("b?", CAP)]


def test_clear_all_empties_the_queue(tiny_env: Path) -> None:
    at = open_app()
    button(at, "Load example").click().run()
    button(at, "Clear all").click().run()
    assert queue_rows(at) == []


def test_generate_with_an_empty_queue_says_what_to_do(tiny_env: Path) -> None:
    at = open_app()
    assert generate(at) is None
    assert any("the queue is empty" in message for message in errors(at))


# --- a run --------------------------------------------------------------------------------------------------------
@pytest.fixture
def finished_app(tiny_env: Path) -> AppTest:
    """Five prompts with different caps (so static batching holds idle slots), run with 2 slots and compared."""
    at = open_app()
    for prompt, cap in (("How do I track my order?", 2), ("Gift wrap?", 9), ("Sales?", 3), ("Red?", 7), ("Hi", 4)):
        add(at, prompt, cap)
    at.slider(key="batch_size").set_value(2).run()
    generate(at)
    return at


def test_generate_fills_every_placeholder_with_its_final_answer(finished_app: AppTest) -> None:
    run = shared_run(finished_app)
    assert run.done and run.completed and len(run.views) == 5
    answers = [element.value for element in finished_app.text]
    assert answers == [extract_answer(view.finished.text) for view in run.views]
    assert all(CURSOR not in answer for answer in answers)
    statuses = [c.value for c in finished_app.caption if "tokens" in c.value and "latency" in c.value]
    assert len(statuses) == 5
    assert all(re.match(r"done.*\(slot [12]\) · \d+ tokens · TTFT \d+\.\d\d s · latency", s) for s in statuses)
    assert [view.finished.output_tokens for view in run.views] == [2, 9, 3, 7, 4]  # random weights: caps decide
    assert any(m.value.startswith("**finished** · 5 of 5 done") for m in finished_app.markdown)


def test_answer_cards_show_each_prompt_as_plain_text_html(tiny_env: Path) -> None:
    at = open_app()
    prompts = ["<b>bold?</b> www.example.com", "mail bob@example.com :material/home: **x**"]
    for prompt in prompts:
        add(at, prompt, 2)
    no_comparison(at)
    generate(at)
    headings = [element.proto.body for element in at.get("html") if "batchscope-card-heading" in element.proto.body]
    assert headings == [card_heading_html(number, prompt) for number, prompt in enumerate(prompts, start=1)]
    assert not any("bold?" in element.value or "example.com" in element.value for element in at.markdown)


def test_after_a_run_generate_is_enabled_again_and_stop_is_not(finished_app: AppTest) -> None:
    assert not button(finished_app, "Generate").disabled
    assert button(finished_app, "Stop").disabled


def test_occupancy_never_exceeds_the_slots_and_static_shows_idle_slots(finished_app: AppTest) -> None:
    occupancy = charts_by_title(finished_app)["Batch occupancy per step"]
    assert len(occupancy) == 2  # continuous, then static (both replayed after the live run)
    for chart in occupancy:
        bars = chart["data"].dropna(subset=["who"])
        assert bars.groupby("step")["slots_used"].sum().max() <= 2
        assert chart["spec"]["layer"][0]["encoding"]["y"]["scale"]["domain"] == [0, 2]
    continuous, static = (chart["data"].dropna(subset=["who"]) for chart in occupancy)
    assert set(continuous["who"]) == {run_charts.YOURS}
    assert (static["who"] == run_charts.HELD).any()
    replays = shared_run(finished_app).replays
    assert continuous["step"].nunique() == len(replays["continuous"].steps)
    assert static["step"].nunique() == len(replays["static"].steps)


def test_latency_and_slot_timeline_charts_show_every_request(finished_app: AppTest) -> None:
    found = charts_by_title(finished_app)
    labels = {f"#{n}" for n in range(1, 6)}
    for chart in found["Latency per request"]:
        assert set(chart["data"]["request"]) == labels
        assert (chart["data"]["end_s"] >= chart["data"]["start_s"]).all()
    continuous, static = found["Slot timeline"]
    assert set(continuous["data"]["label"].dropna()) == labels
    assert set(continuous["data"]["slot"].dropna()) <= {1, 2}
    assert (static["data"]["who"] == run_charts.HELD).any()


def test_comparison_figures_agree_with_the_events(finished_app: AppTest) -> None:
    run = shared_run(finished_app)
    records = {"continuous": run.replays["continuous"], "static": run.replays["static"], "live": run.record}
    for mode, record in records.items():
        assert len(record.tokens) == sum(event.output_tokens for event in record.finished)
        last = max(event.finished for event in record.finished)
        # a replay ends with the step that finished its last request; the live run with its own last request
        assert record.end == (last if mode == "live" else record.steps[-1].end) >= last
    # greedy decoding: the same prompts give the same answers whichever way they were batched
    answers = {mode: sorted((e.request_id, e.output_ids) for e in r.finished) for mode, r in records.items()}
    assert answers["continuous"] == answers["static"] == answers["live"]
    table = finished_app.dataframe[-1].value  # the first is the queue's editor
    assert table.columns.tolist() == ["continuous", "static", "live"]
    assert table.loc["output tokens"].tolist() == [str(len(r.tokens)) for r in records.values()]
    assert table.loc["wall time (s)"].tolist() == [f"{r.wall_s:.2f}" for r in records.values()]
    assert table.loc["engine steps"].tolist() == [str(len(r.steps)) for r in records.values()]
    continuous, static = records["continuous"], records["static"]
    summary = summarize(static)
    assert table.loc["mean occupancy", "static"] == f"{summary.mean_occupancy:.0%}"
    assert summary.mean_occupancy < 1  # idle held slots count against static batching
    factor = static.wall_s / continuous.wall_s
    headline = next(s.value for s in finished_app.subheader if "same batch size" in s.value)
    expected = f"continuous finished {factor:.1f}×" if factor >= 1 else f"static finished {1 / factor:.1f}×"
    assert expected in headline


def test_export_offers_requests_steps_and_everything(finished_app: AppTest) -> None:
    labels = [element.proto.label for element in finished_app.get("download_button")]
    assert labels == ["Requests (CSV)", "Steps (CSV)", "Everything (JSON)"]


def test_switching_the_comparison_off_skips_the_static_run(tiny_env: Path) -> None:
    at = open_app()
    add(at, "Hi", 2)
    no_comparison(at)
    run = generate(at)
    assert run.completed and run.replays == {}
    assert any("switched off" in element.value for element in at.info)
    assert len(charts_by_title(at)["Batch occupancy per step"]) == 1


def test_other_users_requests_on_the_shared_engine_show_in_the_live_run(tiny_env: Path) -> None:
    at = open_app()
    add(at, "Hi", 2)
    no_comparison(at)  # the final charts are then the live run's
    generate(at)
    for prompt in ("a?", "b?", "c?"):
        add(at, prompt, 4)
    session = at.session_state.shared_run.session  # another browser tab, with long answers in the same engine:
    other = session.service.open_session(session.options)
    try:
        for _ in range(6):
            other.submit("Once upon a time", RequestParams(500, ignore_eos=True))
        run = generate(at)
    finally:
        other.close()
    assert run.others_seen and run.completed
    assert [view.finished.output_tokens for view in run.views] == [2, 4, 4, 4]
    occupancy = charts_by_title(at)["Batch occupancy per step"][0]["data"].dropna(subset=["who"])
    assert set(occupancy["who"]) == {run_charts.YOURS, run_charts.OTHERS}
    assert occupancy.groupby("step")["slots_used"].sum().max() <= 8
    assert any("Other people's requests shared the engine" in c.value for c in at.caption)


def test_sampling_policy_and_staggered_arrivals_reach_the_engine(tiny_env: Path) -> None:
    at = open_app()
    for prompt in ("a?", "b?", "c?"):
        add(at, prompt, 3)
    at.radio(key="decoding").set_value("sample").run()
    at.selectbox(key="policy").set_value("shortest-first").run()
    at.radio(key="arrivals").set_value("staggered").run()
    at.slider(key="interval").set_value(0.2).run()
    run = generate(at)
    assert run.sampling.do_sample
    assert at.session_state.shared_run.setup["engine"]["policy"] == "shortest-first"
    assert [view.offset_s for view in run.views] == pytest.approx([0.0, 0.2, 0.4])
    arrived = sorted(event.arrival - run.start for event in run.record.finished)
    assert arrived[1] >= 0.2 and arrived[2] >= 0.4
    for replay in run.replays.values():  # the replays see the same arrivals
        assert sorted(e.arrival - replay.start for e in replay.finished) == pytest.approx([0.0, 0.2, 0.4], abs=0.01)


def test_sampled_requests_get_seeds_from_the_sidebar_seed_and_replay_identically(tiny_env: Path) -> None:
    at = open_app()
    for _ in range(3):
        add(at, "same?", 3)
    at.radio(key="decoding").set_value("sample").run()
    next(box for box in at.number_input if box.label == "Seed").set_value(5).run()
    assert any("Request #n samples with seed + n − 1" in caption.value for caption in at.sidebar.caption)
    run = generate(at)
    assert [run.params(view).sampling.seed for view in run.views] == [5, 6, 7]
    assert run.sampling.seed == 5 and at.session_state.shared_run.setup["sampling"]["seed"] == 5
    records = {"live": run.record, **run.replays}
    answers = {mode: {e.request_id: e.output_ids for e in record.finished} for mode, record in records.items()}
    assert answers["live"] == answers["continuous"] == answers["static"]  # each request's seed goes with it


def test_a_second_run_replaces_the_first(finished_app: AppTest) -> None:
    first = shared_run(finished_app)
    button(finished_app, "Clear all").click().run()
    add(finished_app, "Again?", 2)
    second = generate(finished_app)
    assert second is not first and [view.prompt for view in second.views] == ["Again?"]
    assert [element.value for element in finished_app.text] == [extract_answer(second.views[0].finished.text)]


# --- settings and model errors ------------------------------------------------------------------------------------
def test_a_bad_setting_shows_one_clear_message(tiny_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHSCOPE_BATCHING__POLICY", "random")
    at = AppTest.from_file(APP, default_timeout=30).run()
    assert not at.exception
    assert len(at.error) == 1 and "BATCHSCOPE_BATCHING__POLICY=random" in at.error[0].value
    assert not at.button  # the page stops there


def test_a_dotenv_that_is_not_utf8_shows_one_line_not_a_traceback(
    tiny_env: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / ".env").write_bytes(b"BATCHSCOPE_PROMPT__SYSTEM_PROMPT=caf\xe9\n")
    monkeypatch.chdir(tmp_path)  # .env is read from the working folder
    at = AppTest.from_file(APP, default_timeout=30).run()
    assert not at.exception
    assert [element.value for element in at.error] == [
        f"A setting is not valid: {tmp_path.resolve() / '.env'}: byte 0xE9 at offset 36 (line 1) is not utf-8; "
        "save the file as UTF-8"
    ]
    assert not at.button


def test_a_misspelt_setting_is_warned_about_and_the_page_still_works(
    tiny_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATCHSCOPE_BATCHING__MAX_BATCH_SIZ", "3")
    at = open_app()
    (warning,) = [element.value.replace("\\", "") for element in at.warning]  # shown escaped: markdown-safe
    assert warning == (
        "BATCHSCOPE_BATCHING__MAX_BATCH_SIZ (environment variable) is not a setting and is ignored; "
        "did you mean BATCHSCOPE_BATCHING__MAX_BATCH_SIZE?"
    )
    assert at.slider(key="batch_size").value == 8  # the misspelt value was ignored, as the warning says
    add(at, "Hi", 2)
    assert queue_rows(at) == [("Hi", 2)]


def test_a_missing_model_folder_says_which_setting_to_change(tiny_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHSCOPE_MODEL__NAME_OR_PATH", "/nonexistent/model")
    at = AppTest.from_file(APP, default_timeout=30).run()
    assert not at.exception
    assert len(at.error) == 1
    assert "BATCHSCOPE_MODEL__NAME_OR_PATH=/nonexistent/model" in at.error[0].value
    assert "Traceback" not in at.error[0].value


def test_a_broken_model_folder_shows_a_message_not_a_traceback(
    tiny_env: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "llama", "hidden_size": "lots"}')
    monkeypatch.setenv("BATCHSCOPE_MODEL__NAME_OR_PATH", str(tmp_path))
    at = AppTest.from_file(APP, default_timeout=30).run()
    assert not at.exception
    assert len(at.error) == 1 and "could not be loaded" in at.error[0].value
    assert (
        f"BATCHSCOPE_MODEL__NAME_OR_PATH={tmp_path}: the folder {tmp_path} does not hold a model" in at.error[0].value
    )
    assert "hub" not in at.error[0].value


def test_a_folder_with_a_corrupt_config_says_what_is_wrong_with_the_folder(
    tiny_env: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "llama",')
    monkeypatch.setenv("BATCHSCOPE_MODEL__NAME_OR_PATH", str(tmp_path))
    at = AppTest.from_file(APP, default_timeout=30).run()
    assert not at.exception
    assert [element.value for element in at.error] == [
        f"The model could not be loaded: BATCHSCOPE_MODEL__NAME_OR_PATH={tmp_path}: {tmp_path / 'config.json'} is not "
        "valid JSON (Expecting property name enclosed in double quotes at line 1, column 24); save the model again "
        "with save_pretrained, or set BATCHSCOPE_MODEL__NAME_OR_PATH=builtin"
    ]


def test_an_unreachable_hub_id_fails_fast_on_every_new_page_until_settings_change(
    tiny_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from model import loader

    monkeypatch.setattr(loader, "_hub_failures", {})
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with socket.socket() as probe:  # a port nothing listens on once this socket is closed
        probe.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{probe.getsockname()[1]}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("BATCHSCOPE_MODEL__NAME_OR_PATH", "nobody-here/app-unreachable-xyz")
    pages = [AppTest.from_file(APP, default_timeout=30).run() for _ in range(2)]  # two tabs
    for at in pages:
        assert not at.exception and len(at.error) == 1
        assert f"the model hub ({endpoint}) cannot be reached" in at.error[0].value
    assert pages[0].error[0].value == pages[1].error[0].value and len(loader._hub_failures) == 1


def test_a_model_the_engine_cannot_run_exactly_is_refused_after_load_with_one_line(
    tiny_env: Path, monkeypatch: pytest.MonkeyPatch, family_model_dirs: dict[str, Path]
) -> None:
    monkeypatch.setenv("BATCHSCOPE_MODEL__NAME_OR_PATH", str(family_model_dirs["falcon_alibi"]))
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception
    [error] = [e.value for e in at.error]
    assert error.startswith("model type falcon is not supported: its ALiBi position biases (alibi=True)")
    assert "\n" not in error
    assert not at.button  # the page stops there: no queue, no Generate


def test_the_model_line_names_the_attention_features_in_use(
    tiny_env: Path, monkeypatch: pytest.MonkeyPatch, family_model_dirs: dict[str, Path]
) -> None:
    monkeypatch.setenv("BATCHSCOPE_MODEL__NAME_OR_PATH", str(family_model_dirs["gemma2"]))
    at = open_app()
    line = next(c.value for c in at.caption if "parameters" in c.value)
    assert line.endswith("context 256 tokens · sliding window 8 on 1 of 2 layers, soft-cap 1")


def test_a_hybrid_model_races_exactly_and_says_what_its_recurrent_layers_hold(
    tiny_env: Path, monkeypatch: pytest.MonkeyPatch, family_model_dirs: dict[str, Path]
) -> None:
    """LFM2 (a short-convolution layer beside an attention layer): both lanes answer alike, the model line and the
    memory line count its per-request conv state, and the inspector says its conv layer has no mask to draw."""
    monkeypatch.setenv("BATCHSCOPE_MODEL__NAME_OR_PATH", str(family_model_dirs["lfm2"]))
    at = open_app()
    line = next(c.value for c in at.caption if "parameters" in c.value)
    assert line.endswith("conv state on 1 of 2 layers, 0.8 KiB a request, no prefix caching")
    at.slider(key="batch_size").set_value(2).run()
    for index, cap in enumerate([2, 9, 3]):
        add(at, f"hybrid prompt {index}", cap)
    race = generate(at, "race")
    assert isinstance(race, RaceRun) and race.completed
    answers = [element.value for element in at.text]
    assert len(answers) == 6 and answers[0::2] == answers[1::2]
    memory = [m.value for m in at.markdown if "blocks held" in m.value]
    assert len(memory) == 2 and all(
        "conv/SSM states" in value and "0.8 KiB a running request" in value for value in memory
    )
    infos = [i.value for i in at.info if "convolution, SSM or linear-attention layers" in i.value]
    assert infos and infos[0].startswith("1 of this model's layers")
    assert any("attention mask" in str(c.proto.spec).lower() for c in at.get("vega_lite_chart"))


# --- the embedded model -------------------------------------------------------------------------------------------
def test_the_default_embedded_model_answers_the_customer_support_example(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("BATCHSCOPE_") and n != KEEP_EAGER]:
        monkeypatch.delenv(name)
    at = open_app()
    assert "builtin" in next(c.value for c in at.caption if "parameters" in c.value)
    button(at, "Load example").click().run()
    run = generate(at)
    assert run.completed and set(run.replays) == {"continuous", "static"}
    answers = [element.value for element in at.text]
    assert len(answers) == 11 and all(answers)
    ended = [view.finished.reason for view in run.views]
    assert ended.count(FinishReason.EOS) >= 8  # answers end on their own, at different lengths
    continuous, static = (summarize(run.replays[mode]) for mode in ("continuous", "static"))
    assert static.mean_occupancy < continuous.mean_occupancy
    assert continuous.steps < static.steps


@pytest.mark.long
def test_the_embedded_models_4bit_copy_is_picked_in_the_sidebar_and_races_as_itself(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The sidebar's weights choice: the 4-bit GPTQ copy is made on first use (in this test's own cache), its
    engine says its precision and bytes, and both lanes answer what `generate` on the same 4-bit model answers."""
    for name in [n for n in os.environ if n.startswith("BATCHSCOPE_") and n != KEEP_EAGER]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    at = open_app()
    model_line = next(c.value for c in at.caption if "parameters" in c.value)
    assert "4.1 M parameters" in model_line and "float32 weights, 15.7 MiB" in model_line
    at.selectbox(key="weights").set_value(BUILTIN_4BIT_NAME).run()
    assert not at.exception, at.exception
    model_line = next(c.value for c in at.caption if "parameters" in c.value)
    assert "builtin\\-4bit" in model_line and "4-bit GPTQ, group 128 weights" in model_line
    assert "4.1 M parameters" in model_line  # each quantised layer counts its weights, as before packing
    question = "How do I track my order?"
    add(at, question, 12)
    race = generate(at, "race")
    assert isinstance(race, RaceRun) and race.completed
    quantised = load_model(ModelSettings(name_or_path=BUILTIN_4BIT_NAME))
    prompt = quantised.tokenizer(format_prompt(question))["input_ids"]
    want = quantised.tokenizer.decode(reference(quantised.model, prompt, 12), skip_special_tokens=True)
    for lane in race.lanes.values():
        assert extract_answer(lane.views[0].finished.text) == extract_answer(want)
    assert any("The model's 4-bit GPTQ, group 128 weights" in c.value for c in at.caption)
    assert any("Model: 4-bit GPTQ, group 128 weights" in c.value for c in at.caption)


def test_the_inspector_shows_a_runs_grid_meters_and_the_step_picked(finished_app: AppTest) -> None:
    run = shared_run(finished_app)
    static = run.replays["static"]
    finished_app.radio(key="inspect_run").set_value("static").run()
    grid = next(c for c in finished_app.get("vega_lite_chart") if "what the slot did" in c.proto.spec)
    frame = convert_arrow_bytes_to_pandas_df(grid.proto.datasets[0].data.data)
    assert len(frame) == len(static.steps) * 2  # one cell per slot per step
    assert frame["tokens"].sum() == sum(row.tokens for step in static.steps for row in step.rows)
    metrics = {m.label: m.value for m in finished_app.metric}
    assert metrics["padding tokens computed"] == str(sum(r.padding for s in static.steps for r in s.rows))
    assert int(metrics["held by finished requests"]) > 0  # static waves hold finished requests' slots
    finished_app.slider(key="inspect_step_static").set_value(2).run()
    rows = finished_app.dataframe[-2].value  # the step's rows, then the comparison table
    step = static.steps[1]
    assert rows["request"].tolist() == [run.labels()[row.request_id] for row in step.rows]
    assert rows["tokens"].tolist() == [row.tokens for row in step.rows]
    packed = next(h.proto.body for h in finished_app.get("html") if "font-family:monospace" in h.proto.body)
    assert packed.count("<span title=") == sum(row.tokens + row.padding for row in step.rows)
    # the step's attention mask, expanded from what the engine recorded, and the wave's padded rectangle
    chart = next(c for c in finished_app.get("vega_lite_chart") if "packed queries" in c.proto.spec)
    cells = convert_arrow_bytes_to_pandas_df(chart.proto.datasets[0].data.data)
    assert len(cells) == step.mask.queries * step.mask.keys
    assert (cells["kind"] == "allowed").sum() == (cell_kinds(step.mask, None) == ALLOWED).sum()
    rectangle = next(m.value for m in finished_app.markdown if "Padded rectangle" in m.value)
    expected = padded_rectangle(static, 1)
    assert f"{expected.padding:,} of them padding" in rectangle and expected.padding > 0


def test_the_comparison_table_and_the_export_carry_the_waste_meters(finished_app: AppTest) -> None:
    table = finished_app.dataframe[-1].value
    assert {"padding tokens computed", "slot-steps held by finished requests"} <= set(table.index)
    assert int(table.loc["slot-steps held by finished requests", "static"]) > 0
    assert table.loc["slot-steps held by finished requests", "continuous"] == "0"
    run = shared_run(finished_app)
    document = json.loads(export.to_json(run.replays, run.labels(), {}, {}))
    assert set(document["runs"]["static"]["waste"]) >= {"slot_use", "padding_tokens", "budget_fill_mean"}
    assert document["runs"]["continuous"]["waste"]["slot_steps_held"] == 0


# --- the race (the default): both schedules on lanes of this tab's own ------------------------------------------
@pytest.fixture(scope="module")
def raced_app(tiny_model_dirs: dict[str, Path]) -> Iterator[AppTest]:
    """The same five prompts as `finished_app`, raced (the default) with 2 slots."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        for name in [n for n in os.environ if n.startswith("BATCHSCOPE_") and n != KEEP_EAGER]:
            monkeypatch.delenv(name)
        monkeypatch.setenv("BATCHSCOPE_MODEL__NAME_OR_PATH", str(tiny_model_dirs["llama"]))
        monkeypatch.setenv("BATCHSCOPE_GENERATION__MAX_NEW_TOKENS", str(CAP))
        at = open_app()
        at.slider(key="batch_size").set_value(2).run()
        for index, cap in enumerate([2, 9, 3, 7, 4]):
            add(at, f"prompt number {index}", cap)
        assert view_shown(at) == "race"  # the page opens on the race
        generate(at, "race")
        yield at


def test_a_race_answers_every_prompt_on_both_lanes_and_states_the_speedup(raced_app: AppTest) -> None:
    race = race_run(raced_app)
    assert race.done and race.completed and len(race.views) == 5
    for lane in race.lanes.values():
        assert [view.finished.output_tokens for view in lane.views] == [2, 9, 3, 7, 4]
    answers = [element.value for element in raced_app.text]
    assert len(answers) == 10  # each prompt's answer on each lane
    assert answers[0::2] == answers[1::2]  # greedy: both lanes compute the same answers
    line = next(m.value for m in raced_app.markdown if m.value.startswith("**finished**"))
    assert "continuous: 5 of 5 done" in line and "static: 5 of 5 done" in line
    runs = race.runs()
    factor = runs["static"].wall_s / runs["continuous"].wall_s
    headline = next(s.value for s in raced_app.subheader if s.value.startswith("Same queue"))
    # The sentence names the faster lane: on a loaded machine a race this small has gone to static (CI, 2026-11-26).
    assert export.speedup_sentence(factor) in headline
    assert len(runs["continuous"].steps) < len(runs["static"].steps)
    assert not button(raced_app, "Generate").disabled and button(raced_app, "Stop").disabled


def test_a_race_charts_both_lanes_on_their_own_clocks(raced_app: AppTest) -> None:
    race = race_run(raced_app)
    runs = race.runs()
    found = charts_by_title(raced_app)
    occupancy = next(charts for title, charts in found.items() if "occupancy" in str(title).lower())
    assert [chart["data"]["step"].nunique() for chart in occupancy] == [len(runs[m].steps) for m in runs]
    for record in runs.values():  # each lane's wall time is its clock at its last step
        assert record.start == pytest.approx(0.0, abs=0.01) and record.end == pytest.approx(record.steps[-1].end)
    assert race.elapsed == {mode: record.end for mode, record in runs.items()}
    document = json.loads(export.to_json(runs, race.labels(), {}, {}))
    assert document["runs"].keys() == {"continuous", "static"}


def test_slow_motion_slows_the_race_on_the_page_but_not_its_clocks(tiny_env: Path) -> None:
    at = open_app()
    at.slider(key="batch_size").set_value(2).run()
    for index, cap in enumerate([3, 8, 5]):
        add(at, f"slow prompt {index}", cap)
    measured = {}
    for pause_ms in (0, 40):
        at.slider(key="slow_motion").set_value(pause_ms).run()
        started = time.perf_counter()
        race = generate(at, "race")
        real = time.perf_counter() - started
        assert isinstance(race, RaceRun)
        assert race.completed and at.session_state.race_run.setup["slow_motion_ms"] == pause_ms
        runs = race.runs()
        measured[pause_ms] = (real, sum(len(r.steps) for r in runs.values()), sum(r.wall_s for r in runs.values()))
    real, steps, clocks = measured[40]
    assert real >= 0.04 * (steps - 1)  # the page really went step by step
    assert clocks < measured[0][2] + 0.04 * (steps - 1) / 2  # and neither clock counted the pauses


def test_a_race_lane_opens_in_the_inspector_with_its_mask_and_the_static_padded_rectangle(raced_app: AppTest) -> None:
    raced_app.radio(key="inspect_run").set_value("static").run()
    assert not raced_app.exception
    assert any("Padded rectangle" in m.value for m in raced_app.markdown)
    assert any("attention mask" in str(c.proto.spec).lower() for c in raced_app.get("vega_lite_chart"))


# --- the views: one queue, each view's own run ----------------------------------------------------------------------
def answer_headers(at: AppTest) -> list[str]:
    return [header.value for header in at.header if header.value.startswith("2 · Answers")]


def test_the_queue_is_kept_across_views_and_each_run_stays_with_the_view_that_started_it(tiny_env: Path) -> None:
    at = open_app()
    add(at, "Hi", 2)
    add(at, "Bye", 3)
    no_comparison(at)  # to the shared engine's view
    assert queue_rows(at) == [("Hi", 2), ("Bye", 3)]  # the queue typed on the race's view
    live = generate(at)
    assert isinstance(live, LiveRun) and live.completed
    live_answers = [element.value for element in at.text]

    open_view(at, "race")
    assert queue_rows(at) == [("Hi", 2), ("Bye", 3)]
    assert "race_run" not in at.session_state and not at.text and not answer_headers(at)  # not the shared run
    assert not button(at, "Generate").disabled and button(at, "Stop").disabled
    add(at, "Again?", 2)  # a prompt added here is in every view's queue
    race = generate(at, "race")
    assert isinstance(race, RaceRun) and race.completed and len(race.views) == 3
    assert answer_headers(at) == ["2 · Answers, racing"] and len(at.text) == 6  # three prompts on two lanes

    open_view(at, "shared")  # its run is where it was left, untouched by the race
    assert shared_run(at) is live and len(live.views) == 2
    assert answer_headers(at) == ["2 · Answers"] and [element.value for element in at.text] == live_answers
    assert queue_rows(at) == [("Hi", 2), ("Bye", 3), ("Again?", 2)]

    open_view(at, "remote")  # no run of its own yet: the queue only
    assert queue_rows(at) == [("Hi", 2), ("Bye", 3), ("Again?", 2)]
    assert not answer_headers(at) and not at.text
    open_view(at, "race")
    assert race_run(at) is race and len(at.text) == 6


class UnfinishedRun:
    """Stands in for a view's run still going (`app.common.frame.ViewRun`): it records being let go."""

    running = True

    def __init__(self) -> None:
        self.let_go_calls = 0

    def let_go(self) -> None:
        self.let_go_calls += 1


def test_runs_left_going_in_other_views_are_let_go_on_every_script_run(tiny_env: Path) -> None:
    at = open_app()  # on the race
    shared, remote = UnfinishedRun(), UnfinishedRun()
    at.session_state["shared_run"] = shared  # nothing polls a run whose view is not shown: it is stopped
    at.session_state["remote_run"] = remote
    at.run()
    assert (shared.let_go_calls, remote.let_go_calls) == (1, 1)
    at.run()
    assert (shared.let_go_calls, remote.let_go_calls) == (2, 2)  # (a real run does nothing once stopped)
