"""4 · Inside the steps: one run's token grid and waste meters, and one step looked at closely (its rows, the packed
sequence the linear layers saw, its attention mask, and a static wave's padded rectangle)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import streamlit as st

from batching.engine.batcher import MODES
from batching.engine.events import StepEvent
from batching.runs import RunRecord
from utils.charts.inspector import GRID_CAPTION, MASK_CAPTION, mask_chart, packed_sequence_html, token_grid_chart
from utils.metrics.attention_mask import mask_frame, padded_rectangle, window_name
from utils.metrics.inspector import WasteMeters, grid_frame, packed_tokens, step_rows_frame, step_waiting_frame

Decode = Callable[[Sequence[int]], str]


def inspector_section(
    runs: dict[str, RunRecord],
    meters: dict[str, WasteMeters],
    labels: dict[str, str],
    decode: Decode,
    names: dict[str, str],
) -> None:
    """The token grid of one run, its waste meters, and one step looked at closely (picked on the grid or slider);
    `names` says what each run is, for the picker."""
    st.header("4 · Inside the steps")
    modes = [name for name in (*MODES, "live") if name in runs]
    mode = st.radio("Run", modes, horizontal=True, key="inspect_run", format_func=names.get)
    record = runs[mode]
    if not any(step.rows for step in record.steps):
        st.info("This run has no step detail to show.")
        return
    waste = meters[mode]
    columns = st.columns(6)
    columns[0].metric("slot-steps doing work", f"{waste.slot_use:.0%}", help="of slots × steps")
    columns[1].metric("held by finished requests", waste.slot_steps_held, help="slot-steps (static waves)")
    columns[2].metric("padding tokens computed", waste.padding_tokens)
    columns[3].metric("tokens per step", f"{waste.tokens_per_step_mean:.1f}", help="prompt + decode, mean")
    columns[4].metric("token budget filled", f"{waste.budget_fill_mean:.1%}", help="mean over steps")
    columns[5].metric(
        "KV reserved, never used",
        "–" if waste.kv_reserved == 0 else f"{waste.kv_unused_share:.0%}",
        help=f"{waste.kv_reserved_unused:,} of {waste.kv_reserved:,} reserved KV positions held no token, summed "
        "over steps (position-steps)",
    )
    frame, width = grid_frame(record, labels)
    if width > 1:
        st.caption(f"{len(record.steps)} steps: each column shows {width} steps (the kind a slot had most often).")
    event = st.altair_chart(
        token_grid_chart(frame, record.slots, width), on_select="rerun", key=f"grid_{mode}", width="stretch"
    )
    st.caption(GRID_CAPTION)
    step_key = f"inspect_step_{mode}"
    picked = [point["first_step"] for point in event.selection.get("step", []) if "first_step" in point]
    if picked and st.session_state.get(step_key + "_picked") != picked[0]:
        st.session_state[step_key + "_picked"] = picked[0]
        st.session_state[step_key] = picked[0] + 1  # the slider counts steps from 1
    number = st.slider("Step", 1, len(record.steps), key=step_key) if len(record.steps) > 1 else 1
    step_section(record.steps[number - 1], labels, decode)
    mask_section(record, number - 1, mode, labels)


def step_section(step: StepEvent, labels: dict[str, str], decode: Decode) -> None:
    """One forward pass: its rows, the packed sequence the linear layers saw, and the token budget it used."""
    packed = sum(row.tokens + row.padding for row in step.rows)
    budget = step.token_budget or packed
    st.progress(min(1.0, packed / budget), text=f"{packed} tokens packed into this step, of a budget of {budget}")
    st.dataframe(step_rows_frame(step, labels), hide_index=True, width="stretch")
    st.caption(
        "The packed sequence (one colour per request, padding outlined in red): every row's new tokens side by side "
        "in one sequence, so the linear layers compute real tokens only. Other users' tokens show as •."
    )
    st.html(packed_sequence_html(packed_tokens(step, labels, decode)))
    if step.waiting:
        st.markdown(f"**{len(step.waiting)} waiting this step, and why**")
        st.table(step_waiting_frame(step, labels).set_index("request"))
    else:
        st.caption("No request waited this step.")


def mask_section(record: RunRecord, number: int, mode: str, labels: dict[str, str]) -> None:
    """The attention mask of step `number` as the engine built it (per sliding window), and a static wave's padded
    rectangle."""
    mask = record.steps[number].mask
    if mask is None:
        st.info("This step carries no description of its attention mask.")
        return
    if mask.recurrent_layers:
        st.info(
            f"{mask.recurrent_layers} of this model's layers are convolution, SSM or linear-attention layers: they "
            "have no attention mask to draw. Each request's tokens run through that request's own state (zeroed when "
            "it is admitted, carried from chunk to chunk), never another's. "
            + ("The mask below is what its attention layers use." if mask.windows else "It has no attention layers.")
        )
    windows = mask.windows
    if not windows:
        return
    picked = 0
    if len(windows) > 1:  # by index: None (full attention) would read as "nothing picked"
        names = [window_name(window) for window in windows]
        picked = st.radio(
            "Layers", range(len(windows)), horizontal=True, key=f"mask_{mode}", format_func=names.__getitem__
        )
    window = windows[picked]
    frame, stride = mask_frame(record.steps[number], labels, window)
    if stride > 1:
        st.caption(
            f"This step's mask has {mask.queries:,} queries × {mask.keys:,} keys: drawn at one query and one key in "
            f"{stride}; hover a cell for the query and key it stands for."
        )
    title = f"step {number + 1}: attention mask ({window_name(window)} layers)"
    st.altair_chart(mask_chart(frame, stride, title), width="stretch")
    st.caption(MASK_CAPTION)
    rectangle = padded_rectangle(record, number) if record.mode == "static" else None
    if rectangle is not None:
        st.markdown(
            f"**Padded rectangle:** {rectangle.rows} rows × {rectangle.columns} columns = {rectangle.cells:,} cells "
            f"in the wave's cache after this step; **{rectangle.padding:,} of them padding "
            f"({rectangle.padding_share:.0%})**: left padding up to the longest prompt, and the padding tokens "
            "finished members computed while they held their slot."
        )
