"""Chart frames and builders, the comparison table and the CSV/JSON exports, on hand-made runs."""

from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import replace

import altair as alt
import pandas as pd
import pytest

from batching.engine.events import FinishedEvent, StepEvent, TokenEvent
from batching.engine.request import FinishReason
from tests.helpers import ROOT
from utils import charts, export
from utils.metrics import RunRecord, summarize


def finished(request_id: str, tokens: int, first: float, end: float, slot: int) -> FinishedEvent:
    return FinishedEvent(
        request_id=request_id,
        reason=FinishReason.EOS,
        output_ids=tuple(range(tokens)),
        text=f" answer of {request_id}\nQ: more",
        prompt_tokens=4,
        arrival=0.0,
        admitted=0.0,
        first_token=first,
        finished=end,
        slot=slot,
    )


@pytest.fixture
def static_run() -> RunRecord:
    """A static wave of two: `a` finishes after 1 step and holds its slot idle while `b` runs 2 more."""
    run = RunRecord("static", start=0.0)
    run.extend(
        [
            TokenEvent("a", 1, " x", 0, 0.1),
            TokenEvent("b", 1, " y", 0, 0.1),
            StepEvent(0, 0.0, 0.1, ("a", "b"), prefill_tokens=8, decode_tokens=0),
            finished("a", 1, 0.1, 0.1, 0),
            StepEvent(1, 0.1, 0.2, ("a", "b"), prefill_tokens=0, decode_tokens=1, idle_held=("a",)),
            finished("b", 2, 0.1, 0.3, 1),
            StepEvent(2, 0.2, 0.3, ("a", "b"), prefill_tokens=0, decode_tokens=1, idle_held=("a",)),
        ]
    )
    run.end = 0.3
    return run


@pytest.fixture
def shared_run() -> RunRecord:
    """A continuous run on a shared engine: this session owns `s1/*`, another session's request sits in slot 3."""
    run = RunRecord("continuous", start=10.0)
    run.extend(
        [
            StepEvent(7, 10.0, 10.1, ("s1/1", None, "s2/1"), prefill_tokens=6, decode_tokens=0),
            finished("s1/1", 1, 10.1, 10.1, 0),
            StepEvent(8, 10.1, 10.2, ("s1/2", None, "s2/1"), prefill_tokens=3, decode_tokens=1),
            finished("s1/2", 1, 10.2, 10.2, 0),
        ]
    )
    run.end = 10.2
    return run


def owns(request_id: str) -> bool:
    return request_id.startswith("s1/")


def test_occupancy_counts_held_idle_slots_apart_from_working_ones(static_run: RunRecord) -> None:
    frame = charts.occupancy_frame(static_run)
    per_step = frame.pivot_table(index="step", columns="who", values="slots_used", fill_value=0)
    assert per_step[charts.YOURS].tolist() == [2, 1, 1]
    assert per_step[charts.HELD].tolist() == [0, 1, 1]
    assert (frame.groupby("step")["slots_used"].sum() <= frame.groupby("step")["batch_size"].first()).all()
    # the stacked bands touch: each group starts where the one below ended
    assert frame.groupby("step")["high"].max().tolist() == [2, 2, 2]


def test_occupancy_tells_your_requests_from_other_users(shared_run: RunRecord) -> None:
    frame = charts.occupancy_frame(shared_run, owns)
    assert frame["step"].tolist() == [1, 1, 2, 2]  # renumbered from 1 for this run
    assert frame["engine_step"].tolist() == [7, 7, 8, 8]
    assert frame.groupby("who")["slots_used"].sum().to_dict() == {charts.YOURS: 2, charts.OTHERS: 2}


def test_occupancy_chart_caps_its_axis_at_the_batch_size(static_run: RunRecord) -> None:
    spec = charts.occupancy_chart(charts.occupancy_frame(static_run), slots=2).to_dict()
    bars, line = spec["layer"]
    assert bars["encoding"]["y"]["scale"]["domain"] == [0, 2]
    assert bars["encoding"]["color"]["scale"]["domain"] == [charts.YOURS, charts.HELD]  # only the groups present
    assert line["mark"]["type"] == "rule"
    assert spec["title"] == "Batch occupancy per step"


