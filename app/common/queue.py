"""1 · The queue: add, load, edit and delete prompts (the queue is kept across views), then Generate and Stop.

Callbacks run before the next script run, with the arguments given when their widget was drawn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from app.common.frame import Frame
from app.common.prompt_queue import Check, PromptQueue, QueueError, has_edits
from batching.bench.workloads import builtin_workload_names, load_workload
from utils.plain_text import escape_markdown

DEFAULT_EXAMPLE = "customer-support"
EMPTY_QUEUE = "the queue is empty: add a prompt or load an example first"
Start = Callable[[PromptQueue], None]  # a view's way to start its run on the queue


def on_add(queue: PromptQueue, check: Check) -> None:
    state = st.session_state
    try:
        queue.add(state.new_prompt, state.new_cap, check)
    except QueueError as exc:
        state.queue_message = str(exc)
        return
    state.queue_message = None
    state.new_prompt = ""


def on_load_example(queue: PromptQueue, check: Check, default_cap: int) -> None:
    state = st.session_state
    workload = load_workload(state.example)
    pairs = [(r.prompt, r.max_new_tokens or default_cap) for r in workload.requests]
    try:
        queue.replace_all(pairs, check)
    except QueueError as exc:
        state.queue_message = f"{state.example}: {exc}"
        return
    state.queue_message = None


def on_clear(queue: PromptQueue) -> None:
    queue.clear()
    st.session_state.queue_message = None


def on_generate(queue: PromptQueue, start: Start) -> None:
    if not len(queue):
        st.session_state.queue_message = EMPTY_QUEUE
        return
    start(queue)


def queue_section(frame: Frame) -> PromptQueue:
    """Add, load, edit and delete prompts; returns the queue (this tab's, whichever view shows it)."""
    queue: PromptQueue = st.session_state.queue
    st.header("1 · Queue your prompts")
    add_col, example_col = st.columns([3, 2], gap="large")
    with add_col:
        add_prompt(frame, queue)
    with example_col:
        examples = builtin_workload_names()
        st.selectbox("Example workload", examples, index=examples.index(DEFAULT_EXAMPLE), key="example")
        load_col, clear_col = st.columns(2)
        load_col.button(
            "Load example",
            on_click=on_load_example,
            args=(queue, frame.check_prompt, frame.settings.generation.max_new_tokens),
            width="stretch",
            help="Replaces the queue.",
        )
        clear_col.button("Clear all", on_click=on_clear, args=(queue,), width="stretch")
    queue_table(frame, queue)
    return queue


def add_prompt(frame: Frame, queue: PromptQueue) -> None:
    """A prompt box, its cap, and Add."""
    max_cap = frame.builder.max_new_tokens
    st.text_input("Prompt", key="new_prompt", placeholder="e.g. How do I track my order?")
    cap_col, button_col = st.columns([2, 1], vertical_alignment="bottom")
    # Text, not a number box: a number box turns 2.5 into 2 and 1e3 into 1; the queue refuses them as typed.
    cap_col.text_input(
        "Max new tokens",
        value=str(frame.settings.generation.max_new_tokens),
        key="new_cap",
        help=f"A whole number from 1 to {max_cap}.",
    )
    button_col.button("Add", on_click=on_add, args=(queue, frame.check_prompt), type="primary", width="stretch")


def queue_table(frame: Frame, queue: PromptQueue) -> None:
    """The queue as an editable table (caps, deleted rows), the message about the last change, and a count."""
    state = st.session_state
    max_cap = frame.builder.max_new_tokens
    # Edits made in the table last time go into the canonical queue, then the table is drawn afresh from it.
    version = queue.table_version
    edits = state.get(f"queue_editor_{version}")
    if has_edits(edits):
        problems = queue.apply_table_edits(version, edits, frame.check_prompt)
        if problems is not None:  # None: an older script run of this tab applied them (and said how it went)
            state.queue_message = "; ".join(problems) or None
    editor_key = f"queue_editor_{queue.table_version}"

    if state.queue_message:  # prompts typed, or a remote server's answer: shown as text
        st.error(escape_markdown(state.queue_message))
    st.data_editor(
        queue.editor_frame(),
        key=editor_key,
        num_rows="delete",
        hide_index=False,
        disabled=["prompt"],
        width="stretch",
        column_config={
            "prompt": st.column_config.TextColumn("prompt", width="large"),
            "max_new_tokens": st.column_config.TextColumn(  # text, so bad input is refused as typed
                "max new tokens", help=f"Edit to change this prompt's cap: a whole number from 1 to {max_cap}."
            ),
        },
    )
    st.caption(
        f"{len(queue)} of {queue.max_items} prompts · edit a cap in the table, select rows and delete to remove them"
    )


@dataclass
class RunButtons:
    """Generate and Stop, in a placeholder of their own, so a run that ends during a script run can put Generate
    back in place and the page go on to its numbers (a rerun would cost the page a second redraw)."""

    slot: DeltaGenerator
    queue: PromptQueue
    start: Start
    stop: Callable[[], None]
    running: bool  # a run was going on when the script run began

    def draw(self, running: bool, key_suffix: str = "") -> None:
        with self.slot.container():
            go_col, stop_col, _ = st.columns([1, 1, 4])
            go_col.button(
                "Generate",
                key=f"generate{key_suffix}",
                on_click=on_generate,
                args=(self.queue, self.start),
                type="primary",
                disabled=running,
                width="stretch",
            )
            stop_col.button("Stop", key=f"stop{key_suffix}", on_click=self.stop, disabled=not running, width="stretch")

    def run_ended(self) -> None:
        """The run this script run followed has ended: Generate is back (under other keys: a key is drawn once)."""
        if self.running:
            self.draw(False, key_suffix="-after-run")


def run_buttons(queue: PromptQueue, start: Start, stop: Callable[[], None], running: bool) -> RunButtons:
    """Generate (which starts the view's run on the queue) and Stop, under the queue."""
    buttons = RunButtons(st.empty(), queue, start, stop, running)
    buttons.draw(running)
    return buttons
