"""Shared engine (everyone's requests). The queue is batched live with every tab's requests on the engine they
share, then replayed on private continuous and static batchers, so both are measured the same way."""

from __future__ import annotations

from functools import partial

import streamlit as st

from app.frame import current_frame
from app.runs import shared
from app.sections.answers import answers_section, stream
from app.sections.charts import comparison_charts, engine_layout, live_charts
from app.sections.export import export_section
from app.sections.inspector import inspector_section
from app.sections.numbers import numbers_section
from app.sections.queue import queue_section, run_buttons
from app.sidebar import compare_choice
from app.streaming import RunStream
from utils.metrics.inspector import waste_meters

frame = current_frame()
compare = compare_choice(frame.controls)
queue = queue_section(frame)
kept: shared.SharedViewRun | None = st.session_state.get(shared.KEY)
buttons = run_buttons(queue, partial(shared.start, frame, compare), shared.stop, kept is not None and kept.running)
if kept is None:
    st.stop()
# From here this script run follows the run: an older one of this tab, still going, stops (app.baton).
streaming = RunStream(kept.run, kept.session, compare)
if buttons.running:  # prompts added mid-run join it at once: the engine keeps going
    kept.join(queue, frame.formatted)

run = kept.run
progress_slot, answer_slots = answers_section(run)
layout = engine_layout()
stream(streaming, progress_slot, answer_slots, partial(live_charts, layout, run))
if compare and run.completed:
    shared.replay_all(frame.service, streaming, kept.setup["engine"], layout.progress)
buttons.run_ended()
runs = comparison_charts(run, compare, layout)
meters = {mode: waste_meters(record) for mode, record in runs.items()}  # each run's, read by both sections
inspector_section(runs, meters, run.labels(), frame.decode)
numbers_section(runs, meters, run.others_seen, weights=frame.service.info.weights)
export_section(runs, run, kept.setup)