def test_latency_bars_split_the_wait_for_the_first_token_from_streaming() -> None:
    frame = pd.DataFrame(
        {
            "request": ["#1", "#2"],
            "arrival_s": [0.0, 0.5],
            "first_token_s": [0.2, math.nan],
            "finished_s": [1.0, 0.9],
        }
    )
    bars = charts.latency_bars_frame(frame)
    first = bars[bars["request"] == "#1"].set_index("phase")
    assert first.loc[charts.WAITING, ["start_s", "end_s"]].tolist() == [0.0, 0.2]
    assert first.loc[charts.STREAMING, ["start_s", "end_s"]].tolist() == [0.2, 1.0]
    assert first["ttft_s"].iloc[0] == pytest.approx(0.2) and first["latency_s"].iloc[0] == pytest.approx(1.0)
    second = bars[bars["request"] == "#2"]
    assert second["phase"].tolist() == [charts.WAITING]  # cancelled before its first token
    spec = charts.latency_chart(bars, x_max=2.0).to_dict()
    assert spec["encoding"]["y"]["sort"] == ["#1", "#2"]
    assert spec["encoding"]["x"]["scale"]["domain"] == [0, 2.0]


def test_latency_frame_of_a_finished_run_uses_the_readers_labels(shared_run: RunRecord) -> None:
    frame = charts.latency_frame(shared_run, {"s1/1": "#1", "s1/2": "#2"})
    assert frame.columns.tolist() == ["request", "arrival_s", "first_token_s", "finished_s"]
    assert frame["request"].tolist() == ["#1", "#2"]
    assert frame["finished_s"].tolist() == pytest.approx([0.1, 0.2])


def test_timeline_labels_your_requests_and_marks_the_others(shared_run: RunRecord) -> None:
    frame = charts.timeline_frame(shared_run, {"s1/1": "#1", "s1/2": "#2"}, owns)
    assert frame[["slot", "label", "who"]].values.tolist() == [
        [1, "#1", charts.YOURS],
        [1, "#2", charts.YOURS],
        [3, "other user", charts.OTHERS],
    ]
    spec = charts.timeline_chart(frame, slots=3).to_dict()
    assert spec["layer"][0]["encoding"]["y"]["scale"]["domain"] == [1, 2, 3]


def test_timeline_writes_only_your_requests_labels_on_the_bars(shared_run: RunRecord, static_run: RunRecord) -> None:
    """Other users' labels overlapped into a smear: their bars carry no text (the tooltip still names them)."""
    frame = charts.timeline_frame(shared_run, {"s1/1": "#1", "s1/2": "#2"}, owns)
    assert frame["text"].tolist() == ["#1", "#2", ""]
    held = charts.timeline_frame(static_run, {"a": "#1", "b": "#2"})
    assert held.loc[held["who"] == charts.HELD, "text"].tolist() == [""]
    text_layer = charts.timeline_chart(frame, slots=3).to_dict()["layer"][1]
    assert text_layer["mark"]["type"] == "text" and text_layer["encoding"]["text"]["field"] == "text"
    assert text_layer["transform"] == [{"filter": "(datum.text !== '')"}]


def test_timeline_of_a_static_wave_shows_the_held_idle_stretch(static_run: RunRecord) -> None:
    frame = charts.timeline_frame(static_run, {"a": "#1", "b": "#2"})
    held = frame[frame["who"] == charts.HELD]
    assert held[["label", "start_s", "end_s"]].values.tolist() == [["#1", 0.1, 0.3]]


def test_every_chart_builds_a_valid_vega_lite_spec(static_run: RunRecord) -> None:
    latency = charts.latency_bars_frame(
        pd.DataFrame({"request": ["#1"], "arrival_s": [0.0], "first_token_s": [0.1], "finished_s": [0.3]})
    )
    built = [
        charts.occupancy_chart(charts.occupancy_frame(static_run), 2, x_max=5),
        charts.latency_chart(latency),
        charts.timeline_chart(charts.timeline_frame(static_run, {}), 2, x_max=1.0),
        charts.occupancy_chart(charts.occupancy_frame(RunRecord("continuous", 0.0)), 2),  # no steps yet
    ]
    for chart in built:
        assert isinstance(chart, alt.TopLevelMixin)
        chart.to_dict(validate=True)


