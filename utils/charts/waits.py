"""Why requests wait, and what a prompt costs the others: the wait strip (one row per request, one cell per step,
coloured by what it did or why it waited) and the inter-token latency chart with the steps that computed prompt
chunks marked. Both read a run's events (`StepEvent.rows`, `.waiting`, `TokenEvent`s) and nothing else."""

from __future__ import annotations

from collections.abc import Mapping

import altair as alt
import pandas as pd

from batching.engine.events import RowKind, WaitReason
from batching.runs import RunRecord
from utils.charts.run import HELD, label_key

PROMPT = "computing its prompt"
DECODE = "decoding"
_STATES = [PROMPT, DECODE, HELD, *(reason.value for reason in WaitReason)]
_COLORS = ["#60a5fa", "#2563eb", "#f59e0b", "#9ca3af", "#f97316", "#dc2626", "#a855f7", "#b91c1c", "#facc15"]
_ROW_STATES = {RowKind.PREFILL: PROMPT, RowKind.DECODE: DECODE, RowKind.HELD: HELD}

CAPTIONS = {
    "waiting": (
        "One row per request, one cell per step: blue while it computes, amber while a finished member of a static "
        "wave holds its slot, and otherwise the reason the scheduler left it out: no free slot (vLLM's "
        "max_num_seqs), the step's token budget spent (max_num_batched_tokens), no free KV blocks, a prefix block "
        "another request is computing, preempted, or a static wave still running."
    ),
    "interference": (
        "Each request's inter-token gap over the run (the time between two of its answer's pieces); orange rules "
        "mark the steps that computed prompt chunks. A long prompt landing in one step stalls every decoding request "
        "for that step: a smaller token budget cuts it into chunks and the stall shrinks."
    ),
}


def wait_strip_frame(run: RunRecord, labels: Mapping[str, str]) -> pd.DataFrame:
    """One row per (step, request in the batcher): what it did that step, or why it waited (steps numbered from 1)."""
    rows = []
    for number, step in enumerate(run.steps, start=1):
        for row in step.rows:
            state = _ROW_STATES.get(row.kind)
            if state is not None:
                rows.append({"step": number, "request_id": row.request_id, "state": state, "recompute": 0})
        for waiting in step.waiting:
            rows.append(
                {
                    "step": number,
                    "request_id": waiting.request_id,
                    "state": waiting.reason.value,
                    "recompute": waiting.recompute,
                }
            )
    frame = pd.DataFrame(rows, columns=["step", "request_id", "state", "recompute"])
    frame["request"] = [labels.get(request_id, "other user") for request_id in frame["request_id"]]
    return frame


def wait_strip_chart(frame: pd.DataFrame, title: str = "What each request did, step by step") -> alt.Chart:
    """The strip: a cell per (step, request), coloured by state; hovering names the reason (and a preempted request's
    tokens to compute again)."""
    present = set(frame["state"]) if len(frame) else {DECODE}
    pairs = [(state, color) for state, color in zip(_STATES, _COLORS, strict=True) if state in present]
    order = sorted(frame["request"].unique(), key=label_key) if len(frame) else []
    return (
        alt.Chart(frame)
        .mark_rect()
        .encode(
            x=alt.X("step:O", title="engine step of this run", axis=alt.Axis(labelOverlap=True)),
            y=alt.Y("request:N", title="request", sort=order),
            color=alt.Color(
                "state:N",
                title=None,
                scale=alt.Scale(domain=[p[0] for p in pairs], range=[p[1] for p in pairs]),
                legend=alt.Legend(orient="bottom", labelLimit=400, columns=2),
            ),
            tooltip=["request:N", "step:O", "state:N", alt.Tooltip("recompute:Q", title="tokens to compute again")],
        )
        .properties(title=title, height=alt.Step(16))
    )


def interference_frame(run: RunRecord, labels: Mapping[str, str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each token after a request's first: when it came (seconds from the run's start) and its gap from the one
    before (ms); and the steps that computed prompt chunks, with how many prompt tokens."""
    last: dict[str, float] = {}
    gaps = []
    for token in sorted(run.tokens, key=lambda event: event.time):
        before = last.get(token.request_id)
        last[token.request_id] = token.time
        if before is not None:
            gaps.append(
                {
                    "request": labels.get(token.request_id, "other user"),
                    "time_s": token.time - run.start,
                    "itl_ms": (token.time - before) * 1000,
                }
            )
    prompts = [
        {"time_s": step.start - run.start, "prompt_tokens": step.prefill_tokens}
        for step in run.steps
        if step.prefill_tokens
    ]
    return (
        pd.DataFrame(gaps, columns=["request", "time_s", "itl_ms"]),
        pd.DataFrame(prompts, columns=["time_s", "prompt_tokens"]),
    )


def interference_chart(
    gaps: pd.DataFrame, prompts: pd.DataFrame, title: str = "Inter-token latency", x_max: float | None = None
) -> alt.LayerChart:
    """Inter-token gaps per request over time, over rules at the steps that computed prompt chunks."""
    x_scale = alt.Scale(domain=[0, x_max]) if x_max else alt.Undefined
    rules = (
        alt.Chart(prompts)
        .mark_rule(color="#f97316", opacity=0.45)
        .encode(
            x=alt.X("time_s:Q", scale=x_scale),
            tooltip=[
                alt.Tooltip("time_s:Q", title="step at (s)", format=".3f"),
                alt.Tooltip("prompt_tokens:Q", title="prompt tokens"),
            ],
        )
    )
    points = (
        alt.Chart(gaps)
        .mark_line(point=True, strokeWidth=1)
        .encode(
            x=alt.X("time_s:Q", title="seconds since the run started", scale=x_scale),
            y=alt.Y("itl_ms:Q", title="inter-token gap (ms)"),
            color=alt.Color("request:N", title=None, legend=None),
            tooltip=["request:N", alt.Tooltip("itl_ms:Q", title="inter-token gap (ms)", format=".1f")],
        )
    )
    return alt.layer(rules, points).properties(title=title, height=260)
