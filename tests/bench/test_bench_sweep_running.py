"""The load sweep's CLI against servers already running: two of ours by URL, and a fleet of them behind a real
`vllm-router`, each driven alone after a warm-up, with the client's figures beside what each server's /metrics said
at each rate and how evenly the router spread the requests; rates picked by a probe with `auto`; bad input as one
line and exit code 2."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from batching.bench.cli import main
from batching.sweep import auto_rates
from tests.serve.helpers import our_server, two_eager_servers
from tests.serve.routers import Router, running_router

CAPS = [5, 2, 7, 3]
PROMPTS = ["How do I track my order?", "Hello", "What's your return policy?", "Paris"]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    with two_eager_servers(tmp_path_factory.mktemp("running")) as urls:
        yield urls


@pytest.fixture(scope="module")
def router(servers: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    with running_router("vllm-router", servers, tmp_path_factory.mktemp("router")) as running:
        yield running


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mix") / "mix.json"
    rows = [{"prompt": p, "max_new_tokens": c} for p, c in zip(PROMPTS, CAPS, strict=True)]
    path.write_text(json.dumps({"name": "mix", "requests": rows}))
    return path


def _run(argv: list[str]) -> int:
    return main(["sweep", *argv, "--no-progress", "--ignore-eos"])


@pytest.mark.long
def test_two_running_servers_and_the_fleet_behind_vllm_router_are_each_swept_with_their_own_figures(
    servers: tuple[str, str], router: Router, workload: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, png = tmp_path / "running.json", tmp_path / "running.png"
    a, b = servers
    argv = ["--workload", str(workload), "--url", f"A={a}", "--url", f"B={b}", "--router", router.url]
    argv += ["--rates", "4,40", "--requests", "8", "--json", str(out), "--plot", str(png)]
    assert _run(argv) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    cycled = sum(CAPS * 2)  # every answer to its cap
    assert [(p["series"], p["rate"], p["completed"], p["output_tokens"]) for p in result["points"]] == [
        (series, rate, 8, cycled) for rate in (4.0, 40.0) for series in ("A", "B", "fleet")
    ]
    assert set(result["warm_ups_s"]) == {"A", "B", "fleet", *(url.removeprefix("http://") for url in servers)}
    replicas = {url.removeprefix("http://") for url in servers}
    assert set(result["targets"][2]["replicas"]) == set(servers)  # read from the router's own list
    own = [(s["series"], s["server"], s["rate"]) for s in result["servers"]]
    assert own[:2] == [("A", "A", 4.0), ("B", "B", 4.0)] and {s for _, s, _ in own[2:4]} == replicas
    for server in result["servers"]:
        assert server["engine"] == "Batchscope" and server["readings"] >= 1
        assert server["preemptions"] == 0 and server["cache_usage_peak"] is not None
    alone = [s["finished"] for s in result["servers"] if s["series"] != "fleet"]
    assert alone == [8, 8, 8, 8]  # each server saw only its own sweep's requests: the others were idle
    fleet = [s["finished"] for s in result["servers"] if s["series"] == "fleet"]
    assert fleet == [4, 4, 4, 4]  # round robin: half of each rate's requests on each replica
    assert result["spread"][0].endswith("fewest/most 1.00")
    assert set(result["goodput"]) == {"A", "B", "fleet"} and result["headline"].startswith("At TTFT p90 ≤ 200 ms")
    assert result["sources"]["points"] == "measured by this client"
    assert (
        "each server's own figures (read from the server's /metrics):" in printed and "spread fleet at 4/s" in printed
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_auto_rates_for_running_servers_come_from_a_probe_of_every_request_at_once(
    servers: tuple[str, str], workload: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "auto.json"
    argv = ["--workload", str(workload), "--url", f"A={servers[0]}", "--requests", "4", "--json", str(out)]
    assert _run(argv) == 0
    result = json.loads(out.read_text())
    assert set(result["capacities"]) == {"A"} and tuple(result["rates"]) == auto_rates(result["capacities"]["A"])
    assert [p["rate"] for p in result["points"]] == result["rates"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--replica", "http://127.0.0.1:9"], "--replica names a replica behind a router"),
        (["--servers", "batchscope", "--url", "http://127.0.0.1:9"], "--servers starts servers, --url and --router"),
        (["--url", "ftp://host"], "'ftp://host' is not a server address"),
        (["--url", "http://127.0.0.1:9"], "cannot connect to http://127.0.0.1:9"),
    ],
)
def test_bad_input_for_running_servers_is_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run([*argv, "--rates", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bench sweep: error: ") and message in err[0]


def test_two_servers_under_one_name_and_a_refused_key_are_one_line_each(
    servers: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(["--url", f"A={servers[0]}", "--url", f"A={servers[1]}", "--rates", "2"]) == 2
    assert "two servers are named 'A'" in capsys.readouterr().err
    env = {"BATCHSCOPE_SERVER__API_KEY": "sesame"}
    with our_server(tmp_path, env, args=("--no-compile",)) as (keyed, _):
        assert _run(["--url", keyed, "--rates", "2", "--requests", "2", "--api-key", "wrong"]) == 2
        assert "refused the API key (HTTP 401)" in capsys.readouterr().err
        assert _run(["--url", keyed, "--rates", "2", "--requests", "2", "--api-key", "sesame"]) == 0
