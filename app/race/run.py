"""The race view's run: the queue on a continuous and a static lane of this tab's own, stepped in turn in the engine
process on fair clocks (`batching.race`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import streamlit as st

from app.common.frame import Frame
from app.common.prompt_queue import PromptQueue
from app.common.view_run import ViewRunBase, engine_setup
from app.race.knobs import SchedulerKnobs
from app.race.lanes import RaceRun
from batching.engine.options import BatcherOptions
from batching.service import RaceHandle

KEY = "race_run"
GRAPHS_WAIT = (
    "The race starts once the compiled steps are made (once per server start, read from the disk cache after), "
    "so both lanes, and every later race, time the same steps."
)


@dataclass
class RaceViewRun(ViewRunBase):
    """The race the race view started: both lanes' view of it, its handle in the engine, the queue items in it
    (prompts added since join both lanes), its slow motion now, and what it was asked to do (for the export)."""

    run: RaceRun
    handle: RaceHandle
    items: set[int]
    pause_ms: int
    setup: dict

    def stop(self) -> None:
        """Prompts yet to arrive on a lane will not; the engine cancels both lanes' running requests."""
        self.run.stop()
        self.handle.stop()

    def follow(self, frame: Frame, queue: PromptQueue, pause_ms: int) -> None:
        """Prompts added since join both lanes at the same clock time; a new slow motion applies now."""
        offset = max(self.run.elapsed.values())
        for item in queue.items:
            if item.item_id in self.items:
                continue
            self.items.add(item.item_id)
            request_id = self.run.plan(item.prompt, frame.formatted(item.prompt), item.max_new_tokens, offset)
            try:
                self.handle.add(frame.formatted(item.prompt), self.run.params(request_id), request_id)
            except ValueError as exc:
                for lane in self.run.lanes.values():
                    lane.refuse(lane.views[-1], str(exc))
        if self.pause_ms != pause_ms:
            self.pause_ms = pause_ms
            self.handle.set_pause(pause_ms / 1000)


def kv_default(frame: Frame, block_size: int) -> int:
    """The KV memory the settings give a batcher with this block size, in token positions (whole blocks)."""
    return frame.service.info.geometry.kv_tokens(replace(frame.options, block_size=block_size))


def memory_budget(frame: Frame, kv_tokens: int) -> str:
    """What the model's weights take beside each lane's KV pool, in one sentence."""
    info = frame.service.info
    pool_mb = info.geometry.pool_mb(kv_tokens, frame.options.max_batch_size)
    weights = f"The model's {info.weights}" if info.weights else "The model's weights"
    return f"{weights}; each lane's KV pool {pool_mb:,.2f} MiB ({kv_tokens:,} positions)."


def lane_options(frame: Frame, kv_tokens: int, knobs: SchedulerKnobs) -> BatcherOptions:
    """Both lanes' batcher: the sidebar's choices, with the scheduler's knobs and the KV memory chosen for the race
    (the admission policy matters to the continuous lane only: static reserves whole waves)."""
    return replace(
        frame.options,
        max_batched_tokens=knobs.token_budget,
        block_size=knobs.block_size,
        admission=knobs.admission,
        kv_blocks=None,
        kv_cache_mb=None,
        kv_cache_tokens=max(kv_tokens, knobs.block_size),
    )


def start(frame: Frame, pause_ms: int, kv_tokens: int, knobs: SchedulerKnobs, queue: PromptQueue) -> None:
    """Start the queue racing on a continuous and a static lane of this tab's own (the same KV memory each), in the
    engine process."""
    state = st.session_state
    options = lane_options(frame, kv_tokens, knobs)
    choices = frame.choices
    schedule = choices.schedule(len(queue))
    race = RaceRun(f"t{id(state)}/", choices.batch_size, choices.sampling)
    for item, offset in zip(queue.items, schedule.due, strict=True):
        race.plan(item.prompt, frame.formatted(item.prompt), item.max_new_tokens, offset)
    try:
        handle = frame.service.private.start_race(options, race.items(), schedule, pause_ms / 1000)
    except ValueError as exc:
        state.queue_message = str(exc)
        return
    items = {item.item_id for item in queue.items}
    state[KEY] = RaceViewRun(
        race, handle, items, pause_ms, engine_setup(frame, "race", True, pause_ms, schedule, options)
    )
    state.queue_message = None


def stop() -> None:
    st.session_state[KEY].stop()
