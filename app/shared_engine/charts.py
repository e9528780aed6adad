"""3 · What the engine did on the shared engine: the live run as it happens in the continuous column, then the
replays on private continuous and static batchers side by side."""

from __future__ import annotations

from app.common.charts import NO_COMPARISON, SWITCHED_OFF, ChartLayout, draw_charts
from app.common.live_run import LiveRun
from batching.remote import MODES
from batching.runs import RunRecord
from utils.charts import run as run_charts

CONTINUOUS_LIVE = "Live: your run on the shared engine, drawn as it happens."
CONTINUOUS_REPLAYED = "Your queue replayed on a private continuous batcher, measured the same way as static batching."
STATIC_LATER = "The same queue on a private static batcher (fixed waves), measured after your run."
SHARED_NOTES = (CONTINUOUS_LIVE, STATIC_LATER)


def live_charts(layout: ChartLayout, run: LiveRun, now: float) -> None:
    """The live run on the shared engine so far, in the continuous column (other users' requests shown as such)."""
    draw_charts(layout, run, run.record, 0, run.latency_frame(now), run.owns)


def comparison_charts(run: LiveRun, compare: bool, layout: ChartLayout) -> dict[str, RunRecord]:
    """Draw the replays side by side (or say why there are none); returns every run to report, by name."""
    runs = {"live": run.record}
    if not compare:
        layout.slots["occupancy"][1].info(SWITCHED_OFF)
    elif not run.completed:
        layout.slots["occupancy"][1].info(NO_COMPARISON)
    else:
        runs = {**{mode: run.replays[mode] for mode in MODES}, "live": run.record}
        shared = {
            "seconds": max(runs[mode].wall_s for mode in MODES),
            "steps": max(len(runs[mode].steps) for mode in MODES),
        }
        layout.notes[0].caption(CONTINUOUS_REPLAYED)
        labels = run.labels()
        for column, mode in enumerate(MODES):
            draw_charts(layout, run, runs[mode], column, run_charts.latency_frame(runs[mode], labels), None, shared)
    return runs
