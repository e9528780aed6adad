"""The load sweep view against servers already running, in AppTest: two of our servers started by the test and a
fleet of them behind a real `vllm-router`, swept from the page to the end: one line per server on the same charts,
the headline naming the winner, each server's own figures beside the client's (labelled as such, "not reported"
where a server has none), the router's spread, the table and the command line that runs it again; bad input said
inline with Run off."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.app.sweep.test_page import SWEEP, charts
from tests.app.test_app import button, open_app, tiny_env  # noqa: F401 (a fixture)
from tests.bench.vllm_helpers import RunningVllm
from tests.serve.helpers import two_eager_servers
from tests.serve.routers import Router, running_router
from utils.plain_text import escape_markdown


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    with two_eager_servers(tmp_path_factory.mktemp("page-servers")) as urls:
        yield urls


@pytest.fixture(scope="module")
def router(servers: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    with running_router("vllm-router", servers, tmp_path_factory.mktemp("page-router")) as running:
        yield running


def open_servers() -> AppTest:
    at = open_app()
    at.switch_page(SWEEP).run()
    at.radio(key="sweep_target").set_value("servers").run()
    assert not at.exception, at.exception
    return at


def test_the_servers_choice_says_what_is_missing_or_wrong_and_run_is_off(tiny_env: Path) -> None:  # noqa: F811
    at = open_servers()
    assert [e.value for e in at.error] == ["Type at least one server's URL (or a fleet's router) to sweep."]
    assert button(at, "Run sweep").disabled
    at.text_area(key="sweep_servers").set_value("A=localhost:8000").run()
    assert [e.value for e in at.error] == [
        "'localhost:8000' is not a server address: type http://host:port or https://host[:port]"
    ]
    at.text_area(key="sweep_servers").set_value("").run()
    at.text_area(key="sweep_replicas").set_value("http://127.0.0.1:8001").run()
    assert "Replicas are read behind a router" in at.error[0].value and button(at, "Run sweep").disabled


@pytest.mark.long
def test_two_servers_and_a_fleet_behind_vllm_router_are_swept_from_the_page_on_the_same_charts(
    tiny_env: Path,  # noqa: F811
    servers: tuple[str, str],
    router: Router,
) -> None:
    at = open_servers()
    a, b = servers
    at.text_area(key="sweep_servers").set_value(f"A={a}\nB={b}")
    at.text_input(key="sweep_router").set_value(router.url)
    at.selectbox(key="sweep_mix").set_value("seed-lab")
    at.text_input(key="sweep_rates").set_value("5, 50")
    at.number_input(key="sweep_requests").set_value(4).run()
    assert not at.error
    button(at, "Run sweep").click().run()
    assert not at.exception, at.exception
    sweep = at.session_state.sweep_run.run
    assert sweep.completed and sweep.error is None
    assert [(p.series, p.rate, p.completed) for p in sweep.points] == [
        (series, rate, 4) for rate in (5.0, 50.0) for series in ("A", "B", "fleet")
    ]
    (headline,) = [element.value for element in at.success]
    assert headline.startswith("At TTFT p90 ≤ 200 ms and TPOT p90 ≤ 100 ms, ") and " B " in f"{headline} "
    drawn = charts(at)
    ttft = drawn["TTFT (p50, p90, p99) against the request rate"].dropna(subset=["stat"])
    assert set(ttft["series"]) == {"A", "B", "fleet"}  # one line per server, on the same chart
    running = drawn["Server's requests running (mean), from its /metrics"]
    replicas = {f"fleet · {url.removeprefix('http://')}" for url in servers}
    assert set(running["who"]) == {"A", "B", *replicas}  # each replica of the fleet its own line
    captions = [c.value for c in at.caption]
    assert any(
        c.startswith("Every latency, throughput and attainment above is measured by this client") for c in captions
    )
    assert any("read from the server's /metrics" in c and "never a blank that reads as a zero" in c for c in captions)
    first = "How evenly the router spread the requests · " + escape_markdown("fleet at 5/s: ")
    spread = [c for c in captions if c.startswith(first)]
    assert len(spread) == 1 and spread[0].endswith(escape_markdown("fewest/most 1.00"))  # round robin: 2 and 2
    points, own = (frame.value for frame in at.dataframe)
    assert len(points) == 6 and len(own) == 8 and set(own["engine"]) == {"Batchscope"}
    (command,) = [code.value for code in at.code]
    assert command.startswith(f"python -m batching.bench sweep --workload seed-lab --url A={a} --url B={b} ")
    assert f"--router fleet={router.url}" in command and "--rates 5,50 --requests 4 --seed " in command
    assert not button(at, "Run sweep").disabled and button(at, "Stop").disabled


def test_a_server_with_nothing_listening_is_one_message_and_nothing_runs(tiny_env: Path) -> None:  # noqa: F811
    at = open_servers()
    at.text_area(key="sweep_servers").set_value("A=http://127.0.0.1:9").run()
    button(at, "Run sweep").click().run()
    assert any("cannot connect to http://127.0.0.1:9" in error.value for error in at.error)
    assert "sweep_run" not in at.session_state


@pytest.mark.long
def test_our_server_and_vllms_cpu_build_are_swept_from_the_page_with_vllms_own_figures(
    tiny_env: Path,  # noqa: F811
    servers: tuple[str, str],
    vllm: RunningVllm,
) -> None:
    at = open_servers()
    at.text_area(key="sweep_servers").set_value(f"batchscope={servers[0]}\nvllm={vllm.url}")
    at.selectbox(key="sweep_mix").set_value("seed-lab")
    at.text_input(key="sweep_rates").set_value("5, 50")
    at.number_input(key="sweep_requests").set_value(4).run()
    button(at, "Run sweep").click().run()
    assert not at.exception, at.exception
    sweep = at.session_state.sweep_run.run
    assert sweep.completed and [(p.series, p.rate, p.completed) for p in sweep.points] == [
        (series, rate, 4) for rate in (5.0, 50.0) for series in ("batchscope", "vllm")
    ]
    theirs = [point.figures for point in sweep.servers if point.series == "vllm"]
    assert [figures.engine for figures in theirs] == ["vLLM", "vLLM"]
    assert all(f.finished == 4 and f.preemptions == 0 and f.cache_usage_peak is not None for f in theirs)
    assert at.session_state.sweep_run.setup["servers"][1]["model"] == vllm.model  # the name its /v1/models gives
    (headline,) = [element.value for element in at.success]
    assert "batchscope" in headline and "vllm" in headline
