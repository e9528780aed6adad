"""Remote server. The queue goes to any OpenAI-compatible server, live in one mode (continuous: up to N requests in
flight; static: waves of N), then again in the other; every time is the client's, next to the server's telemetry
(and, through a fleet's router, each replica's, side by side)."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import streamlit as st

from app.common.answers import answers_section, stream
from app.common.frame import current_frame
from app.common.queue import queue_section, run_buttons
from app.common.sidebar import compare_choice
from app.common.streaming import RunStream
from app.remote import run as remote
from app.remote.charts import live_remote_charts, remote_comparison_charts, remote_layout
from app.remote.export import remote_export_section
from app.remote.fleet import draw_fleet, fleet_layout
from app.remote.numbers import remote_failures, remote_numbers_section
from app.remote.server_choice import remote_server_choice

REMOTE_NOTE = (
    "Remote server: every time here is measured by this page's client, so it includes the network and whatever "
    "else the server is doing for other clients. The server batches as it likes; continuous keeps up to N requests "
    "in flight, static sends waves of N and waits for each wave's slowest answer (N = the batch size slider)."
)
REMOTE_RUN_NOTE = (
    "On a remote server: continuous (up to N requests in flight) and static waves of N, after one warm-up request; "
    "which runs first alternates with each comparison."
)

frame = current_frame()
server = remote_server_choice(frame.settings, frame.controls)
compare = compare_choice(frame.controls, REMOTE_RUN_NOTE)
frame = replace(frame, chat_server=server.api == "chat")  # a chat server applies its own template
queue = queue_section(frame)
kept: remote.RemoteViewRun | None = st.session_state.get(remote.KEY)
start = partial(remote.start, frame, server, compare)
buttons = run_buttons(queue, start, remote.stop, kept is not None and kept.running)
if kept is None:
    st.stop()
# From here this script run follows the run: an older one of this tab, still going, stops (app.common.baton).
streaming = RunStream(kept.run, kept.live, compare)
if buttons.running:  # prompts added mid-run join the live pass at once
    kept.join(queue, frame.formatted)

run, live = kept.run, kept.live
st.info(REMOTE_NOTE)
st.caption(remote.order_line(kept.setup))
progress_slot, answer_slots = answers_section(run)
layout = remote_layout(live.setup.mode)
replicas = kept.fleet
fleet = fleet_layout(list(replicas)) if replicas else None


def draw_live(now: float) -> None:
    live_remote_charts(layout, run, live, now)
    if fleet is not None:
        draw_fleet(fleet, replicas, run.start)


stream(streaming, progress_slot, answer_slots, draw_live)
live.close()
runs = remote.compared(kept, streaming, compare, layout.progress)
kept.stop_watching()
if fleet is not None:
    draw_fleet(fleet, replicas, run.start)
buttons.run_ended()
labels = kept.labels()
remote_comparison_charts(layout, runs, compare, labels)
remote_failures(runs)
remote_numbers_section(runs)
remote_export_section(runs, labels, kept.prompts(), kept.setup)
