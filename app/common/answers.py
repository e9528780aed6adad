"""2 · Answers: one card per prompt, and the loop that fills them as the engine's events come (from the shared engine
or a remote server), redrawing the progress line and handing the charts' redraws to the view."""

from __future__ import annotations

import time
from collections.abc import Callable

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from app.common.live_run import LiveRun, RequestView
from app.common.streaming import RunStream
from utils.plain_text import card_heading_html

AnswerSlots = tuple[DeltaGenerator, DeltaGenerator]  # a prompt's status line, its answer so far


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
