"""The sidebar: the choices every view shares (engine, sampling, prompt, arrivals), drawn by the frame so a person's
choices are kept when they switch views, and the comparison switch of the views that compare afterwards. A view's
own controls are in its folder (the race's knobs, the remote server)."""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from batching.arrivals import Schedule
from batching.engine.params import SamplingParams
from config.choices import FCFS, LONGEST_FIRST, POLICY_NAMES, SHORTEST_FIRST
from config.settings import GenerationSettings, Settings

ARRIVALS = ("all at once", "staggered", "Poisson")
SEED_NOTE = (
    "Request #n samples with seed + n − 1: identical prompts get different answers, and the same queue gets the same "
    "answers run after run. The seed also draws Poisson arrivals."
)
POLICY_LABELS = {
    FCFS: "first come, first served",
    SHORTEST_FIRST: "shortest cap first",
    LONGEST_FIRST: "longest cap first",
}


@dataclass(frozen=True)
class Choices:
    """What the person chose in the sidebar's shared part: how the engine batches and samples, and when requests
    arrive."""

    batch_size: int
    policy: str
    sampling: SamplingParams
    system_prompt: str
    arrivals: str
    interval: float
    rate: float

    def schedule(self, count: int) -> Schedule:
        """When each of `count` prompts joins, in seconds after Generate."""
        if self.arrivals == "staggered":
            return Schedule.timed([i * self.interval for i in range(count)], f"one request every {self.interval:g} s")
        if self.arrivals == "Poisson":
            return Schedule.poisson(count, self.rate, self.sampling.seed)
        return Schedule.at_once(count)


def shared_choices(settings: Settings) -> Choices:
    """The engine, sampling, prompt and arrival choices, in the sidebar."""
    with st.sidebar:
        batch_size, policy = engine_choices(settings)
        sampling = sampling_choices(settings.generation)
        st.header("Prompt")
        system_prompt = st.text_area("System prompt", settings.prompt.system_prompt, height=100)
        arrivals, interval, rate = arrival_choices()
    return Choices(batch_size, policy, sampling, system_prompt, arrivals, interval, rate)


def engine_choices(settings: Settings) -> tuple[int, str]:
    """The batch size (slots) and the scheduling policy."""
    st.header("Engine")
    batch_size = st.slider(
        "Batch size (slots)",
        1,
        max(16, settings.batching.max_batch_size),
        settings.batching.max_batch_size,
        help="How many requests are decoded together in one forward pass.",
        key="batch_size",
    )
    policies = list(POLICY_NAMES)
    policy: str = st.selectbox(
        "Scheduling policy",
        policies,
        index=policies.index(settings.batching.policy),
        format_func=POLICY_LABELS.__getitem__,
        help="Which waiting request gets the next free slot.",
        key="policy",
    )
    return batch_size, policy


def sampling_choices(gen: GenerationSettings) -> SamplingParams:
    """Greedy or sampled decoding, its parameters, and the seed."""
    st.header("Sampling")
    decoding = st.radio("Decoding", ["greedy", "sample"], index=int(gen.do_sample), horizontal=True, key="decoding")
    sample = decoding == "sample"
    temperature, top_k, top_p = gen.temperature, gen.top_k, gen.top_p
    if sample:
        temperature = st.slider("Temperature", 0.05, 2.0, min(max(gen.temperature, 0.05), 2.0), 0.05)
        top_k = st.number_input("Top-k (0 keeps every token)", 0, 1000, min(gen.top_k, 1000))
        top_p = st.slider("Top-p", 0.05, 1.0, max(gen.top_p, 0.05), 0.05)
    repetition_penalty = st.number_input("Repetition penalty", 0.5, 3.0, min(max(gen.repetition_penalty, 0.5), 3.0))
    seed = st.number_input("Seed", 0, 2**31 - 1, gen.seed)
    st.caption(SEED_NOTE)
    return SamplingParams(sample, temperature, int(top_k), top_p, repetition_penalty, int(seed))


def arrival_choices() -> tuple[str, float, float]:
    """How requests join: the pattern, and its interval (staggered) or rate (Poisson)."""
    st.header("Arrivals")
    arrivals: str = st.radio(
        "How requests join",
        ARRIVALS,
        help="Staggered and Poisson arrivals make requests join a batch that is already running.",
        key="arrivals",
    )
    interval = (
        st.slider("Seconds between requests", 0.1, 3.0, 0.5, 0.1, key="interval") if arrivals == "staggered" else 0.5
    )
    rate = st.slider("Requests per second", 0.5, 20.0, 4.0, 0.5, key="rate") if arrivals == "Poisson" else 2.0
    return arrivals, interval, rate


# --- a control several views draw into the slot the frame keeps above the shared ones ---------------------------
def compare_choice(controls: DeltaGenerator, note: str | None = None) -> bool:
    """Whether the static comparison follows the run (`note` says how the view runs the queue)."""
    with controls:
        st.header("Run")
        if note:
            st.caption(note)
        return st.checkbox("Compare with static batching afterwards", value=True, key="compare")
