"""Drawings of KV memory: the block pool as a waffle (one square per block, coloured by state) and positions
holding tokens against positions reserved over the steps. Each takes a frame from `utils.metrics.memory`."""

from __future__ import annotations

import altair as alt
import pandas as pd

from utils.metrics.memory import BLOCK_STATES, HOLDING, RESERVED

# shared, in use, cached, free: in use is the decode blue of the other charts, shared a deeper one.
_STATE_COLORS = ["#7c3aed", "#3b82f6", "#10b981", "#e5e7eb"]

POOL_CAPTION = (
    "One square per KV block of the same pool size on both lanes: blue = held by a request, purple = shared by "
    "several requests (a prefix hit), green = cached (no one holds it; kept for a later hit), light = free. Static "
    "reserves each wave's longest prompt + largest cap up front for every member; continuous takes a block only "
    "when a token needs it, so more requests fit in the same memory."
)
STEPS_CAPTION = (
    "KV positions per step: the solid line is positions holding a token, the dashed one positions reserved (whole "
    "blocks held). The gap between them is memory reserved but never used."
)


def pool_chart(frame: pd.DataFrame, title: str = "") -> alt.Chart:
    """The pool as a waffle, `row`/`column` from `pool_frame`, coloured by state in a fixed legend."""
    rows = int(frame["row"].max()) + 1 if len(frame) else 1
    return (
        alt.Chart(frame, title=title)
        .mark_square(size=140, opacity=1)
        .encode(
            x=alt.X("column:O", axis=None),
            y=alt.Y("row:O", axis=None),
            color=alt.Color(
                "state:N",
                title="block",
                scale=alt.Scale(domain=list(BLOCK_STATES), range=_STATE_COLORS),
                legend=alt.Legend(orient="bottom", columns=2),
            ),
            tooltip=[alt.Tooltip("state:N")],
        )
        .properties(height=150 + 20 * rows)  # Streamlit fits title and legend into the height too
    )


STEPS_TITLE = "KV positions per step: holding tokens vs reserved"


def memory_steps_chart(frame: pd.DataFrame, x_max: int | None = None, title: str = STEPS_TITLE) -> alt.Chart:
    """Positions holding tokens (solid) and reserved (dashed) per step, `x_max` shared with the other lane."""
    scale = alt.Scale(domain=[1, x_max]) if x_max else alt.Undefined
    return (
        alt.Chart(frame, title=title)
        .mark_line(interpolate="step-after")
        .encode(
            x=alt.X("step:Q", title="engine step", scale=scale),
            y=alt.Y("positions:Q", title="KV positions"),
            color=alt.Color(
                "kind:N",
                title=None,
                scale=alt.Scale(domain=[HOLDING, RESERVED], range=["#3b82f6", "#f59e0b"]),
                legend=alt.Legend(orient="bottom"),
            ),
            strokeDash=alt.StrokeDash(
                "kind:N", scale=alt.Scale(domain=[HOLDING, RESERVED], range=[[1, 0], [5, 3]]), legend=None
            ),
            tooltip=[alt.Tooltip("step:Q"), alt.Tooltip("kind:N"), alt.Tooltip("positions:Q")],
        )
        .properties(height=330)  # with its title, axis and legend: about 200 px of plot
    )
