"""Charts of the step inspector: the token grid (slots x steps) and the waste meters as a small bar chart."""

from __future__ import annotations

import altair as alt
import pandas as pd

from utils.inspector import CELL_KINDS

# prefill, decode, held, padding, waiting, idle: the same amber for "held" as the occupancy charts.
_KIND_COLORS = ["#10b981", "#3b82f6", "#f59e0b", "#ef4444", "#a3a3a3", "#e5e7eb"]

GRID_CAPTION = (
    "One cell per slot per step: green = prompt tokens (a prefill chunk), blue = one decode token, amber = a "
    "finished request still holding its slot, red = padding computed for nothing, grey = admitted but waiting for "
    "token budget, light = idle. Hover a cell for the request, its tokens and positions; pick a step below to "
    "look inside it."
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
            tooltip=[
                alt.Tooltip("first_step:Q", title="step"),
                alt.Tooltip("last_step:Q", title="to step"),
                alt.Tooltip("slot:O"),
                alt.Tooltip("request:N"),
                alt.Tooltip("kind:N"),
                alt.Tooltip("tokens:Q"),
                alt.Tooltip("padding:Q"),
                alt.Tooltip("positions:N"),
            ],
        )
        .properties(height=max(120, 18 * slots))
    )
    if not selectable:
        return chart
    selector = alt.selection_point(name="step", fields=["first_step"], on="click", clear=False)
    return chart.add_params(selector).encode(opacity=alt.condition(selector, alt.value(1.0), alt.value(0.55)))
