"""The load sweep view's run: the prompt mix at each rate as a private race in the engine process, one rate after the
other (`app.sweep.live_sweep`), or sent to servers already running, each alone (`app.sweep.live_server_sweep`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import streamlit as st

from app.common.frame import Frame
from app.common.live_run import request_sampling
from app.common.view_run import ViewRunBase
from app.sweep.live_server_sweep import LiveServerSweep
from app.sweep.live_sweep import LiveSweep, SweepRace
from batching.arrivals import Schedule
from batching.bench.sweep_remote import RemoteSweep, Target, check_names, fleet_target, server_target
from batching.bench.workloads import load_workload
from batching.engine.batcher import BatcherOptions
from batching.engine.params import RequestParams
from batching.remote import WARM_UP_QUESTION, Endpoint, RemoteError, endpoint_from_settings
from batching.service.handles import Item
from batching.sweep import SweepSpec, format_rates
from utils.metrics.sweep import Slo

KEY = "sweep_run"
QUEUE = "the queue"  # the prompt mix taken from this tab's queue, not a workload


@dataclass(frozen=True)
class ServerChoice:
    """Servers already running to sweep instead of this tab's engine: `NAME=URL` lines, one key for all, and a
    fleet's router (`[NAME=]URL`) with its replicas (none: the router's own list)."""

    urls: tuple[str, ...] = ()
    api_key: str | None = None
    router: str | None = None
    replicas: tuple[str, ...] = ()


@dataclass(frozen=True)
class SweepChoice:
    """What the person asked the sweep to run: the mix (a workload's name or `QUEUE`), the rates, the requests per
    rate and the target; `servers` to sweep running servers instead of this tab's engine."""

    mix: str
    spec: SweepSpec
    slo: Slo
    servers: ServerChoice | None = None


@dataclass
class SweepViewRun(ViewRunBase):
    """The sweep the view started, and what it was asked (for the export)."""

    run: LiveSweep | LiveServerSweep
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
    if choice.servers is not None:
        start_servers(frame, choice, choice.servers)
        return
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


def server_targets(frame: Frame, servers: ServerChoice) -> list[Target]:
    """Each server (its model: the first it lists), then the fleet; RemoteError or ValueError says what is wrong."""
    remote = frame.settings.remote

    def endpoint_of(url: str) -> Endpoint:
        return endpoint_from_settings(remote, url, servers.api_key)

    targets = [server_target(url, endpoint_of) for url in servers.urls]
    if servers.router:
        targets.append(fleet_target(servers.router, servers.replicas, endpoint_of))
    check_names(targets)
    return targets


def start_servers(frame: Frame, choice: SweepChoice, servers: ServerChoice) -> None:
    """Start the sweep of running servers in its thread: the mix in the sidebar's template, greedy, as the CLI sends
    it; a server that cannot be used (address, key, model) is the view's message and nothing starts."""
    state = st.session_state
    try:
        with st.spinner("Asking each server for its model…"):
            targets = server_targets(frame, servers)
        prompts = [(frame.formatted(prompt), cap) for prompt, cap in choice.spec.mix(mix_prompts(frame, choice.mix))]
        sweep = RemoteSweep(
            targets,
            prompts,
            choice.spec,
            choice.slo,
            warm_up_prompt=frame.formatted(WARM_UP_QUESTION),
            telemetry_every_s=frame.settings.remote.telemetry_interval_s,
        )
    except (RemoteError, ValueError) as exc:
        state.sweep_message = str(exc)
        return
    live = LiveServerSweep(sweep)
    live.begin()
    state[KEY] = SweepViewRun(live, servers_setup(frame, choice, targets))
    state.sweep_message = None


def servers_setup(frame: Frame, choice: SweepChoice, targets: list[Target]) -> dict:
    """What the sweep of running servers was asked, and the command line that runs it again (for a workload's mix)."""
    urls = [f"--url {target.name}={target.endpoint.root}" for target in targets if not target.replicas]
    urls += [
        f"--router {target.name}={target.endpoint.root}" + "".join(f" --replica {r.root}" for r in target.replicas)
        for target in targets
        if target.replicas
    ]
    slo, spec = choice.slo, choice.spec
    flags = [f"--workload {choice.mix}", *urls, f"--rates {format_rates(spec.rates).replace(' ', '')}"]
    flags += [f"--requests {spec.requests} --seed {spec.seed}"]
    flags += [f"--slo-ttft {slo.ttft_s * 1000:g} --slo-tpot {slo.tpot_s * 1000:g}"]
    command = "python -m batching.bench sweep " + " ".join(flags)
    return {
        "servers": [
            {"name": t.name, "url": t.endpoint.root, "model": t.model, "replicas": [r.root for r in t.replicas]}
            for t in targets
        ],
        "mix": choice.mix,
        "rates": format_rates(choice.spec.rates),
        "requests_per_rate": choice.spec.requests,
        "seed": choice.spec.seed,
        "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "attainment_goal": 0.9},
        "sampling": "greedy (temperature 0), as the CLI sends",
        "system_prompt": frame.choices.system_prompt,
        "command": command if choice.mix != QUEUE else None,
    }
