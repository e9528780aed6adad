"""Load sweep. The prompt mix at a list of request rates, each rate a race of both schedules on their own clocks:
latency, throughput and SLO attainment against the rate, each curve's knee, and the load each sustains."""

from __future__ import annotations

from functools import partial

import streamlit as st

from app.common.frame import current_frame
from app.sweep import run as sweep
from app.sweep.form import sweep_form
from app.sweep.results import follow, sweep_layout, table_section

frame = current_frame()
kept: sweep.SweepViewRun | None = st.session_state.get(sweep.KEY)
buttons = sweep_form(frame, partial(sweep.start, frame), sweep.stop, kept is not None and kept.running)
if kept is None:
    st.stop()
layout = sweep_layout(kept.run)
if buttons.running:
    follow(kept.run, layout)
    buttons.run_ended()
table_section(kept.run, kept.setup)
