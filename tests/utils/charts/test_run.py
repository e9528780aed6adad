"""A run's chart frames and builders (occupancy, latency, the slot timeline), on hand-made runs."""

from __future__ import annotations

import math

import altair as alt
import pandas as pd
import pytest

from batching.runs import RunRecord
from utils.charts import run as run_charts


def owns(request_id: str) -> bool:
    return request_id.startswith("s1/")


def test_occupancy_counts_held_idle_slots_apart_from_working_ones(static_run: RunRecord) -> None:
    frame = run_charts.occupancy_frame(static_run)
    per_step = frame.pivot_table(index="step", columns="who", values="slots_used", fill_value=0)
    assert per_step[run_charts.YOURS].tolist() == [2, 1, 1]
    assert per_step[run_charts.HELD].tolist() == [0, 1, 1]
    assert (frame.groupby("step")["slots_used"].sum() <= frame.groupby("step")["batch_size"].first()).all()
    # the stacked bands touch: each group starts where the one below ended
    assert frame.groupby("step")["high"].max().tolist() == [2, 2, 2]


def test_occupancy_tells_your_requests_from_other_users(shared_run: RunRecord) -> None:
    frame = run_charts.occupancy_frame(shared_run, owns)
    assert frame["step"].tolist() == [1, 1, 2, 2]  # renumbered from 1 for this run
    assert frame["engine_step"].tolist() == [7, 7, 8, 8]
    assert frame.groupby("who")["slots_used"].sum().to_dict() == {run_charts.YOURS: 2, run_charts.OTHERS: 2}


def test_occupancy_chart_caps_its_axis_at_the_batch_size(static_run: RunRecord) -> None:
    spec = run_charts.occupancy_chart(run_charts.occupancy_frame(static_run), slots=2).to_dict()
    bars, line = spec["layer"]
    assert bars["encoding"]["y"]["scale"]["domain"] == [0, 2]
    present = [run_charts.YOURS, run_charts.HELD]  # only the groups present
    assert bars["encoding"]["color"]["scale"]["domain"] == present
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
    bars = run_charts.latency_bars_frame(frame)
    first = bars[bars["request"] == "#1"].set_index("phase")
    assert first.loc[run_charts.WAITING, ["start_s", "end_s"]].tolist() == [0.0, 0.2]
    assert first.loc[run_charts.STREAMING, ["start_s", "end_s"]].tolist() == [0.2, 1.0]
    assert first["ttft_s"].iloc[0] == pytest.approx(0.2) and first["latency_s"].iloc[0] == pytest.approx(1.0)
    second = bars[bars["request"] == "#2"]
    assert second["phase"].tolist() == [run_charts.WAITING]  # cancelled before its first token
    spec = run_charts.latency_chart(bars, x_max=2.0).to_dict()
    assert spec["encoding"]["y"]["sort"] == ["#1", "#2"]
    assert spec["encoding"]["x"]["scale"]["domain"] == [0, 2.0]


def test_latency_frame_of_a_finished_run_uses_the_readers_labels(shared_run: RunRecord) -> None:
    frame = run_charts.latency_frame(shared_run, {"s1/1": "#1", "s1/2": "#2"})
    assert frame.columns.tolist() == ["request", "arrival_s", "first_token_s", "finished_s"]
    assert frame["request"].tolist() == ["#1", "#2"]
    assert frame["finished_s"].tolist() == pytest.approx([0.1, 0.2])


def test_timeline_labels_your_requests_and_marks_the_others(shared_run: RunRecord) -> None:
    frame = run_charts.timeline_frame(shared_run, {"s1/1": "#1", "s1/2": "#2"}, owns)
    assert frame[["slot", "label", "who"]].values.tolist() == [
        [1, "#1", run_charts.YOURS],
        [1, "#2", run_charts.YOURS],
        [3, "other user", run_charts.OTHERS],
    ]
    spec = run_charts.timeline_chart(frame, slots=3).to_dict()
    assert spec["layer"][0]["encoding"]["y"]["scale"]["domain"] == [1, 2, 3]


def test_timeline_writes_only_your_requests_labels_on_the_bars(shared_run: RunRecord, static_run: RunRecord) -> None:
    """Other users' labels overlapped into a smear: their bars carry no text (the tooltip still names them)."""
    frame = run_charts.timeline_frame(shared_run, {"s1/1": "#1", "s1/2": "#2"}, owns)
    assert frame["text"].tolist() == ["#1", "#2", ""]
    held = run_charts.timeline_frame(static_run, {"a": "#1", "b": "#2"})
    assert held.loc[held["who"] == run_charts.HELD, "text"].tolist() == [""]
    text_layer = run_charts.timeline_chart(frame, slots=3).to_dict()["layer"][1]
    assert text_layer["mark"]["type"] == "text" and text_layer["encoding"]["text"]["field"] == "text"
    assert text_layer["transform"] == [{"filter": "(datum.text !== '')"}]


def test_timeline_of_a_static_wave_shows_the_held_idle_stretch(static_run: RunRecord) -> None:
    frame = run_charts.timeline_frame(static_run, {"a": "#1", "b": "#2"})
    held = frame[frame["who"] == run_charts.HELD]
    assert held[["label", "start_s", "end_s"]].values.tolist() == [["#1", 0.1, 0.3]]


def test_every_chart_builds_a_valid_vega_lite_spec(static_run: RunRecord) -> None:
    latency = run_charts.latency_bars_frame(
        pd.DataFrame({"request": ["#1"], "arrival_s": [0.0], "first_token_s": [0.1], "finished_s": [0.3]})
    )
    built = [
        run_charts.occupancy_chart(run_charts.occupancy_frame(static_run), 2, x_max=5),
        run_charts.latency_chart(latency),
        run_charts.timeline_chart(run_charts.timeline_frame(static_run, {}), 2, x_max=1.0),
        run_charts.occupancy_chart(run_charts.occupancy_frame(RunRecord("continuous", 0.0)), 2),  # no steps yet
    ]
    for chart in built:
        assert isinstance(chart, alt.TopLevelMixin)
        chart.to_dict(validate=True)


def test_every_chart_has_a_caption() -> None:
    assert set(run_charts.CAPTIONS) == {"occupancy", "occupancy_static", "latency", "timeline"}
    assert all(caption.strip() for caption in run_charts.CAPTIONS.values())
