"""3 · What the engine did (for a remote server: what the client and the server saw): continuous and static side by
side, one row per chart so the two sides line up, drawn into as the run goes on and again once it is over."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from app.live_run import LiveRun
from app.race_view import RaceRun
from batching.remote import MODES, SAMPLE_EVERY_S, Mode, RemoteRun
from batching.runs import RunRecord
from utils.charts import run as run_charts
from utils.charts.run import Owns
from utils.charts.telemetry import CAPTION as TELEMETRY_CAPTION
from utils.charts.telemetry import reported_line, telemetry_chart, telemetry_frame
from utils.charts.waits import CAPTIONS as WAIT_CAPTIONS
from utils.charts.waits import interference_chart, interference_frame, wait_strip_chart, wait_strip_frame

CHARTS = ("occupancy", "latency", "timeline")
CONTINUOUS_LIVE = "Live: your run on the shared engine, drawn as it happens."
CONTINUOUS_REPLAYED = "Your queue replayed on a private continuous batcher, measured the same way as static batching."
STATIC_LATER = "The same queue on a private static batcher (fixed waves), measured after your run."
RACE_NOTES = (
    "Continuous lane: a finished request frees its slot and a waiting one joins on the next step.",
    "Static lane: waves of the batch size; each wave waits for its longest member.",
)
DRAWN_AT_THE_END = "Drawn when the run is over."
SWITCHED_OFF = "The comparison is switched off (sidebar)."
NO_COMPARISON = "No comparison: the run was stopped or some prompts did not finish."
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


@dataclass(frozen=True)
class ChartLayout:
    """The placeholders of section 3: a progress bar (the replays, or a remote run's second pass), each column's
    note, and each row's two sides (continuous, static)."""

    progress: DeltaGenerator
    notes: tuple[DeltaGenerator, DeltaGenerator]
    slots: dict[str, tuple[DeltaGenerator, DeltaGenerator]]


def chart_layout(
    header: str, titles: tuple[str, str], notes: tuple[str, str], captions: dict[str, tuple[str, str]]
) -> ChartLayout:
    """Section 3's header, a progress slot, two titled columns with a note each, then one row per caption pair."""
    st.header(header)
    progress = st.empty()
    left, right = st.columns(2, gap="large")
    left.subheader(titles[0])
    right.subheader(titles[1])
    note_slots = (left.empty(), right.empty())
    for slot, note in zip(note_slots, notes, strict=True):
        slot.caption(note)
    slots = {}
    for name, (left_caption, right_caption) in captions.items():
        left, right = st.columns(2, gap="large")
        slots[name] = (left.empty(), right.empty())
        left.caption(left_caption)
        right.caption(right_caption)
    return ChartLayout(progress, note_slots, slots)


def engine_layout(notes: tuple[str, str] = (CONTINUOUS_LIVE, STATIC_LATER)) -> ChartLayout:
    """Section 3 for the built-in engine: occupancy, latency and the slot timeline."""
    captions = {
        name: (run_charts.CAPTIONS[name], run_charts.CAPTIONS["occupancy_static" if name == "occupancy" else name])
        for name in CHARTS
    }
    captions.update({name: (caption, caption) for name, caption in WAIT_CAPTIONS.items()})
    return chart_layout(
        "3 · What the engine did", ("Continuous batching", "Static batching (same queue)"), notes, captions
    )


def remote_layout(live: Mode) -> ChartLayout:
    """Section 3 for a remote server: the client's view (the same charts) and the server's telemetry."""
    left, right = (REMOTE_LIVE if mode == live else REMOTE_AFTER[mode] for mode in MODES)
    captions = {name: (caption, caption) for name, caption in REMOTE_CAPTIONS.items()}
    titles = ("Continuous: up to N in flight", "Static: waves of N")
    return chart_layout("3 · What the client and the server saw", titles, (left, right), captions)


# --- the built-in engine's charts ----------------------------------------------------------------------------------
def draw_charts(
    layout: ChartLayout,
    run: LiveRun | RaceRun,
    record: RunRecord,
    column: int,
    latency: pd.DataFrame,
    owns: Owns | None,
    x_max: dict | None = None,
) -> None:
    """One run's charts into its column (0 continuous, 1 static); `x_max` shares axes between the two. The wait strip
    and the inter-token gaps (a cell per request and step) once the run is over, so the page's redraws during a run
    stay as light as before."""
    x_max = x_max or {}
    occupancy = run_charts.occupancy_chart(
        run_charts.occupancy_frame(record, owns), run.slots, x_max=x_max.get("steps")
    )
    labels = run.labels()
    timeline = run_charts.timeline_frame(record, labels, owns)
    layout.slots["occupancy"][column].altair_chart(occupancy, width="stretch")
    layout.slots["latency"][column].altair_chart(
        run_charts.latency_chart(run_charts.latency_bars_frame(latency), x_max=x_max.get("seconds")), width="stretch"
    )
    layout.slots["timeline"][column].altair_chart(
        run_charts.timeline_chart(timeline, run.slots, x_max=x_max.get("seconds")), width="stretch"
    )
    if not run.done:
        for name in ("waiting", "interference"):
            layout.slots[name][column].caption(DRAWN_AT_THE_END)
        return
    layout.slots["waiting"][column].altair_chart(wait_strip_chart(wait_strip_frame(record, labels)), width="stretch")
    gaps, prompts = interference_frame(record, labels)
    layout.slots["interference"][column].altair_chart(
        interference_chart(gaps, prompts, x_max=x_max.get("seconds")), width="stretch"
    )


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


def race_charts(race: RaceRun, layout: ChartLayout) -> None:
    """Both lanes' charts on shared axes (seconds on the lanes' clocks), as far as each has got."""
    runs = race.runs()
    shared = {"seconds": max(race.elapsed.values()) or None, "steps": max(len(r.steps) for r in runs.values()) or None}
    for column, mode in enumerate(runs):
        draw_charts(layout, race, runs[mode], column, race.latency_frame(mode), None, shared)


# --- a remote server's charts ---------------------------------------------------------------------------------------
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
