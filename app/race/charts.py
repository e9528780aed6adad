"""3 · What the engine did, racing: both lanes' charts side by side on shared axes, on the lanes' own clocks."""

from __future__ import annotations

from app.common.charts import ChartLayout, draw_charts
from app.race.lanes import RaceRun

RACE_NOTES = (
    "Continuous lane: a finished request frees its slot and a waiting one joins on the next step.",
    "Static lane: waves of the batch size; each wave waits for its longest member.",
)


def race_charts(race: RaceRun, layout: ChartLayout) -> None:
    """Both lanes' charts on shared axes (seconds on the lanes' clocks), as far as each has got."""
    runs = race.runs()
    shared = {"seconds": max(race.elapsed.values()) or None, "steps": max(len(r.steps) for r in runs.values()) or None}
    for column, mode in enumerate(runs):
        draw_charts(layout, race, runs[mode], column, race.latency_frame(mode), None, shared)
