"""The wait strip, the inter-token latency chart and the wait counts, on a hand-made run whose every cell is known."""

from __future__ import annotations

import altair as alt

from batching.engine.events import RowKind, StepEvent, StepRow, TokenEvent, Waiting, WaitReason
from batching.runs import RunRecord
from utils.charts.waits import (
    DECODE,
    PROMPT,
    interference_chart,
    interference_frame,
    wait_strip_chart,
    wait_strip_frame,
)
from utils.metrics.run import WAIT_COLUMNS, steps_frame, summarize, wait_reason_counts, wait_reasons_frame

LABELS = {"a": "#1", "b": "#2", "c": "#3"}


def _run() -> RunRecord:
    """`a` prefills then decodes; `b` waits for the token budget, then its prompt lands; `c` waits for a slot, then
    is preempted."""
    run = RunRecord("continuous", start=1.0)
    run.extend(
        [
            StepEvent(
                0,
                1.0,
                1.1,
                ("a", "b"),
                prefill_tokens=8,
                decode_tokens=0,
                rows=(StepRow("a", 0, RowKind.PREFILL, tuple(range(8)), 0), StepRow("b", 1, RowKind.WAITING, (), 0)),
                waiting=(Waiting("b", WaitReason.TOKEN_BUDGET), Waiting("c", WaitReason.NO_SLOT)),
            ),
            TokenEvent("a", 5, " x", 0, 1.1),
            StepEvent(
                1,
                1.1,
                1.4,
                ("a", "b"),
                prefill_tokens=30,
                decode_tokens=1,
                rows=(StepRow("a", 0, RowKind.DECODE, (5,), 8), StepRow("b", 1, RowKind.PREFILL, tuple(range(30)), 0)),
                waiting=(Waiting("c", WaitReason.PREEMPTED, 12),),
            ),
            TokenEvent("a", 6, " y", 1, 1.4),
            TokenEvent("b", 7, " z", 0, 1.4),
            StepEvent(
                2,
                1.4,
                1.45,
                ("a", "b"),
                prefill_tokens=0,
                decode_tokens=2,
                rows=(StepRow("a", 0, RowKind.DECODE, (6,), 9), StepRow("b", 1, RowKind.DECODE, (7,), 30)),
                waiting=(Waiting("c", WaitReason.PREEMPTED, 12),),
            ),
            TokenEvent("a", 8, " w", 2, 1.45),
            TokenEvent("b", 9, " v", 1, 1.45),
        ]
    )
    run.end = 1.45
    return run


def test_the_strip_has_a_cell_for_every_request_in_the_batcher_at_every_step() -> None:
    frame = wait_strip_frame(_run(), LABELS)
    cells = {(row.step, row.request): row.state for row in frame.itertuples()}
    assert cells == {
        (1, "#1"): PROMPT,
        (1, "#2"): WaitReason.TOKEN_BUDGET.value,
        (1, "#3"): WaitReason.NO_SLOT.value,
        (2, "#1"): DECODE,
        (2, "#2"): PROMPT,
        (2, "#3"): WaitReason.PREEMPTED.value,
        (3, "#1"): DECODE,
        (3, "#2"): DECODE,
        (3, "#3"): WaitReason.PREEMPTED.value,
    }
    assert set(frame.loc[frame["state"] == WaitReason.PREEMPTED.value, "recompute"]) == {12}


def test_wait_counts_are_request_steps_by_reason_in_the_summary_steps_table_and_numbers() -> None:
    run = _run()
    counts = wait_reason_counts(run)
    assert counts[WaitReason.PREEMPTED.value] == 2 and counts[WaitReason.NO_SLOT.value] == 1
    assert counts[WaitReason.TOKEN_BUDGET.value] == 1 and sum(counts.values()) == 4
    assert summarize(run).as_dict()["waiting_request_steps"] == counts
    steps = steps_frame(run)
    assert steps["waiting"].tolist() == [2, 1, 1]
    assert steps[WAIT_COLUMNS[WaitReason.PREEMPTED]].tolist() == [0, 1, 1]
    table = wait_reasons_frame({"continuous": run})
    assert table.loc[WaitReason.PREEMPTED.value, "continuous"] == 2


def test_the_interference_frame_gives_each_tokens_gap_and_marks_the_steps_with_prompt_chunks() -> None:
    gaps, prompts = interference_frame(_run(), LABELS)
    by_request = {request: list(group["itl_ms"].round(3)) for request, group in gaps.groupby("request")}
    assert by_request == {"#1": [300.0, 50.0], "#2": [50.0]}  # #1's gap spans the step #2's 30-token prompt landed in
    assert prompts.to_dict("records") == [
        {"time_s": 0.0, "prompt_tokens": 8},
        {"time_s": 0.10000000000000009, "prompt_tokens": 30},
    ]


def test_both_charts_build_valid_vega_lite_specs() -> None:
    run = _run()
    for chart in (
        wait_strip_chart(wait_strip_frame(run, LABELS)),
        interference_chart(*interference_frame(run, LABELS)),
    ):
        assert isinstance(chart, alt.TopLevelMixin)
        chart.to_dict(validate=True)
