"""Altair chart builders: each takes a DataFrame (shaped by the `*_frame` helpers here) and returns a chart.

Colours carry the same meaning in every chart and read on light and dark backgrounds; everything else (fonts,
grid, background) is left to Streamlit's theme.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import altair as alt
import pandas as pd

from batching.runs import RunRecord
from utils.metrics.run import requests_frame, slot_timeline_frame

YOURS = "your requests"
OTHERS = "other users' requests"
HELD = "finished, still holding its slot"
WAITING = "waiting for the first token"
STREAMING = "streaming the answer"

_WHO_DOMAIN = [YOURS, OTHERS, HELD]
_WHO_COLORS = ["#3b82f6", "#a855f7", "#f59e0b"]
_PHASE_DOMAIN = [WAITING, STREAMING]
_PHASE_COLORS = ["#f59e0b", "#3b82f6"]

CAPTIONS = {
    "occupancy": (
        "Each column is one engine step (one forward pass); its height is how many slots did useful work. "
        "The dashed line is the batch size: the closer the columns stay to it, the less compute is wasted."
    ),
    "occupancy_static": (
        "Amber is waste: requests that already finished but keep their slot, because static batching starts the "
        "next wave only when the longest answer of this one is done."
    ),
    "latency": (
        "One bar per request, from when it arrived: amber is the wait for its first token (TTFT), blue is its answer "
        "streaming. The right end is its total latency."
    ),
    "timeline": (
        "One row per slot, one bar per request holding it. With continuous batching a waiting request takes a slot "
        "the moment the previous one finishes, so the rows stay full."
    ),
}

Owns = Callable[[str], bool]


def _who(request_id: str, idle: bool, owns: Owns | None) -> str:
    if idle:
        return HELD
    return YOURS if owns is None or owns(request_id) else OTHERS


def occupancy_frame(run: RunRecord, owns: Owns | None = None) -> pd.DataFrame:
    """One row per (step, who) with slots in use, stacked: `low`..`high` is that group's band of the column.

    Steps are numbered from 1 for this run (the shared engine's own counter means nothing to a reader).
    """
    rows = []
    for number, step in enumerate(run.steps, start=1):
        idle = set(step.idle_held)
        counts = dict.fromkeys(_WHO_DOMAIN, 0)
        for request_id in step.slots:
            if request_id is not None:
                counts[_who(request_id, request_id in idle, owns)] += 1
        low = 0
        for who, count in counts.items():
            if count:
                rows.append(
                    {
                        "step": number,
                        "step_end": number + 1,
                        "engine_step": step.index,
                        "time_s": step.start - run.start,
                        "who": who,
                        "slots_used": count,
                        "low": low,
                        "high": low + count,
                        "batch_size": len(step.slots),
                    }
                )
                low += count
    columns = ["step", "step_end", "engine_step", "time_s", "who", "slots_used", "low", "high", "batch_size"]
    return pd.DataFrame(rows, columns=columns)


def _who_color(frame: pd.DataFrame) -> alt.Color:
    """The who-colour scale, with a legend listing only the groups present."""
    present = set(frame["who"]) if len(frame) else {YOURS}
    pairs = [(who, color) for who, color in zip(_WHO_DOMAIN, _WHO_COLORS, strict=True) if who in present]
    return alt.Color(
        "who:N",
        title=None,
        scale=alt.Scale(domain=[p[0] for p in pairs], range=[p[1] for p in pairs]),
        legend=alt.Legend(orient="bottom", labelLimit=400),
    )


def occupancy_chart(
    frame: pd.DataFrame,
    slots: int,
    title: str = "Batch occupancy per step",
    x_max: int | None = None,
    x_title: str = "engine step of this run",
) -> alt.LayerChart:
    """Stacked columns per step (yours / others' / held idle) under a dashed line at the batch size (`x_title`
    names what a step is: a remote run's steps are the client's samples)."""
    x_scale = alt.Scale(domain=[1, x_max + 1]) if x_max else alt.Undefined
    bars = (
        alt.Chart(frame)
        .mark_bar()
        .encode(
            x=alt.X("step:Q", title=x_title, axis=alt.Axis(format="d"), scale=x_scale),
            x2="step_end:Q",
            y=alt.Y(
                "low:Q",
                title=f"slots in use (of {slots})",
                scale=alt.Scale(domain=[0, slots]),
                axis=alt.Axis(tickMinStep=1, format="d"),
            ),
            y2="high:Q",
            color=_who_color(frame),
            tooltip=[alt.Tooltip("step:Q"), alt.Tooltip("who:N"), alt.Tooltip("slots_used:Q", title="slots")],
        )
    )
    line = (
        alt.Chart(pd.DataFrame({"batch_size": [slots]}))
        .mark_rule(strokeDash=[6, 4], color="gray", strokeWidth=1.5)
        .encode(y="batch_size:Q")
    )
    # The height includes title, axes and legend (Streamlit fits charts to their box).
    return alt.layer(bars, line).properties(title=title, height=320)


def latency_frame(run: RunRecord, labels: Mapping[str, str]) -> pd.DataFrame:
    """A finished run's per-request arrival, first token and end (seconds from its start), labelled for readers."""
    frame = requests_frame(run)
    frame["request"] = [labels.get(request_id, request_id) for request_id in frame["request_id"]]
    return frame[["request", "arrival_s", "first_token_s", "finished_s"]]


def latency_bars_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """From per-request `request, arrival_s, first_token_s, finished_s`: two bars each (waiting, streaming)."""
    rows = []
    for row in frame.itertuples(index=False):
        first = row.first_token_s if pd.notna(row.first_token_s) else row.finished_s
        ttft = row.first_token_s - row.arrival_s if pd.notna(row.first_token_s) else None
        common = {"request": row.request, "ttft_s": ttft, "latency_s": row.finished_s - row.arrival_s}
        rows.append({**common, "phase": WAITING, "start_s": row.arrival_s, "end_s": first})
        if pd.notna(row.first_token_s):
            rows.append({**common, "phase": STREAMING, "start_s": first, "end_s": row.finished_s})
    return pd.DataFrame(rows, columns=["request", "phase", "start_s", "end_s", "ttft_s", "latency_s"])


def latency_chart(frame: pd.DataFrame, title: str = "Latency per request", x_max: float | None = None) -> alt.Chart:
    """Horizontal bars per request on a time axis: the wait for the first token, then the streaming."""
    order = sorted(frame["request"].unique(), key=label_key)
    x_scale = alt.Scale(domain=[0, x_max]) if x_max else alt.Undefined
    return (
        alt.Chart(frame)
        .mark_bar()
        .encode(
            y=alt.Y("request:N", title="request", sort=order),
            x=alt.X("start_s:Q", title="seconds since the run started", scale=x_scale),
            x2="end_s:Q",
            color=alt.Color(
                "phase:N",
                title=None,
                scale=alt.Scale(domain=_PHASE_DOMAIN, range=_PHASE_COLORS),
                legend=alt.Legend(orient="bottom", labelLimit=400),
            ),
            tooltip=[
                "request:N",
                alt.Tooltip("ttft_s:Q", title="time to first token (s)", format=".2f"),
                alt.Tooltip("latency_s:Q", title="total latency (s)", format=".2f"),
            ],
        )
        .properties(title=title, height=alt.Step(20))
    )


def timeline_frame(run: RunRecord, labels: Mapping[str, str], owns: Owns | None = None) -> pd.DataFrame:
    """The run's slot timeline with a reader's label per bar (#n for yours) and who it belongs to."""
    frame = slot_timeline_frame(run)
    frame["slot"] = frame["slot"] + 1
    frame["who"] = [
        _who(request_id, state == "held idle", owns)
        for request_id, state in zip(frame["request_id"], frame["state"], strict=True)
    ]
    frame["label"] = [labels.get(request_id, "other user") for request_id in frame["request_id"]]
    # Only your requests are written on their bars: many short "other user" labels overlap into a smear, and a held
    # idle stretch repeats the label of the bar before it. The tooltip still names every bar.
    frame["text"] = [label if who == YOURS else "" for label, who in zip(frame["label"], frame["who"], strict=True)]
    return frame


def timeline_chart(
    frame: pd.DataFrame, slots: int, title: str = "Slot timeline", x_max: float | None = None
) -> alt.LayerChart:
    """Gantt chart: one row per slot, one bar per stretch a request held it, labelled with the request."""
    x_scale = alt.Scale(domain=[0, x_max]) if x_max else alt.Undefined
    base = alt.Chart(frame).encode(
        y=alt.Y("slot:O", title="slot", scale=alt.Scale(domain=list(range(1, slots + 1)))),
        x=alt.X("start_s:Q", title="seconds since the run started", scale=x_scale),
    )
    bars = base.mark_bar(cornerRadius=3, opacity=0.9).encode(
        x2="end_s:Q",
        color=_who_color(frame),
        tooltip=[
            alt.Tooltip("label:N", title="request"),
            alt.Tooltip("who:N"),
            alt.Tooltip("start_s:Q", title="from (s)", format=".2f"),
            alt.Tooltip("end_s:Q", title="to (s)", format=".2f"),
        ],
    )
    text = base.mark_text(align="left", dx=3, fontSize=10).encode(text="text:N").transform_filter(alt.datum.text != "")
    return alt.layer(bars, text).properties(title=title, height=alt.Step(22))


def label_key(label: str) -> tuple[int, str]:
    digits = label.lstrip("#")
    return (int(digits), "") if digits.isdigit() else (10**9, label)
