"""2 · Answers, racing: one card per prompt with its answer on each lane side by side, and the loop that fills them as
both lanes' steps come, redrawing the progress line and handing the charts' redraws to the view."""

from __future__ import annotations

import time
from collections.abc import Callable

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from app.common.answers import AnswerSlots, draw_answer
from app.race.lanes import RaceRun
from app.race.stream import RaceStream
from utils.plain_text import card_heading_html

RaceCardSlots = dict[str, AnswerSlots]  # a race card's answer slots, by lane


def race_answers_section(race: RaceRun) -> tuple[DeltaGenerator, list[RaceCardSlots]]:
    """One card per prompt with its answer on each lane side by side; returns the progress line's and cards' slots."""
    st.header("2 · Answers, racing")
    progress_slot = st.empty()
    progress_slot.markdown(race.progress_line())
    answer_slots: list[RaceCardSlots] = []
    for index, view in enumerate(race.views):
        if index % 2 == 0:
            row = st.columns(2)
        with row[index % 2].container(border=True):
            st.html(card_heading_html(view.number, view.prompt))
            lanes = dict(zip(race.lanes, st.columns(2), strict=True))
            answer_slots.append({})
            for mode, column in lanes.items():
                column.caption(f"**{mode}**")
                answer_slots[-1][mode] = (column.empty(), column.empty())
                draw_answer(race.lanes[mode].views[index], answer_slots[-1][mode])
    return progress_slot, answer_slots


def race_stream(
    streaming: RaceStream,
    progress_slot: DeltaGenerator,
    answer_slots: list[RaceCardSlots],
    draw_charts: Callable[[], None],
) -> None:
    """Fold both lanes' steps in as they come and redraw what changed, until the engine says the race is over (or
    a newer script run's `RaceStream` took the race over: this one then stops here)."""
    race = streaming.race
    while True:
        redraw = streaming.tick()
        if redraw.superseded:
            st.stop()
        for mode, index, view in redraw.answers:
            draw_answer(view, answer_slots[index][mode])
        if redraw.answers or redraw.charts:  # one cheap line: kept in step with the answers
            progress_slot.markdown(race.progress_line())
        if redraw.charts:
            draw_charts()
            streaming.charts_drawn(redraw.now)
        if redraw.done:
            return
        time.sleep(streaming.pause())
