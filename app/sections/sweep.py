"""The load sweep's sections: what to sweep (this tab's engine or running servers, the mix, the rates, the requests
per rate, the target) with Run and Stop; the progress over the whole sweep; the headline, the charts, the table and
the export."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from app.frame import Frame
from app.runs.sweep import QUEUE, SweepChoice
from app.sections.sweep_servers import (
    SERVERS_INTRO,
    SERVERS_THROUGHPUT,
    server_choice_form,
    server_results,
    server_table,
)
from app.server_sweep_view import LiveServerSweep
from app.sweep_view import LiveSweep
from batching.bench.workloads import builtin_workload_names
from batching.sweep import AUTO, DEFAULT_REQUESTS, MAX_REQUESTS, SweepSpec, parse_rates
from utils import export
from utils.charts.sweep import CAPTIONS, KNEE_COLUMNS, attainment_chart, latency_chart, throughput_chart
from utils.metrics.sweep import ATTAINMENT_GOAL, Slo, goodputs, knees, points_frame, readable_frame
from utils.metrics.sweep_servers import CLIENT, METRICS, NOT_REPORTED

DEFAULT_MIX = "seed-lab"
DEFAULT_TTFT_MS = 200
DEFAULT_TPOT_MS = 100
POLL_S = 0.1
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
CLOCKS = {
    "cpu": "Each lane's clock counted the engine thread's CPU time during its steps (the model runs on one CPU "
    "thread): time other jobs on the machine took from it is not in these latencies.",
    "wall": "Each lane's clock counted wall time during its steps: on a busy machine, time other jobs took from "
    "the engine is in these latencies.",
}
Start = Callable[[SweepChoice], None]
Sweep = LiveSweep | LiveServerSweep
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


@dataclass(frozen=True)
class SweepLayout:
    """Where the sweep draws: its progress bar, and one slot for everything drawn from its points."""

    progress: DeltaGenerator
    results: DeltaGenerator


def sweep_layout(sweep: Sweep) -> SweepLayout:
    st.header("2 · The sweep")
    layout = SweepLayout(st.empty(), st.empty())
    draw_progress(sweep, layout)
    draw_results(sweep, layout)
    return layout


def draw_progress(sweep: Sweep, layout: SweepLayout) -> None:
    layout.progress.progress(sweep.progress(), text=sweep.progress_line())


def follow(sweep: Sweep, layout: SweepLayout) -> None:
    """Fold the engine's steps in and move the bar until the sweep is over, redrawing the charts after each rate (or
    stop here when a newer script run follows the sweep)."""
    follower = sweep.follow()
    last = 0.0
    while True:
        tick = sweep.tick(follower, POLL_S)
        if tick.superseded:
            st.stop()
        now = time.monotonic()
        if tick.rate_done or tick.done or now - last >= POLL_S:
            draw_progress(sweep, layout)
            last = now
        if tick.rate_done:
            draw_results(sweep, layout)
        if tick.done:
            return


def draw_results(sweep: Sweep, layout: SweepLayout) -> None:
    """The headline, the charts and the table of the rates done so far."""
    with layout.results.container():
        picked = sweep.rates_line()
        if picked:
            st.caption(picked)
        if not sweep.points:
            where = "on both lanes" if isinstance(sweep, LiveSweep) else "on a server"
            st.caption(f"The charts appear once the first rate has run {where}.")
            return
        points = points_frame(sweep.points)
        found = goodputs(sweep.points)
        bends = knees(sweep.points, KNEE_COLUMNS)
        sentence = sweep.headline_text()
        if sweep.completed:
            st.success(sentence)
        else:
            st.info(f"So far ({sweep.rates_done} of {len(sweep.spec.rates)} rates): {sentence}")
        left, right = st.columns(2)
        with left:
            st.altair_chart(
                latency_chart(points, "ttft", ("p50", "p90", "p99"), bends, sweep.slo.ttft_s), width="stretch"
            )
            st.altair_chart(latency_chart(points, "e2e", ("p90",), bends), width="stretch")
            st.altair_chart(attainment_chart(points, found, ATTAINMENT_GOAL), width="stretch")
        with right:
            st.altair_chart(latency_chart(points, "tpot", ("p90",), bends, sweep.slo.tpot_s), width="stretch")
            st.altair_chart(throughput_chart(points, bends), width="stretch")
            st.caption(CAPTIONS["attainment"])
        throughput = CAPTIONS["throughput"] if isinstance(sweep, LiveSweep) else SERVERS_THROUGHPUT
        st.caption(CAPTIONS["latency"] + " " + throughput)
        st.caption(knee_line(bends))
        if isinstance(sweep, LiveSweep):
            st.caption(f"Steps: {steps_line(sweep)}. {CLOCKS[sweep.lane_clock]}")
        else:
            server_results(sweep)


def knee_line(bends: dict[tuple[str, str], float | None]) -> str:
    names = {"ttft_p90": "TTFT p90", "tpot_p90": "TPOT p90", "e2e_p90": "E2E p90", "output_throughput": "tokens/s"}
    parts = []
    for series in dict.fromkeys(series for series, _ in bends):
        found = [f"{names[column]} at {rate:g}/s" for (name, column), rate in bends.items() if name == series and rate]
        parts.append(f"{series}: " + (", ".join(found) or "none within the sweep"))
    return "Knees · " + " · ".join(parts)


def steps_line(sweep: LiveSweep) -> str:
    """How the lanes' steps ran (eager or compiled), in a few words: one phrase when every rate agrees."""
    kinds = set(sweep.steps.values())
    if len(kinds) == 1:
        return f"{kinds.pop()} at every rate"
    return "; ".join(f"{where}: {kind}" for where, kind in sweep.steps.items())


def table_section(sweep: Sweep, setup: dict) -> None:
    """Every point in a table (and each server's own figures), and the downloads."""
    if not sweep.points:
        return
    st.header("3 · Every point")
    frame = points_frame(sweep.points)
    st.dataframe(readable_frame(sweep.points), hide_index=True, width="stretch")
    found = goodputs(sweep.points)
    document = {
        "setup": setup,
        "rates": list(sweep.spec.rates),
        "capacities": sweep.capacities,
        "points": [point.as_dict() for point in sweep.points],
        "goodput": {name: asdict(each) | {"whole_sweep": each.whole_sweep} for name, each in found.items()},
        "headline": sweep.headline_text(),
        "completed": sweep.completed,
    }
    if isinstance(sweep, LiveServerSweep):
        st.caption(f'Each server\'s own figures ({METRICS}; "not reported": that server has no such figure):')
        st.dataframe(server_table(sweep), hide_index=True, width="stretch")
        document["servers"] = [point.as_dict() for point in sweep.servers]
        document["sources"] = {"points": CLIENT, "servers": f"{METRICS} (null: {NOT_REPORTED})"}
        if setup.get("command"):
            st.caption("The same sweep from the command line:")
            st.code(setup["command"], language="bash")
    c1, c2, _ = st.columns([1, 1, 4])
    c1.download_button("Points (CSV)", export.to_csv(frame), "batchscope-sweep.csv", "text/csv", on_click="ignore")
    c2.download_button(
        "Everything (JSON)",
        json.dumps(export.json_safe(document), indent=1, allow_nan=False),
        "batchscope-sweep.json",
        "application/json",
        on_click="ignore",
    )
