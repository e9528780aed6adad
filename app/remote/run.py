"""The remote server view's run: after one untimed warm-up request, the queue sent live in one mode (continuous: up
to N in flight, or static: waves of N), then sent again in the other to compare; which goes first alternates."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from app.common.frame import Frame
from app.common.live_run import LiveRun
from app.common.prompt_queue import PromptQueue
from app.common.streaming import RunStream, join_new_items
from app.common.view_run import ViewRunBase
from app.remote.server_choice import RemoteChoice
from batching.remote import (
    MODES,
    WARM_UP_QUESTION,
    Mode,
    RemoteError,
    RemoteRun,
    RunSetup,
    TelemetryPoller,
    warm_up,
)
from batching.remote.fleet import replica_name

KEY = "remote_run"


@dataclass
class RemoteViewRun(ViewRunBase):
    """The run the remote view started: its live view, the live pass on the server, the queue items in it, what it
    was asked to do (for the export), and the second pass in the other mode once it has started."""

    run: LiveRun
    live: RemoteRun
    items: set[int]
    setup: dict
    second: RemoteRun | None = None
    second_labels: dict[str, str] = field(default_factory=dict)  # the second pass's request ids -> #n
    fleet: dict[str, TelemetryPoller] = field(default_factory=dict)  # a fleet: each replica's own /metrics, by name

    def stop(self) -> None:
        """Planned prompts are dropped here; the requests on their way are cut."""
        self.run.stop()
        self.live.cancel_all()
        self.stop_watching()

    def stop_watching(self) -> None:
        """Every pass is over: one last reading of each replica (its counters' final moves), then no more."""
        for poller in self.fleet.values():
            if poller.running:
                poller.stop()
                poller.join()
                poller.read_now()

    def join(self, queue: PromptQueue, formatted: Callable[[str], str]) -> None:
        """Prompts queued since the run started join the live pass at once."""
        join_new_items(self.run, queue.items, self.items, formatted, time.perf_counter())

    def labels(self) -> dict[str, str]:
        """Request id -> #n, for both passes."""
        return {**self.run.labels(), **self.second_labels}

    def prompts(self) -> dict[str, str]:
        """Request id -> its prompt, for both passes."""
        prompts = {view.request_id: view.prompt for view in self.run.views if view.request_id}
        return prompts | {rid: self.run.views[int(label[1:]) - 1].prompt for rid, label in self.second_labels.items()}


def remote_order(compare: bool) -> tuple[Mode, ...]:
    """The modes in the order they run. Each comparison in this tab starts with the mode the last one ran second:
    the second run meets a server the first has just used (its prefix cache, its allocator), so neither always does."""
    if not compare:
        return ("continuous",)
    count = st.session_state.get("remote_comparisons", 0)
    st.session_state.remote_comparisons = count + 1
    return MODES if count % 2 == 0 else MODES[::-1]


def start(frame: Frame, remote: RemoteChoice, compare: bool, queue: PromptQueue) -> None:
    """Warm the server up, then plan the queue as for the built-in engine, on a remote run in the first mode."""
    state = st.session_state
    if remote.problem or remote.endpoint is None or remote.model is None:
        state.queue_message = remote.problem or "choose a remote server first (sidebar)"
        return
    choices = frame.choices
    setup = RunSetup(remote.endpoint, remote.model, choices.batch_size, "continuous", remote.api, choices.system_prompt)
    try:
        with st.spinner("Warming the server up with one short request…"):
            warm = warm_up(setup, frame.formatted(WARM_UP_QUESTION))
    except RemoteError as exc:
        state.queue_message = str(exc)
        return
    order = remote_order(compare)
    run = LiveRun(time.perf_counter(), "", choices.batch_size, choices.sampling, mode=order[0])
    schedule = choices.schedule(len(queue))
    for item, offset in zip(queue.items, schedule.due, strict=True):
        run.plan(item.prompt, frame.formatted(item.prompt), item.max_new_tokens, offset)
    live = RemoteRun(replace(setup, mode=order[0]), start=run.start, telemetry_every_s=remote.telemetry_every_s)
    every = remote.telemetry_every_s
    fleet = {replica_name(replica.root): TelemetryPoller(replica, every) for replica in remote.replicas}
    for poller in fleet.values():  # a first reading before any request of the run, then the poller's own
        poller.read_now()
        poller.start()
    export_setup = {
        "engine": "remote",
        "url": remote.endpoint.root,
        "model": remote.model,
        "api": f"/v1/{remote.api}",
        "requests_in_flight": choices.batch_size,
        "sampling": asdict(choices.sampling),
        "arrivals": schedule.description,
        "system_prompt": choices.system_prompt,
        "compare": compare,
        "warm_up_s": round(warm.seconds, 3),
        "order": list(order),
        "replicas": [replica.root for replica in remote.replicas],
    }
    items = {item.item_id for item in queue.items}
    state[KEY] = RemoteViewRun(run, live, items, export_setup, fleet=fleet)
    state.queue_message = None


def stop() -> None:
    st.session_state[KEY].stop()


def compared(kept: RemoteViewRun, streaming: RunStream, compare: bool, slot: DeltaGenerator) -> dict[str, RemoteRun]:
    """Every pass to report, in the tables' order: the live one, and the other mode's once the live one completed."""
    found: dict[str, RemoteRun] = {kept.live.setup.mode: kept.live}
    if compare and kept.run.completed:
        other = next(mode for mode in MODES if mode != kept.live.setup.mode)
        found[other] = second_pass(kept, streaming, other, slot)
    return {mode: found[mode] for mode in MODES if mode in found}


def second_pass(kept: RemoteViewRun, streaming: RunStream, mode: Mode, slot: DeltaGenerator) -> RemoteRun:
    """The same queue sent again in the other mode (started once, resumed by later script runs), with a progress bar.

    Only the script run that follows the run starts it: an older one, still going when a click started a newer one,
    stops instead of sending the queue a second time."""
    with streaming.follower.following() as following:
        second = _started_second_pass(kept, mode) if following else None
    if second is None:
        st.stop()
    total = len(kept.second_labels)
    while not second.done:
        done = len(second.record.finished)
        text = f"{mode.capitalize()} batching from the client: {done} of {total} answers"
        slot.progress(done / max(total, 1), text=text)
        time.sleep(0.2)
    slot.empty()
    return second


def _started_second_pass(kept: RemoteViewRun, mode: Mode) -> RemoteRun:
    """The second pass, sent now unless an earlier script run sent it."""
    if kept.second is not None:
        return kept.second
    live = kept.live
    second = RemoteRun(replace(live.setup, mode=mode), telemetry_every_s=live.poller.every_s if live.poller else None)
    kept.second_labels = {}  # a pass an earlier script run began but never finished starting is dropped
    for view in kept.run.views:
        if view.request_id is not None:
            submitted = second.submit(view.formatted, kept.run.params(view), at=view.offset_s)
            kept.second_labels[submitted.request_id] = f"#{view.number}"
    second.close()
    kept.second = second
    return second


def order_line(setup: dict) -> str:
    """What the server was sent before the timed runs, and which run went first."""
    return (
        f"Warm-up: one short request ({setup['warm_up_s']:.2f} s) before anything was timed, counted in no figure. "
        f"This time {setup['order'][0]} ran first (live). Which runs first alternates with each comparison, so "
        "neither always meets the server just after the other."
    )
