"""Race: continuous vs static. The queue races on a continuous and a static lane of this tab's own, side by side and
live, on clocks that count only each lane's own steps; then the same inspector, numbers and export as elsewhere."""

from __future__ import annotations

from functools import partial

import streamlit as st

from app.common.charts import engine_layout
from app.common.export import export_section
from app.common.frame import current_frame
from app.common.inspector import inspector_section
from app.common.numbers import numbers_section
from app.common.queue import queue_section, run_buttons
from app.race import run as race
from app.race.answers import race_answers_section, race_stream
from app.race.charts import RACE_NOTES, race_charts
from app.race.knobs import kv_memory, scheduler_knobs, slow_motion
from app.race.memory import memory_charts, memory_layout
from app.race.stream import RaceStream
from utils.metrics.inspector import waste_meters

RUN_NAMES = {"continuous": "continuous (race lane)", "static": "static (race lane)"}  # the inspector's picker

frame = current_frame()
pause_ms = slow_motion(frame.controls)
knobs = scheduler_knobs(frame.controls, frame.settings)
kv_tokens = kv_memory(frame.controls, race.kv_default(frame, knobs.block_size), knobs.block_size)
queue = queue_section(frame)
kept: race.RaceViewRun | None = st.session_state.get(race.KEY)
buttons = run_buttons(
    queue, partial(race.start, frame, pause_ms, kv_tokens, knobs), race.stop, kept is not None and kept.running
)
if kept is None:
    st.stop()
# From here this script run follows the race: an older one of this tab, still going, stops (app.common.baton).
streaming = RaceStream(kept.run, kept.handle)
if buttons.running:  # prompts added since join both lanes; a new slow motion applies now
    kept.follow(frame, queue, pause_ms)

lanes = kept.run
progress_slot, answer_slots = race_answers_section(lanes)
if buttons.running and not any(lanes.elapsed.values()) and frame.service.lifecycle.stats.compile.stage == "compiling":
    progress_slot.info(race.GRAPHS_WAIT)
layout = engine_layout(RACE_NOTES)
memory = memory_layout(tuple(lanes.lanes), race.memory_budget(frame, kv_tokens))


def draw_charts() -> None:
    race_charts(lanes, layout)
    memory_charts(lanes, memory)


race_stream(streaming, progress_slot, answer_slots, draw_charts)
if buttons.running:  # the race ended during this script run
    kept.handle.close()
    buttons.run_ended()
runs = lanes.runs()
meters = {mode: waste_meters(record) for mode, record in runs.items()}  # each lane's, read by both sections
inspector_section(runs, meters, lanes.labels(), frame.decode, RUN_NAMES)
numbers_section(runs, meters, False, lanes, frame.service.info.weights)
export_section(runs, lanes.lanes["continuous"], kept.setup)
