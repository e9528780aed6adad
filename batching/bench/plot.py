"""The benchmark's PNG: per mode, batch occupancy per step beside the latency of each request, and the token grid.

The charts are the page's own (`utils.charts.run`), so the file shows what the app shows; vl-convert renders offline.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import altair as alt
import pandas as pd

from batching.runs import RunRecord
from utils.charts.inspector import token_grid_chart
from utils.charts.run import latency_bars_frame, latency_chart, occupancy_chart, occupancy_frame
from utils.charts.run import latency_frame as charts_latency_frame
from utils.metrics.inspector import grid_frame


def latency_frame(run: RunRecord) -> pd.DataFrame:
    """Per-request bars, labelled #1, #2... in workload order (request ids are q0, q1, ...)."""
    labels = {event.request_id: f"#{int(event.request_id[1:]) + 1}" for event in run.finished}
    return latency_bars_frame(charts_latency_frame(run, labels))


def bench_chart(runs: Mapping[str, RunRecord], slots: int, title: str) -> alt.VConcatChart:
    """One row per mode: occupancy per step, latency per request; the rows share their step and time axes."""
    longest = max((run.wall_s for run in runs.values()), default=0.0)
    most_steps = max((len(run.steps) for run in runs.values()), default=0)
    rows = []
    for mode, run in runs.items():
        heading = f"{mode}: batch occupancy per step"
        occupancy = occupancy_chart(occupancy_frame(run), slots, title=heading, x_max=most_steps or None)
        latency = latency_chart(latency_frame(run), title=f"{mode}: latency per request", x_max=longest)
        pair = alt.hconcat(occupancy.properties(width=420), latency.properties(width=420))
        rows.append(pair.resolve_scale(color="independent"))
        if any(step.rows for step in run.steps):  # the token grid: what each slot did at each step
            frame, width = grid_frame(run, {}, max_columns=400)
            grid = token_grid_chart(frame, slots, width, title=f"{mode}: what each slot did", selectable=False)
            rows.append(grid.properties(width=880))
    return alt.vconcat(*rows).properties(title=title).resolve_scale(color="independent")


def save_plot(runs: Mapping[str, RunRecord], slots: int, path: Path, workload: str) -> None:
    """Render the charts to a PNG (altair's save, through vl-convert: no browser, no network)."""
    bench_chart(runs, slots, f"Batchscope benchmark: {workload}").save(str(path), format="png")
