"""Shared engine (everyone's requests). The queue is batched live with every tab's requests on the engine they
share, then replayed on private continuous and static batchers, so both are measured the same way."""

from __future__ import annotations

from functools import partial

import streamlit as st

from app.common.answers import answers_section, stream
from app.common.charts import engine_layout
from app.common.export import export_section
from app.common.frame import current_frame
from app.common.inspector import inspector_section
from app.common.numbers import numbers_section
from app.common.queue import queue_section, run_buttons
from app.common.sidebar import compare_choice
from app.common.streaming import RunStream
from app.shared_engine import run as shared
from app.shared_engine.charts import SHARED_NOTES, comparison_charts, live_charts
from utils.metrics.inspector import waste_meters

RUN_NAMES = {"continuous": "continuous (replay)", "static": "static (replay)", "live": "live (shared engine)"}

frame = current_frame()
compare = compare_choice(frame.controls)
queue = queue_section(frame)
kept: shared.SharedViewRun | None = st.session_state.get(shared.KEY)
buttons = run_buttons(queue, partial(shared.start, frame, compare), shared.stop, kept is not None and kept.running)
if kept is None:
    st.stop()
# From here this script run follows the run: an older one of this tab, still going, stops (app.common.baton).
streaming = RunStream(kept.run, kept.session, compare)
if buttons.running:  # prompts added mid-run join it at once: the engine keeps going
    kept.join(queue, frame.formatted)

run = kept.run
progress_slot, answer_slots = answers_section(run)
layout = engine_layout(SHARED_NOTES)
stream(streaming, progress_slot, answer_slots, partial(live_charts, layout, run))
if compare and run.completed:
    shared.replay_all(frame.service, streaming, kept.setup["engine"], layout.progress)
buttons.run_ended()
runs = comparison_charts(run, compare, layout)
meters = {mode: waste_meters(record) for mode, record in runs.items()}  # each run's, read by both sections
inspector_section(runs, meters, run.labels(), frame.decode, RUN_NAMES)
numbers_section(runs, meters, run.others_seen, weights=frame.service.info.weights)
export_section(runs, run, kept.setup)
