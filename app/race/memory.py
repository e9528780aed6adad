"""KV memory, in section 3: both race lanes' block pools side by side on the same budget, drawn as steps stream in
(the pool by state, positions holding tokens against reserved, each running request's block table, preemptions
and prefix hits)."""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from app.race.lanes import RaceRun
from utils.charts.memory import POOL_CAPTION, STEPS_CAPTION, memory_steps_chart, pool_chart
from utils.metrics.memory import (
    block_tables_frame,
    last_memory,
    memory_numbers,
    memory_steps_frame,
    peak_memory,
    pool_frame,
)

HEADER = "KV memory: the block pool"
TABLES_NOW = "Block tables now (block ids each running request holds, in order):"
TABLES_PEAK = "Block tables at the step that held the most blocks:"


@dataclass(frozen=True)
class LaneSlots:
    """One lane's placeholders: its numbers line, pool, positions over steps, and block tables."""

    numbers: DeltaGenerator
    pool: DeltaGenerator
    steps: DeltaGenerator
    tables: DeltaGenerator


def memory_layout(modes: tuple[str, ...], budget: str = "") -> dict[str, LaneSlots]:
    """The memory part's header, caption (with what the weights and each lane's pool take) and one column of
    placeholders per lane."""
    st.subheader(HEADER)
    st.caption(POOL_CAPTION + (f" {budget}" if budget else ""))
    columns = st.columns(len(modes), gap="large")
    slots = {}
    for mode, column in zip(modes, columns, strict=True):
        column.markdown(f"**{mode}**")
        numbers, pool, steps = column.empty(), column.empty(), column.empty()
        column.caption(STEPS_CAPTION)
        slots[mode] = LaneSlots(numbers, pool, steps, column.empty())
    return slots


def memory_charts(race: RaceRun, slots: dict[str, LaneSlots]) -> None:
    """Each lane's pool after its latest step, its positions over the steps (shared axis), and its block tables
    (now while it runs, at its peak once it is done)."""
    runs = race.runs()
    x_max = max(len(run.steps) for run in runs.values()) or None
    labels = race.labels()
    for mode, lane in slots.items():
        run = runs[mode]
        numbers, view = memory_numbers(run), last_memory(run)
        if numbers is None or view is None:
            lane.numbers.caption("No step yet.")
            continue
        lane.numbers.markdown(numbers.line())
        lane.pool.altair_chart(pool_chart(pool_frame(view), f"{mode}: the pool now"), width="stretch")
        lane.steps.altair_chart(memory_steps_chart(memory_steps_frame(run), x_max), width="stretch")
        done = race.lanes[mode].done
        shown = peak_memory(run) if done else view
        with lane.tables.container():
            st.caption(TABLES_PEAK if done else TABLES_NOW)
            st.dataframe(block_tables_frame(shown or view, labels), hide_index=True, width="stretch")
