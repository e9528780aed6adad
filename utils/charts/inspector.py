"""Drawings of the step inspector: the token grid (slots x steps), one step's packed sequence and its attention mask."""

from __future__ import annotations

import html
from collections.abc import Sequence

import altair as alt
import pandas as pd

from batching.engine.mask_view import CELL_NAMES
from utils.metrics.inspector import CELL_KINDS, MARKS, NO_MARK
from utils.plain_text import isolated_html

# prefill, decode, held, padding, waiting, idle: the same amber for "held" as the occupancy charts.
_KIND_COLORS = ["#10b981", "#3b82f6", "#f59e0b", "#ef4444", "#a3a3a3", "#e5e7eb"]

GRID_CAPTION = (
    "One cell per slot per step: green = prompt tokens (a prefill chunk), blue = one decode token, amber = a "
    "finished request still holding its slot, red = padding computed for nothing, grey = admitted but waiting for "
    "token budget, light = idle. A black outline marks tokens computed again after a preemption, a purple one a "
    "first prompt chunk after a prefix hit (its cached tokens never computed). Hover a cell for the request, its "
    "tokens and positions; pick a step below to look inside it."
)


def token_grid_chart(
    frame: pd.DataFrame, slots: int, width: int, title: str = "", selectable: bool = True
) -> alt.Chart:
    """A heat-map of what each slot did at each step; `width` > 1 means each column aggregates that many steps.

    `selectable` adds a click selection named `step` (its `first_step`), which the page reads to inspect a step.
    """
    step_title = "engine step" if width == 1 else f"engine steps ({width} per column)"
    chart = (
        alt.Chart(frame, title=title)
        .mark_rect()
        .encode(
            x=alt.X("column:O", title=step_title, axis=alt.Axis(labelOverlap="greedy", labelAngle=0)),
            y=alt.Y("slot:O", title="slot", scale=alt.Scale(domain=list(range(1, slots + 1)))),
            color=alt.Color(
                "kind:N",
                title="what the slot did",
                scale=alt.Scale(domain=list(CELL_KINDS), range=_KIND_COLORS),
                legend=alt.Legend(orient="bottom"),
            ),
            stroke=alt.Stroke(
                "mark:N",
                title="marked",
                scale=alt.Scale(domain=list(MARKS), range=["transparent", "#111827", "#7c3aed"]),
                legend=alt.Legend(orient="bottom", values=[mark for mark in MARKS if mark != NO_MARK]),
            ),
            strokeWidth=alt.condition(f"datum.mark != '{NO_MARK}'", alt.value(2.5), alt.value(0)),
            tooltip=[
                alt.Tooltip("first_step:Q", title="step"),
                alt.Tooltip("last_step:Q", title="to step"),
                alt.Tooltip("slot:O"),
                alt.Tooltip("request:N"),
                alt.Tooltip("kind:N"),
                alt.Tooltip("tokens:Q"),
                alt.Tooltip("padding:Q"),
                alt.Tooltip("positions:N"),
                alt.Tooltip("mark:N"),
            ],
        )
        .properties(height=120 + 22 * slots)  # Streamlit fits title, axes and legend into the height too
    )
    if not selectable:
        return chart
    selector = alt.selection_point(name="step", fields=["first_step"], on="click", clear=False)
    return chart.add_params(selector).encode(opacity=alt.condition(selector, alt.value(1.0), alt.value(0.55)))


# One colour per request of a step, cycled; text stays readable on each.
_REQUEST_COLORS = ["#dbeafe", "#dcfce7", "#fef3c7", "#fce7f3", "#e0e7ff", "#ccfbf1", "#fee2e2", "#f3e8ff"]


def packed_sequence_html(sequence: Sequence[tuple[str, str]], limit: int = 600) -> str:
    """The packed tokens as coloured chips, one colour per request; every token text escaped (user text stays text).

    Padding chips are outlined in red. Beyond `limit` tokens the rest is counted, not drawn.
    """
    colours: dict[str, str] = {}
    chips = []
    for label, text in sequence[:limit]:
        colour = colours.setdefault(label, _REQUEST_COLORS[len(colours) % len(_REQUEST_COLORS)])
        border = "1px solid #ef4444" if text == "␣pad" else "1px solid transparent"
        shown = isolated_html(text.replace("\n", "↵")) if text else "&nbsp;"
        chips.append(
            f'<span title="{html.escape(label)}" style="background:{colour};border:{border};color:#111;'
            f'border-radius:3px;padding:0 2px;margin:1px;display:inline-block;white-space:pre">{shown}</span>'
        )
    rest = len(sequence) - limit
    more = f"<span> … and {rest} more tokens</span>" if rest > 0 else ""
    legend = " ".join(
        f'<span style="background:{colour};color:#111;border-radius:3px;padding:0 4px">{html.escape(label)}</span>'
        for label, colour in colours.items()
    )
    return f'<div style="line-height:1.9;font-family:monospace">{"".join(chips)}{more}</div><div>{legend}</div>'


# allowed, future, another row, padding, outside the window, an earlier chunk (padding red as in the grid).
_MASK_COLORS = ["#2563eb", "#e5e7eb", "#f8fafc", "#ef4444", "#a855f7", "#f59e0b"]

MASK_CAPTION = (
    "The attention mask the engine built for this step: one line per packed query (in packed order), one column per "
    "key of each row's cache, row after row. Blue = attended; a query never sees another row's keys (the block "
    "diagonal), keys after itself (causal), padding, keys beyond a sliding window, or (chunked attention) keys of an "
    "earlier chunk."
)


def mask_chart(frame: pd.DataFrame, stride: int, title: str = "") -> alt.Chart:
    """A heat-map of one step's mask: packed queries (y) x each row's key columns (x), coloured by cell kind."""
    sampled = "" if stride == 1 else f" (1 in {stride})"
    queries = int(frame["query"].max()) + 1 if len(frame) else 1
    return (
        alt.Chart(frame, title=title)
        .mark_rect()
        .encode(
            x=alt.X(
                "key:O", title=f"keys: each row's cache columns{sampled}", axis=alt.Axis(labels=False, ticks=False)
            ),
            y=alt.Y("query:O", title=f"packed queries{sampled}", axis=alt.Axis(labels=False, ticks=False)),
            color=alt.Color(
                "kind:N",
                title="cell",
                scale=alt.Scale(domain=list(CELL_NAMES), range=_MASK_COLORS),
                legend=alt.Legend(orient="bottom"),
            ),
            tooltip=[
                alt.Tooltip("query_token:N", title="query"),
                alt.Tooltip("key_column:N", title="key"),
                alt.Tooltip("kind:N", title="cell"),
            ],
        )
        .properties(height=min(600, 170 + 14 * queries))  # title, axes and legend take about 170 px
    )
