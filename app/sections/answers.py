"""2 · Answers: one card per prompt (one lane, or a race's two side by side), and the loops that fill them as the
engine's events come, redrawing the progress line and handing the charts' redraws to the view."""

from __future__ import annotations

import time
from collections.abc import Callable

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from app.live_run import LiveRun, RequestView
from app.race_view import RaceRun
from app.streaming import RaceStream, RunStream
from utils.plain_text import card_heading_html

AnswerSlots = tuple[DeltaGenerator, DeltaGenerator]  # a prompt's status line, its answer so far
LaneSlots = dict[str, AnswerSlots]  # a race card's answer slots, by lane


def draw_answer(view: RequestView, slots: AnswerSlots) -> None:
    """A prompt's status line and its answer so far, as plain text (never markdown or HTML)."""
    status_slot, text_slot = slots
    status_slot.caption(view.status_line())
    text_slot.text(view.shown_text())


def answers_section(run: LiveRun) -> tuple[DeltaGenerator, list[AnswerSlots]]:
    """One card per prompt (its heading, status and answer); returns the progress line's and the cards' slots."""
    st.header("2 · Answers")
    progress_slot = st.empty()
    answer_slots: list[AnswerSlots] = []
    for index, view in enumerate(run.views):
        if index % 2 == 0:
            row = st.columns(2)
        with row[index % 2].container(border=True):
            st.html(card_heading_html(view.number, view.prompt))  # the prompt as plain text, never markdown
            answer_slots.append((st.empty(), st.empty()))
            draw_answer(view, answer_slots[-1])
    return progress_slot, answer_slots


def race_answers_section(race: RaceRun) -> tuple[DeltaGenerator, list[LaneSlots]]:
    """One card per prompt with its answer on each lane side by side; returns the progress line's and cards' slots."""
    st.header("2 · Answers, racing")
    progress_slot = st.empty()
    progress_slot.markdown(race.progress_line())
    answer_slots: list[LaneSlots] = []
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


def stream(
    streaming: RunStream,
    progress_slot: DeltaGenerator,
    answer_slots: list[AnswerSlots],
    draw_live_charts: Callable[[float], None],
) -> None:
    """Submit prompts as they come due (to the shared engine or a remote server), fold the events in, redraw what
    changed (the live charts through `draw_live_charts(now)`), until the run is done.

    A click elsewhere starts a new script run, whose own `RunStream` takes the run over: this one then stops here.
    """
    run = streaming.run
    while True:
        redraw = streaming.tick()
        if redraw.superseded:
            st.stop()
        for index, view in redraw.answers:
            draw_answer(view, answer_slots[index])
        if redraw.progress:
            progress_slot.markdown(run.progress_line(redraw.now))
            if redraw.live_charts:
                draw_live_charts(redraw.now)
            streaming.charts_drawn(redraw.now)
        if redraw.done:
            return
        time.sleep(streaming.pause())


def race_stream(
    streaming: RaceStream,
    progress_slot: DeltaGenerator,
    answer_slots: list[LaneSlots],
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
