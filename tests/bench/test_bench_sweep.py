"""The load sweep's CLI on the tiny model: in-process (both schedules at every rate: the table, the JSON, the PNG),
against our real server, bad input; and its HTTP client timing a real vLLM server as `vllm bench serve` does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batching.arrivals import Schedule
from batching.bench.cli import main
from batching.bench.sweep_client import greedy_request, run_remote_rate
from batching.remote.endpoint import local_endpoint
from batching.sweep import auto_rates, format_rates
from tests.bench.vllm_helpers import RunningVllm

CAPS = [5, 2, 7, 3]
PROMPTS = ["How do I track my order?", "Hello", "What's your return policy?", "Paris"]


def _workload(folder: Path) -> Path:
    path = folder / "mix.json"
    rows = [{"prompt": p, "max_new_tokens": c} for p, c in zip(PROMPTS, CAPS, strict=True)]
    path.write_text(json.dumps({"name": "mix", "requests": rows}))
    return path


def _run(argv: list[str]) -> int:
    return main(["sweep", *argv, "--threads", "1", "--no-progress", "--eager"])


def test_the_in_process_sweep_prints_every_point_and_writes_the_json_and_the_plot(
    tiny_model_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, png = tmp_path / "sweep.json", tmp_path / "sweep.png"
    argv = ["--workload", str(_workload(tmp_path)), "--model", str(tiny_model_dirs["llama"]), "--ignore-eos"]
    argv += ["--rates", "1000,10", "--requests", "6", "--seed", "3", "--json", str(out), "--plot", str(png)]
    assert _run(argv) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["rates"] == [10.0, 1000.0] and result["requests_per_rate"] == 6 and result["seed"] == 3
    points = [(p["series"], p["rate"], p["completed"], p["output_tokens"]) for p in result["points"]]
    cycled = sum((CAPS * 2)[:6])  # the mix cycled to 6 requests, every answer to its cap
    assert points == [
        ("continuous", 10.0, 6, cycled),
        ("static", 10.0, 6, cycled),
        ("continuous", 1000.0, 6, cycled),
        ("static", 1000.0, 6, cycled),
    ]
    assert set(result["goodput"]) == {"continuous", "static"}
    assert result["headline"].startswith("At TTFT p90 ≤ 200 ms and TPOT p90 ≤ 100 ms, ")
    assert result["engine"]["step_detail"] is False and result["engine"]["compile_steps"] is False
    assert set(result["steps"].values()) == {"eager steps"}
    assert result["lane_clock"] == "cpu" and "in-process race per rate, cpu clocks" in printed
    table = [line for line in printed.splitlines() if line.strip().startswith(("continuous ", "static "))]
    assert len(table) == 4 and all("6/6" in line for line in table)
    assert result["headline"] in printed and "goodput continuous:" in printed and "knees static:" in printed
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_auto_rates_are_picked_by_a_race_of_every_request_at_once_and_printed(
    tiny_model_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "auto.json"
    argv = ["--workload", str(_workload(tmp_path)), "--model", str(tiny_model_dirs["llama"]), "--ignore-eos"]
    assert _run([*argv, "--requests", "4", "--json", str(out), "--wall-clock"]) == 0  # --rates auto: the default
    result = json.loads(out.read_text())
    rates = tuple(result["rates"])
    assert result["rates_asked"] == "auto" and rates == auto_rates(*result["capacities"].values())
    assert result["lane_clock"] == "wall"
    assert [(p["series"], p["rate"]) for p in result["points"]] == [
        (mode, rate) for rate in rates for mode in ("continuous", "static")
    ]
    assert f"rates picked (auto): {format_rates(rates)} requests/s" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rates", "2,x"], "request rate 'x' is not a number"),
        (["--requests", "0"], "requests=0 per rate is not allowed"),
        (["--workload", "nope"], "workload 'nope' is neither a built-in"),
        (["--slo-ttft", "0"], "the TTFT target 0.0 s is not allowed"),
        (["--servers", "nginx", "--rates", "2"], "--servers 'nginx' is not allowed"),
        (["--servers", "batchscope"], "--rates auto picks rates for the in-process sweep"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], message: str, tiny_model_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run([*argv, "--model", str(tiny_model_dirs["llama"])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bench sweep: error: ") and message in err[0]


@pytest.mark.slow
def test_a_sweep_against_our_real_server_times_every_request_at_every_rate(
    tiny_model_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "servers.json"
    argv = ["--workload", str(_workload(tmp_path)), "--model", str(tiny_model_dirs["llama"]), "--ignore-eos"]
    argv += ["--servers", "batchscope", "--rates", "20,200", "--requests", "4", "--json", str(out)]
    assert _run(argv) == 0
    result = json.loads(out.read_text())
    assert [(p["series"], p["rate"], p["completed"], p["output_tokens"]) for p in result["points"]] == [
        ("batchscope", 20.0, 4, sum(CAPS)),
        ("batchscope", 200.0, 4, sum(CAPS)),
    ]
    assert ", batchscope sustains " in result["headline"]  # one server: what it sustains, no ratio
    assert set(result["goodput"]) == {"batchscope"}
    assert "goodput batchscope:" in capsys.readouterr().out


def test_the_client_times_a_real_vllm_server_chunk_by_chunk_with_its_token_counts(vllm: RunningVllm) -> None:
    caps = [6, 1, 9]
    requests = [greedy_request([310, 11, 1879 + i], cap, ignore_eos=True) for i, cap in enumerate(caps)]
    schedule = Schedule.timed([0.0, 0.05, 0.1])
    finished: list[int] = []
    endpoint = local_endpoint(vllm.url)
    timings, duration = run_remote_rate(endpoint, vllm.model, requests, schedule, lambda: finished.append(1))
    assert len(finished) == 3 and [timing.output_tokens for timing in timings] == caps
    for timing, cap in zip(timings, caps, strict=True):
        assert timing.served and 1 <= len(timing.chunks) <= cap + 1  # vLLM may bundle tokens, and ends with a chunk
        assert timing.arrival < timing.chunks[0] and list(timing.chunks) == sorted(timing.chunks)
        assert timing.e2e == timing.chunks[-1] - timing.arrival
    assert duration >= max(timing.chunks[-1] for timing in timings) - min(t.arrival for t in timings)
