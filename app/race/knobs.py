"""The race's own controls, drawn into the slot the frame keeps above the shared choices: slow motion, the scheduler's
knobs (token budget, block size, admission) and each lane's KV memory."""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from config.choices import ADMISSION_NAMES, PREEMPT, RESERVE
from config.settings import Settings


def slow_motion(controls: DeltaGenerator) -> int:
    """The race's pause between steps, in ms (on neither lane's clock)."""
    with controls:
        st.header("Run")
        pause_ms = st.slider(
            "Slow motion (pause between steps, ms)",
            0,
            300,
            0,
            10,
            key="slow_motion",
            help="Follow the slots step by step. The pause is counted on neither lane's clock.",
        )
    return int(pause_ms)


ADMISSION_LABELS = {
    PREEMPT: "admit by need, preempt when blocks run out (vLLM)",
    RESERVE: "reserve prompt + cap, never preempt (TensorRT-LLM)",
}
BLOCK_SIZE_CHOICES = (4, 8, 16, 32, 64)


@dataclass(frozen=True)
class SchedulerKnobs:
    """The scheduler's knobs a race is run with: the per-step token budget, the KV block size, the admission policy."""

    token_budget: int
    block_size: int
    admission: str


def scheduler_knobs(controls: DeltaGenerator, settings: Settings) -> SchedulerKnobs:
    """The knobs that decide who waits, each named as vLLM names it, for the race's lanes (the budget's least is one
    more than the most slots the batch-size slider offers, so moving that slider never resets this one)."""
    batching = settings.batching
    least = max(16, batching.max_batch_size) + 1
    with controls:
        st.header("Scheduler")
        budget = st.slider(
            "Token budget per step",
            least,
            max(2048, batching.max_batched_tokens),
            max(batching.max_batched_tokens, least),
            key="token_budget",
            help="vLLM's max_num_batched_tokens: prompt and decode tokens one step may compute. It is also the chunk "
            "size of chunked prefill: a long prompt is cut into chunks of what is left after the decode rows.",
        )
        sizes = sorted({*BLOCK_SIZE_CHOICES, batching.block_size})
        block_size = st.select_slider(
            "KV block size (positions)",
            sizes,
            batching.block_size,
            key="block_size",
            help="vLLM's block_size: KV positions per block. Smaller blocks waste less of a request's last block, "
            "larger ones share prefixes in coarser steps.",
        )
        admissions = list(ADMISSION_NAMES)
        admission: str = st.radio(
            "Admission policy",
            admissions,
            index=admissions.index(batching.admission),
            format_func=ADMISSION_LABELS.__getitem__,
            key="admission",
            help="Continuous lane only. vLLM admits a request when its first chunk's blocks are free and preempts the "
            "newest when a running one needs a block; TensorRT-LLM's guaranteed-no-evict reserves the prompt and "
            "the cap at admission: fewer rows at once, never a preemption.",
        )
    return SchedulerKnobs(int(budget), int(block_size), admission)


def kv_memory(controls: DeltaGenerator, default: int, block_size: int) -> int:
    """The KV memory of each race lane, in token positions (the same pool size for both): squeeze it to watch
    static waves shrink and continuous batching preempt."""
    with controls:
        tokens = st.number_input(
            "KV memory (token positions)",
            min_value=block_size,
            max_value=1_048_576,
            value=max(default, block_size),
            step=block_size,
            key="kv_memory",
            help=f"Each lane's pool of KV blocks ({block_size} positions each; rounded down to whole blocks), the "
            "same for both lanes. Less memory: static waves hold fewer requests, continuous batching preempts.",
        )
    return int(tokens)
