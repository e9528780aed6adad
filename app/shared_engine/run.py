"""The shared engine view's run: the queue on the batcher every tab shares, live, then replayed on private
continuous and static batchers so both are measured the same way."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from app.common.frame import Frame
from app.common.live_run import REPLAY_ORDER, LiveRun
from app.common.prompt_queue import PromptQueue
from app.common.streaming import RunStream, join_new_items
from app.common.view_run import ViewRunBase, engine_setup
from batching.engine.events import FinishedEvent
from batching.engine.options import BatcherOptions
from batching.service import EngineClient, Session

KEY = "shared_run"


@dataclass
class SharedViewRun(ViewRunBase):
    """The run the shared engine view started: its live view, this tab's session on the shared batcher, the queue
    items in it (prompts added since join it), and what it was asked to do (for the export)."""

    run: LiveRun
    session: Session
    items: set[int]
    setup: dict

    def stop(self) -> None:
        """Planned prompts are dropped here; the engine cancels the ones it has."""
        self.run.stop()
        self.session.cancel_all()

    def join(self, queue: PromptQueue, formatted: Callable[[str], str]) -> None:
        """Prompts queued since the run started join it at once: the shared engine keeps going."""
        join_new_items(self.run, queue.items, self.items, formatted, time.perf_counter())


def engine_session(service: EngineClient, options: BatcherOptions) -> Session:
    """This tab's handle on the shared batcher for `options` (one per batcher, reopened if it was reaped)."""
    sessions: dict[BatcherOptions, Session] = st.session_state.setdefault("engine_sessions", {})
    session = sessions.get(options)
    if session is None or session.closed:
        session = sessions[options] = service.open_session(options)
    return session


def start(frame: Frame, compare: bool, queue: PromptQueue) -> None:
    """Plan every queued prompt with its arrival time; the streaming loop submits them when due."""
    choices = frame.choices
    session = engine_session(frame.service, frame.options)
    run = LiveRun(time.perf_counter(), session.session_id + "/", choices.batch_size, choices.sampling)
    schedule = choices.schedule(len(queue))
    for item, offset in zip(queue.items, schedule.due, strict=True):
        run.plan(item.prompt, frame.formatted(item.prompt), item.max_new_tokens, offset)
    items = {item.item_id for item in queue.items}
    st.session_state[KEY] = SharedViewRun(run, session, items, engine_setup(frame, "shared", compare, 0, schedule))
    st.session_state.queue_message = None


def stop() -> None:
    st.session_state[KEY].stop()


# The live run shared its CPU with the page drawing it (and maybe with other users), so its timings are not a fair
# match for a static run; the headline compares two replays that only differ in how they batch. They run right after
# the live run, before the page is redrawn, so the browser is quiet while they are timed.
def replay_all(service: EngineClient, streaming: RunStream, engine: dict, slot: DeltaGenerator) -> None:
    """Replay the queue in REPLAY_ORDER (resuming where an interrupted script run left off), with a progress bar.

    A replay is counted only while this script run follows the run: an older one, still replaying when a click
    started a newer one, stops instead of counting its replay twice."""
    run = streaming.run
    total = len(REPLAY_ORDER) * len(run.views)
    while (mode := run.next_replay) is not None:
        done = run.replayed * len(run.views)
        text = f"Measuring: replay {run.replayed + 1} of {len(REPLAY_ORDER)}, {mode} batching"
        bar = slot.progress(done / total, text=text)
        with service.private.open_private(mode, BatcherOptions(**engine)) as batcher:  # stepped in the engine process
            replay = batcher.run(*run.replay_queue())
            for event in replay.events():
                if isinstance(event, FinishedEvent):
                    done += 1
                    bar.progress(done / total, text=text)
        with streaming.follower.following() as following:
            if following:
                run.keep_replay(replay.record)
        if not following:
            st.stop()
    slot.empty()
