"""3 · What the client and the server saw: each pass's client charts (the built-in engine's own builders) and the
server's telemetry, continuous and static side by side."""

from __future__ import annotations

import math

import pandas as pd

from app.common.charts import NO_COMPARISON, SWITCHED_OFF, ChartLayout, chart_layout
from app.common.live_run import LiveRun
from batching.remote import MODES, SAMPLE_EVERY_S, Mode, RemoteRun
from utils.charts import run as run_charts
from utils.charts.telemetry import CAPTION as TELEMETRY_CAPTION
from utils.charts.telemetry import reported_line, telemetry_chart, telemetry_frame

REMOTE_LIVE = "Live: your run, drawn as it happens."
REMOTE_AFTER = {
    "continuous": "The same queue sent again with up to N in flight (continuous batching from the client), after the "
    "live run.",
    "static": "The same queue sent again in waves of N (static batching from the client), after the live run.",
}
REMOTE_CAPTIONS = {
    "occupancy": (
        f"Requests this page had in flight, sampled every {SAMPLE_EVERY_S:g} s; the dashed line is N. Amber: answers "
        "already finished but still holding their place in a static wave."
    ),
    "latency": run_charts.CAPTIONS["latency"],
    "timeline": "One row per client lane (a request in flight), one bar per request holding it.",
    "server": TELEMETRY_CAPTION,
}


def remote_layout(live: Mode) -> ChartLayout:
    """Section 3 for a remote server: the client's view (the same charts) and the server's telemetry."""
    left, right = (REMOTE_LIVE if mode == live else REMOTE_AFTER[mode] for mode in MODES)
    captions = {name: (caption, caption) for name, caption in REMOTE_CAPTIONS.items()}
    titles = ("Continuous: up to N in flight", "Static: waves of N")
    return chart_layout("3 · What the client and the server saw", titles, (left, right), captions)


def draw_remote(
    layout: ChartLayout, column: int, remote: RemoteRun, latency: pd.DataFrame, labels: dict[str, str], x_max: dict
) -> None:
    """One remote run's client charts (the built-in engine's own builders) and the server's telemetry."""
    record, lanes = remote.record, remote.setup.lanes
    occupancy = run_charts.occupancy_chart(
        run_charts.occupancy_frame(record),
        lanes,
        title="Requests in flight from this page",
        x_max=x_max.get("steps"),
        x_title=f"client sample (every {SAMPLE_EVERY_S:g} s)",
    )
    layout.slots["occupancy"][column].altair_chart(occupancy, width="stretch")
    layout.slots["latency"][column].altair_chart(
        run_charts.latency_chart(run_charts.latency_bars_frame(latency), x_max=x_max.get("seconds")), width="stretch"
    )
    timeline = run_charts.timeline_frame(record, labels)
    layout.slots["timeline"][column].altair_chart(
        run_charts.timeline_chart(timeline, lanes, title="Client lanes", x_max=x_max.get("seconds")), width="stretch"
    )
    samples = remote.telemetry()
    server = layout.slots["server"][column].container()
    if samples:
        frame = telemetry_frame(samples, record.start)
        server.altair_chart(telemetry_chart(frame, x_max=x_max.get("seconds")), width="stretch")
    sources = (
        {}
        if remote.poller is None
        else {"/metrics": remote.poller.metrics_available, "/slots": remote.poller.slots_available}
    )
    server.caption(reported_line(samples, sources))


def live_remote_charts(layout: ChartLayout, run: LiveRun, remote: RemoteRun, now: float) -> None:
    """The live pass so far, in its mode's column."""
    draw_remote(layout, MODES.index(remote.setup.mode), remote, run.latency_frame(now), run.labels(), {})


def remote_comparison_charts(
    layout: ChartLayout, runs: dict[str, RemoteRun], compare: bool, labels: dict[str, str]
) -> None:
    """Every pass on shared axes in its mode's column; a column without one says why."""
    walls = [remote.record.wall_s for remote in runs.values() if math.isfinite(remote.record.wall_s)]
    shared = {"seconds": max(walls, default=None), "steps": max(len(remote.record.steps) for remote in runs.values())}
    for column, mode in enumerate(MODES):
        if mode in runs:
            latency = run_charts.latency_frame(runs[mode].record, labels)
            draw_remote(layout, column, runs[mode], latency, labels, shared)
        else:
            layout.slots["occupancy"][column].info(SWITCHED_OFF if not compare else NO_COMPARISON)