def test_every_chart_has_a_caption() -> None:
    assert set(charts.CAPTIONS) == {"occupancy", "occupancy_static", "latency", "timeline"}
    assert all(caption.strip() for caption in charts.CAPTIONS.values())


# --- comparison and export -----------------------------------------------------------------------------------------
def test_comparison_table_shows_each_runs_figures(static_run: RunRecord, shared_run: RunRecord) -> None:
    summaries = {"continuous": summarize(shared_run), "static": summarize(static_run)}
    table = export.comparison_frame(summaries)
    assert table.loc["wall time (s)"].tolist() == ["0.20", "0.30"]
    assert table.loc["output tokens"].tolist() == ["2", "3"]
    assert table.loc["mean occupancy", "static"] == "67%"  # 2/2, then 1/2 twice
    assert table.loc["engine steps"].tolist() == ["2", "3"]


def test_speedup_is_static_wall_time_over_continuous(static_run: RunRecord, shared_run: RunRecord) -> None:
    factor = export.speedup(summarize(shared_run), summarize(static_run))
    assert factor == pytest.approx(1.5)
    assert export.speedup_sentence(factor) == "continuous finished 1.5× faster"
    assert export.speedup_sentence(0.5) == "static finished 2.0× faster"
    assert "no comparison" in export.speedup_sentence(math.nan)


def test_csv_exports_hold_every_request_and_step_of_both_runs(static_run: RunRecord, shared_run: RunRecord) -> None:
    runs = {"continuous": shared_run, "static": static_run}
    labels = {"s1/1": "#1", "s1/2": "#2", "a": "#1", "b": "#2"}
    requests = export.requests_table(runs, labels, {"s1/1": "first?", "a": "first?"})
    assert requests.groupby("run").size().to_dict() == {"continuous": 2, "static": 2}
    assert requests.loc[0, ["request", "prompt", "answer"]].tolist() == ["#1", "first?", "answer of s1/1"]
    steps = export.steps_table(runs, labels)
    assert steps["slot_contents"].tolist() == ["#1 | - | other", "#2 | - | other", "#1 | #2", "#1 | #2", "#1 | #2"]
    text = export.to_csv(requests).decode("utf-8")
    assert text.splitlines()[0].startswith('"run","request","prompt","request_id"')
    assert len(pd.read_csv(io.StringIO(text))) == 4


def test_json_export_is_valid_json_with_summaries_and_no_nan(static_run: RunRecord, shared_run: RunRecord) -> None:
    runs = {"continuous": shared_run, "static": static_run}
    document = json.loads(export.to_json(runs, {}, {}, {"batch_size": 2}))
    assert document["setup"] == {"batch_size": 2}
    assert set(document["runs"]) == {"continuous", "static"}
    assert document["runs"]["static"]["summary"]["output_tokens"] == 3
    assert document["runs"]["continuous"]["summary"]["tpot_s"]["p50"] is None  # NaN -> null
    assert len(document["runs"]["static"]["steps"]) == 3
    assert document["speedup"] == pytest.approx(1.5)


FORMULAS = ['=HYPERLINK("http://evil.example","click me")', "+1+2", "-3+4", "@SUM(A1:A9)", "\t=1", "\r=1"]


