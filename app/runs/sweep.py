"""The load sweep view's run: the prompt mix at each rate as a private race in the engine process, one rate after the
other (`app.sweep_view`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import streamlit as st

from app.frame import Frame
from app.live_run import request_sampling
from app.runs import ViewRunBase
from app.sweep_view import LiveSweep, SweepRace
from batching.arrivals import Schedule
from batching.bench.workloads import load_workload
from batching.engine.batcher import BatcherOptions
from batching.engine.params import RequestParams
from batching.service.handles import Item
from batching.sweep import SweepSpec, format_rates
from utils.sweep import Slo

KEY = "sweep_run"
QUEUE = "the queue"  # the prompt mix taken from this tab's queue, not a workload


@dataclass(frozen=True)
class SweepChoice:
    """What the person asked the sweep to run: the mix (a workload's name or `QUEUE`), the rates, the requests per
    rate and the target."""

    mix: str
    spec: SweepSpec
    slo: Slo


@dataclass
class SweepViewRun(ViewRunBase):
    """The sweep the view started, and what it was asked (for the export)."""

    run: LiveSweep
    setup: dict

    def stop(self) -> None:
        self.run.stop()


def sweep_options(frame: Frame) -> BatcherOptions:
    """Both lanes' batcher at every rate: the sidebar's choices on the settings' KV memory, without the step detail a
    sweep does not read (less to send from the engine at every step)."""
    return replace(frame.options, step_detail=False)


def mix_prompts(frame: Frame, mix: str) -> list[tuple[str, int]]:
    """The mix's (prompt, cap) pairs: the queue's, or a workload's (uncapped ones get the settings' default cap)."""
    if mix == QUEUE:
        return [(item.prompt, item.max_new_tokens) for item in st.session_state.queue.items]
    default_cap = frame.settings.generation.max_new_tokens
    return [(request.prompt, request.max_new_tokens or default_cap) for request in load_workload(mix).requests]


def sweep_items(frame: Frame, choice: SweepChoice, prefix: str) -> list[Item]:
    """One rate's requests, in arrival order: the mix cycled to the requests per rate, formatted as the page sends
    them (request #n samples with the seed + n - 1, as everywhere on the page); ValueError for an empty mix."""
    pairs = choice.spec.mix(mix_prompts(frame, choice.mix))
    sampling = frame.choices.sampling
    return [
        (frame.formatted(prompt), RequestParams(cap, request_sampling(sampling, number)), f"{prefix}{number}")
        for number, (prompt, cap) in enumerate(pairs, start=1)
    ]


def start(frame: Frame, choice: SweepChoice) -> None:
    """Start the sweep: its first rate races at once, the next when it is over; a refusal is the view's message."""
    state = st.session_state
    options = sweep_options(frame)
    prefix = f"t{id(state)}/sweep/"
    try:
        items = sweep_items(frame, choice, prefix)
    except ValueError as exc:
        state.sweep_message = str(exc)
        return

    def start_race(index: int, schedule: Schedule) -> SweepRace:
        return frame.service.private.start_race(options, items, schedule, cpu_clock=True)

    sweep = LiveSweep(choice.spec, choice.slo, options.max_batch_size, start_race)
    try:
        sweep.begin()
    except ValueError as exc:
        state.sweep_message = str(exc)
        return
    state[KEY] = SweepViewRun(sweep, sweep_setup(frame, choice, options))
    state.sweep_message = None


def stop() -> None:
    st.session_state[KEY].stop()


def sweep_setup(frame: Frame, choice: SweepChoice, options: BatcherOptions) -> dict:
    """What the sweep was asked to do, for the export: enough to run it again from the CLI."""
    return {
        "model": frame.service.info.name,
        "mix": choice.mix,
        "rates": format_rates(choice.spec.rates),
        "requests_per_rate": choice.spec.requests,
        "seed": choice.spec.seed,
        "slo": {"ttft_s": choice.slo.ttft_s, "tpot_s": choice.slo.tpot_s, "attainment_goal": 0.9},
        "engine": asdict(options),
        "sampling": asdict(frame.choices.sampling),
        "system_prompt": frame.choices.system_prompt,
    }
