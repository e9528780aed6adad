"""1 · What to sweep: this tab's engine or running servers, the mix, the rates, the requests per rate and the target,
with Run sweep and Stop."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from app.common.frame import Frame
from app.sweep.run import QUEUE, SweepChoice
from app.sweep.servers import SERVERS_INTRO, server_choice_form
from batching.bench.workloads import builtin_workload_names
from batching.sweep import AUTO, DEFAULT_REQUESTS, MAX_REQUESTS, SweepSpec, parse_rates
from utils.metrics.sweep import Slo

DEFAULT_MIX = "seed-lab"
DEFAULT_TTFT_MS = 200
DEFAULT_TPOT_MS = 100
INTRO = (
    "How much traffic before latency breaks? At each request rate, the same seeded Poisson arrivals race on a "
    "continuous and a static lane of your own, each on a clock that counts only its own steps and skips idle gaps. "
    "The sidebar's engine, sampling and prompt choices apply; its arrival pattern does not (each rate is Poisson)."
)
TARGET_NOTE = (
    "A request meets the target when its time to first token (TTFT, from its arrival) and its time per output "
    "token after the first (TPOT) are both within bounds. The defaults: the answer starts within a fifth of a "
    "second, then streams at least 10 tokens a second, faster than anyone reads. A schedule sustains a rate when "
    "90% of its requests meet the target there: the highest such rate is its goodput, as DistServe defines it."
)
Start = Callable[[SweepChoice], None]
TARGETS = {
    "engine": "this tab's engine: continuous vs static",
    "servers": "servers already running, by URL (and a fleet behind a router)",
}


@dataclass
class SweepButtons:
    """Run and Stop, in a placeholder of their own, redrawn when the sweep ends during this script run."""

    slot: DeltaGenerator
    start: Start
    stop: Callable[[], None]
    choice: SweepChoice | None
    running: bool

    def draw(self, running: bool, key_suffix: str = "") -> None:
        with self.slot.container():
            go_col, stop_col, _ = st.columns([1, 1, 4])
            go_col.button(
                "Run sweep",
                key=f"run_sweep{key_suffix}",
                on_click=self.start,
                args=(self.choice,),
                type="primary",
                disabled=running or self.choice is None,
                width="stretch",
            )
            stop_col.button(
                "Stop", key=f"stop_sweep{key_suffix}", on_click=self.stop, disabled=not running, width="stretch"
            )

    def run_ended(self) -> None:
        if self.running:
            self.draw(False, key_suffix="-after-run")


def sweep_form(frame: Frame, start: Start, stop: Callable[[], None], running: bool) -> SweepButtons:
    """What to sweep, with Run sweep and Stop; a bad rate list or target is said there and Run is off."""
    st.header("1 · What to sweep")
    target = st.radio("Sweep", list(TARGETS), format_func=TARGETS.__getitem__, horizontal=True, key="sweep_target")
    servers, problem = server_choice_form() if target == "servers" else (None, None)
    st.caption(SERVERS_INTRO if target == "servers" else INTRO)
    mixes = [*builtin_workload_names(), QUEUE]
    queue_size = len(st.session_state.queue)
    mix_col, rates_col, count_col = st.columns([2, 3, 1])
    mix = mix_col.selectbox(
        "Prompt mix",
        mixes,
        index=mixes.index(DEFAULT_MIX),
        key="sweep_mix",
        format_func=lambda name: f"the queue ({queue_size} prompts)" if name == QUEUE else name,
        help="A reference workload, or your queue. Its prompts are cycled to the requests per rate.",
    )
    rates_text = rates_col.text_input(
        "Request rates (requests/s)",
        AUTO,
        key="sweep_rates",
        help="Comma-separated, e.g. 2, 4, 8, 16; or auto: a first race of every request at once measures what each "
        "schedule serves flat out on this machine, and ten rates span 0.4 of the lower to 4 times the higher. "
        "Low rates cost the most compute (little batching), high ones little.",
    )
    requests = count_col.number_input("Requests per rate", 1, MAX_REQUESTS, DEFAULT_REQUESTS, key="sweep_requests")
    ttft_col, tpot_col, _ = st.columns([1, 1, 2])
    ttft_ms = ttft_col.number_input("TTFT p90 target (ms)", 1, 600_000, DEFAULT_TTFT_MS, key="sweep_ttft")
    tpot_ms = tpot_col.number_input("TPOT p90 target (ms)", 1, 60_000, DEFAULT_TPOT_MS, key="sweep_tpot")
    st.caption(TARGET_NOTE)
    choice = None
    try:
        spec = SweepSpec(parse_rates(rates_text), int(requests), frame.choices.sampling.seed)
        choice = SweepChoice(mix, spec, Slo(ttft_ms / 1000, tpot_ms / 1000), servers)
    except ValueError as exc:
        st.error(str(exc))
    if problem:
        st.error(problem)
        choice = None
    message = st.session_state.get("sweep_message")
    if message:
        st.error(message)
    buttons = SweepButtons(st.empty(), start, stop, choice, running)
    buttons.draw(running)
    return buttons
