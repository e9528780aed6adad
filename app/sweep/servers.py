"""The load sweep's sections for servers already running: which servers (URLs, a key, a fleet's router and its
replicas), what each server said about itself at each rate (its /metrics, beside the client's charts), how evenly a
router spread the requests, and every server figure in a table. Each figure says where it came from."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app.sweep.live_server_sweep import LiveServerSweep
from app.sweep.run import ServerChoice
from batching.bench.sweep_remote import named_url
from batching.remote import RemoteError, parse_url
from utils.charts.sweep import SERVER_CHARTS, server_chart
from utils.metrics.sweep_servers import CLIENT, METRICS, SERVER_FIGURES, server_frame, shown, spread_lines
from utils.plain_text import escape_markdown

SERVERS_INTRO = (
    "Servers already running, each driven alone (the others get no traffic meanwhile): the same prompts (the mix, "
    "in the sidebar's template, greedy) on the same seeded Poisson arrivals at each rate, after one short untimed "
    "request to each server and each replica. With auto rates, a probe of every request at once on each server "
    "picks them. Any OpenAI-compatible server: ours, vLLM, SGLang, llama.cpp, TGI."
)
SERVERS_THROUGHPUT = (
    "Output tokens per second of wall time, from a rate's first arrival to its last answer. A server keeps up while "
    "its line follows the offered load; its ring marks where it stops (saturation)."
)
CLIENT_NOTE = f"Every latency, throughput and attainment above is {CLIENT} (the network included)."
SERVER_NOTE = (
    f"Each figure here is {METRICS} over the rate (the mean or peak of its readings, four a second; a counter's "
    "move from before the rate to after). A server that does not report a figure is named in the chart's title and "
    'has no line there, and the table says "not reported": never a blank that reads as a zero.'
)
PLACEHOLDER = "ours=http://127.0.0.1:8001\nvllm=http://127.0.0.1:8002"


def _lines(text: str) -> tuple[str, ...]:
    return tuple(line.strip() for line in text.splitlines() if line.strip())


def server_choice_form() -> tuple[ServerChoice | None, str | None]:
    """The servers to sweep, checked as typed (no request is sent yet): the choice, or the one line that is wrong."""
    urls = st.text_area(
        "Servers, one per line (NAME=URL, or the URL alone)",
        "",
        key="sweep_servers",
        placeholder=PLACEHOLDER,
        help="Each server's root address (a trailing /v1 is fine). The name is its line on the charts.",
    )
    key = st.text_input("API key (sent to every server)", "", type="password", key="sweep_key")
    router_col, replicas_col = st.columns(2)
    router = router_col.text_input(
        "A fleet's router (optional: [NAME=]URL)",
        "",
        key="sweep_router",
        help="vllm-router, sglang-router, llm-d's gateway…: requests go through it, each replica's /metrics are read.",
    )
    replicas = replicas_col.text_area(
        "Its replicas, one per line (blank: the router's own list)",
        "",
        key="sweep_replicas",
        help="Each replica's root address, where its /metrics are; blank: the workers the router lists.",
    )
    choice = ServerChoice(_lines(urls), key.strip() or None, router.strip() or None, _lines(replicas))
    if choice.replicas and not choice.router:
        return None, "Replicas are read behind a router: type the router's URL too."
    if not choice.urls and not choice.router:
        return None, "Type at least one server's URL (or a fleet's router) to sweep."
    try:
        for line in (*choice.urls, *((choice.router,) if choice.router else ()), *choice.replicas):
            parse_url(named_url(line)[1])
    except RemoteError as exc:
        return None, str(exc)
    return choice, None


def server_results(sweep: LiveServerSweep) -> None:
    """What each server (each replica of a fleet) said at each rate, beside the client's charts, and the spread."""
    st.caption(CLIENT_NOTE)
    servers = sweep.servers
    if not servers:
        return
    st.subheader("What each server said about itself")
    frame = server_frame(servers)
    left, right = st.columns(2)
    for index, column in enumerate(SERVER_CHARTS):
        (left if index % 2 == 0 else right).altair_chart(server_chart(frame, column), width="stretch")
    st.caption(SERVER_NOTE)
    for line in spread_lines(servers):
        st.caption("How evenly the router spread the requests · " + escape_markdown(line.removeprefix("spread ")))


def server_table(sweep: LiveServerSweep) -> pd.DataFrame:
    """Every server figure for reading: one row per server and rate, "not reported" where the server has none."""
    rows = [
        {
            "series": point.series,
            "server": point.server,
            "rate (req/s)": point.rate,
            "engine": point.figures.engine or "unknown",
            **{words: shown(getattr(point.figures, name), name) for name, words in SERVER_FIGURES.items()},
        }
        for point in sweep.servers
    ]
    return pd.DataFrame(rows)
