"""3 · What the engine did (for a remote server: what the client and the server saw): continuous and static side by
side, one row per chart so the two sides line up, drawn into as the run goes on and again once it is over. The
layout every view draws into, and one built-in engine run's charts; each view fills it its own way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import pandas as pd
import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from batching.runs import RunRecord
from utils.charts import run as run_charts
from utils.charts.run import Owns
from utils.charts.waits import CAPTIONS as WAIT_CAPTIONS
from utils.charts.waits import interference_chart, interference_frame, wait_strip_chart, wait_strip_frame

CHARTS = ("occupancy", "latency", "timeline")
DRAWN_AT_THE_END = "Drawn when the run is over."
SWITCHED_OFF = "The comparison is switched off (sidebar)."
NO_COMPARISON = "No comparison: the run was stopped or some prompts did not finish."


class ChartedRun(Protocol):
    """What a run's charts read of its live view (a `LiveRun`, a race's `RaceRun`): its slots, its labels, whether
    it is over."""

    @property
    def slots(self) -> int: ...

    @property
    def done(self) -> bool: ...

    def labels(self) -> dict[str, str]: ...


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


def engine_layout(notes: tuple[str, str]) -> ChartLayout:
    """Section 3 for the built-in engine: occupancy, latency and the slot timeline."""
    captions = {
        name: (run_charts.CAPTIONS[name], run_charts.CAPTIONS["occupancy_static" if name == "occupancy" else name])
        for name in CHARTS
    }
    captions.update({name: (caption, caption) for name, caption in WAIT_CAPTIONS.items()})
    return chart_layout(
        "3 · What the engine did", ("Continuous batching", "Static batching (same queue)"), notes, captions
    )


def draw_charts(
    layout: ChartLayout,
    run: ChartedRun,
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