def test_csv_exports_neutralise_formulas_in_prompts_answers_and_steps_and_json_keeps_them(
    static_run: RunRecord,
) -> None:
    """OWASP's CSV-injection advice: a text cell starting with = + - @ tab or CR gets a leading ' in the CSV."""
    runs = {"static": static_run}
    static_run.finished[0] = replace(static_run.finished[0], text=" =1+1")  # an answer that looks like a formula
    labels = {"a": "#1", "b": "#2"}
    prompts = {"a": FORMULAS[0], "b": "fine, = inside is harmless"}
    for table in (export.requests_table(runs, labels, prompts), export.steps_table(runs, {"a": "-a"})):
        rows = list(csv.DictReader(io.StringIO(export.to_csv(table).decode("utf-8"))))
        for row, (_, source) in zip(rows, table.iterrows(), strict=True):
            for column, value in source.items():
                shown = row[column]
                if isinstance(value, str) and value[:1] in "=+-@\t\r":
                    assert shown == "'" + value, (column, value, shown)
                elif isinstance(value, str):
                    assert shown == value
    steps = list(csv.DictReader(io.StringIO(export.to_csv(export.steps_table(runs, {"a": "-a"})).decode())))
    assert steps[0]["slot_contents"] == "'-a | other"
    requests = list(csv.DictReader(io.StringIO(export.to_csv(export.requests_table(runs, labels, prompts)).decode())))
    assert requests[0]["prompt"] == "'" + FORMULAS[0] and requests[0]["answer"] == "'=1+1"
    assert requests[1]["prompt"] == "fine, = inside is harmless"
    document = json.loads(export.to_json(runs, labels, prompts, {}))
    assert document["runs"]["static"]["requests"][0]["prompt"] == FORMULAS[0]  # the JSON stays exact
    assert document["runs"]["static"]["requests"][0]["answer"] == "=1+1"


@pytest.mark.parametrize("cell", FORMULAS)
def test_each_formula_start_is_neutralised_and_numbers_are_left_alone(cell: str) -> None:
    text = export.to_csv(pd.DataFrame({"prompt": [cell], "slot": [-1]})).decode("utf-8")
    (row,) = csv.DictReader(io.StringIO(text))
    assert row == {"prompt": "'" + cell, "slot": "-1"}


def test_the_export_module_is_the_only_csv_writer_in_the_repository() -> None:
    """Every CSV the app or the CLI writes goes through export.to_csv, so the neutralisation covers them all."""
    sources = [ROOT / "streamlit_app.py"] + [
        path for folder in ("batching", "config", "model", "utils") for path in (ROOT / folder).rglob("*.py")
    ]
    assert len(sources) > 30
    writers = re.compile(r"(?<!export)\.to_csv\(|csv\.writer\(|csv\.DictWriter\(")
    found = sorted(str(path.relative_to(ROOT)) for path in sources if writers.search(path.read_text(encoding="utf-8")))
    assert found == ["utils/export.py"]


def test_steps_kind_says_which_steps_ran_compiled() -> None:
    from utils.metrics import steps_kind

    def run(*steps: tuple[int, bool]) -> RunRecord:
        record = RunRecord("continuous", start=0.0)
        for index, (prefill, compiled) in enumerate(steps):
            decode = 0 if prefill > 8 else 1
            path = "compiled" if compiled else "eager"
            record.add(StepEvent(index, index, index + 1, ("a",), prefill, decode, path=path))
        return record

    assert steps_kind(run((9, False), (0, False), (0, False))) == "eager steps"
    assert steps_kind(run((9, False), (0, True), (0, True))) == "compiled decode steps"
    assert steps_kind(run((9, False), (0, False), (0, True))) == "eager, then compiled decode steps from step 3"
    assert (
        steps_kind(run((9, False), (0, True), (4, True), (0, True)))
        == "compiled decode steps, 1 of 2 prompt steps compiled"
    )
    assert steps_kind(run((9, False), (4, True), (0, False))) == "eager decode steps, 1 of 2 prompt steps compiled"


def test_steps_kind_says_how_many_steps_called_their_graph_directly() -> None:
    from utils.metrics import steps_kind

    record = RunRecord("continuous", start=0.0)
    for index, path in enumerate(["eager", "compiled", "direct", "direct"]):
        record.add(StepEvent(index, index, index + 1, ("a",), 9 if index == 0 else 0, 1, path=path))
    assert steps_kind(record) == "compiled decode steps (2 of 4 steps called their graph directly)"


def test_the_summary_counts_steps_by_how_they_ran() -> None:
    record = RunRecord("compiled", start=0.0)
    for index, path in enumerate(["eager", "compiled", "compiled", "direct"]):
        record.add(StepEvent(index, index, index + 1, ("a",), 0, 1, path=path))
    assert summarize(record).as_dict()["steps_by_path"] == {"eager": 1, "compiled": 2, "direct": 1}
