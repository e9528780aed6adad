"""2 · The sweep and 3 · Every point: the progress over the whole sweep, followed as it runs; the headline and the
charts of the rates done so far; the table and the export."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from app.sweep.live_server_sweep import LiveServerSweep
from app.sweep.live_sweep import LiveSweep
from app.sweep.servers import SERVERS_THROUGHPUT, server_results, server_table
from utils import export
from utils.charts.sweep import CAPTIONS, KNEE_COLUMNS, attainment_chart, latency_chart, throughput_chart
from utils.metrics.sweep import ATTAINMENT_GOAL, goodputs, knees, points_frame, readable_frame
from utils.metrics.sweep_servers import CLIENT, METRICS, NOT_REPORTED

POLL_S = 0.1
CLOCKS = {
    "cpu": "Each lane's clock counted the engine thread's CPU time during its steps (the model runs on one CPU "
    "thread): time other jobs on the machine took from it is not in these latencies.",
    "wall": "Each lane's clock counted wall time during its steps: on a busy machine, time other jobs took from "
    "the engine is in these latencies.",
}
Sweep = LiveSweep | LiveServerSweep


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
