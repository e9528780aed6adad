"""The sidebar: the choices every view shares (engine, sampling, prompt, arrivals), drawn by the frame so a person's
choices are kept when they switch views, and each view's own controls (slow motion, the comparison, the server)."""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from batching.arrivals import Schedule
from batching.engine.params import SamplingParams
from batching.remote import APIS, Api, Endpoint, RemoteError, endpoint_from_settings, fetch_model
from batching.remote.fleet import replica_endpoints, replica_name
from config.choices import ADMISSION_NAMES, FCFS, LONGEST_FIRST, POLICY_NAMES, PREEMPT, RESERVE, SHORTEST_FIRST
from config.settings import GenerationSettings, Settings
from utils.plain_text import escape_markdown

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
REMOTE_RUN_NOTE = (
    "On a remote server: continuous (up to N requests in flight) and static waves of N, after one warm-up request; "
    "which runs first alternates with each comparison."
)


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


# --- each view's own controls, drawn into the slot the frame keeps above the shared ones ---------------------------
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


def compare_choice(controls: DeltaGenerator, note: str | None = None) -> bool:
    """Whether the static comparison follows the run (`note` says how the view runs the queue)."""
    with controls:
        st.header("Run")
        if note:
            st.caption(note)
        return st.checkbox("Compare with static batching afterwards", value=True, key="compare")


@dataclass(frozen=True)
class RemoteChoice:
    """The remote server chosen in the sidebar: where, which model and API, or the one line saying what is wrong."""

    endpoint: Endpoint | None
    model: str | None
    api: Api
    telemetry_every_s: float
    problem: str | None = None
    replicas: tuple[Endpoint, ...] = ()  # a fleet: the URL is its router, and each replica's /metrics are read


@st.cache_data(ttl=10, show_spinner=False)
def served_model(endpoint: Endpoint) -> tuple[str | None, str | None]:
    """The model `/v1/models` lists first, or the reason there is none (asked again after 10 s at most)."""
    try:
        return fetch_model(endpoint), None
    except RemoteError as exc:
        return None, str(exc)


@st.cache_data(ttl=10, show_spinner=False)
def fleet_replicas(router: Endpoint, typed: tuple[str, ...]) -> tuple[tuple[Endpoint, ...], str | None]:
    """The replicas behind `router`: those typed, else the router's own list (asked again after 10 s at most)."""
    try:
        return replica_endpoints(router, typed), None
    except RemoteError as exc:
        return (), str(exc)


def remote_server_choice(settings: Settings, controls: DeltaGenerator) -> RemoteChoice:
    """The server to run the queue on (the settings' by default), its key, model and API; problems said there."""
    remote = settings.remote
    with controls:
        st.header("Server")
        url = st.text_input(
            "Server URL",
            remote.url or "http://127.0.0.1:8000",
            key="remote_url",
            help="Any OpenAI-compatible endpoint (vLLM, SGLang, TGI, llama.cpp, transformers serve…).",
        )
        api_key = st.text_input("API key", remote.api_key or "", type="password", key="remote_key")
        typed_model = st.text_input(
            "Model (blank: the first one /v1/models lists)", remote.model or "", key="remote_model"
        )
        api: Api = st.radio(
            "API", APIS, index=APIS.index(remote.api), horizontal=True, key="remote_api", format_func="/v1/{}".format
        )
        fleet = st.checkbox(
            "A router in front of replicas (a fleet)",
            key="remote_fleet",
            help="vllm-router, sglang-router, llm-d's gateway…: the queue goes through it, and each replica's own "
            "/metrics are drawn side by side.",
        )
        typed = st.text_area(
            "Replicas, one per line (blank: the router's own list)", "", key="remote_replicas", disabled=not fleet
        )
        try:
            endpoint = endpoint_from_settings(remote, url, api_key)
        except RemoteError as exc:
            st.error(escape_markdown(str(exc)))  # the address typed, shown as text
            return RemoteChoice(None, None, api, remote.telemetry_interval_s, str(exc))
        replicas, problem = fleet_replicas(endpoint, _typed_lines(typed)) if fleet else ((), None)
        if problem is None and typed_model.strip():
            model: str | None = typed_model.strip()
        elif problem is None:  # a router may list "unknown": its first replica names the model
            model, problem = served_model(replicas[0] if replicas else endpoint)
        if problem:
            st.error(escape_markdown(problem))  # what the server said, as text
            return RemoteChoice(endpoint, None, api, remote.telemetry_interval_s, problem)
        st.caption(f"Watching model **{escape_markdown(model or '')}** at {escape_markdown(endpoint.root)}")
        if replicas:
            names = ", ".join(replica_name(replica.root) for replica in replicas)
            st.caption(f"Through the router to {len(replicas)} replicas: {escape_markdown(names)}")
    return RemoteChoice(endpoint, model, api, remote.telemetry_interval_s, None, replicas)


def _typed_lines(text: str) -> tuple[str, ...]:
    return tuple(line.strip() for line in text.splitlines() if line.strip())


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
