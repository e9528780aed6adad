"""`python -m batching.bench steady`: a fresh server under Poisson arrivals, latency by window of arrivals, and how
the engine ran its steps meanwhile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batching.bench import steady
from batching.bench.cli import main
from utils.metrics.sweep import RequestTiming


def test_windows_take_the_p50_of_the_requests_arriving_in_each() -> None:
    timings = [
        RequestTiming(100.0, (100.2, 100.3, 100.5), 3),  # TPOT 150 ms, TTFT 200 ms
        RequestTiming(110.0, (110.1, 110.2), 2),  # 100 ms, 100 ms
        RequestTiming(129.0, (129.3, 129.4, 129.5, 129.6), 4),  # 100 ms, 300 ms
        RequestTiming(131.0, (131.4,), 1),  # one token: a TTFT, no TPOT
        RequestTiming(140.0, (), 0, ok=False),  # not served: in no window
        RequestTiming(170.0, (170.1, 170.15), 2),  # the third window: 50 ms, 100 ms
    ]
    rows = steady.windows(timings, 30.0)
    assert [row["from_s"] for row in rows] == [0.0, 30.0, 60.0]
    assert [row["requests"] for row in rows] == [3, 1, 1]
    assert rows[0]["tpot_p50_ms"] == pytest.approx(100.0)
    assert rows[0]["ttft_p50_ms"] == pytest.approx(200.0)
    assert rows[1]["tpot_p50_ms"] is None and rows[1]["ttft_p50_ms"] == pytest.approx(400.0)
    assert rows[2]["tpot_p50_ms"] == pytest.approx(50.0)
    assert "| 30 | 1 | - | 400 |" in steady.format_table(rows)


def test_no_served_request_gives_no_window() -> None:
    assert steady.windows([RequestTiming(1.0, (), 0, ok=False)], 30.0) == []


@pytest.mark.slow
def test_a_fresh_eager_server_serves_every_request_and_counts_its_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("BATCHSCOPE_MODEL__DEVICE", "cpu")
    out = tmp_path / "steady.json"
    argv = ["--rate", "4", "--seconds", "1", "--window", "0.5", "--server-arg=--no-compile", "--json", str(out)]
    assert main(["steady", *argv]) == 0
    result = json.loads(out.read_text())
    assert result["served"] == result["requests"] == 4
    assert sum(row["requests"] for row in result["windows"]) == 4
    steps = result["steps_by_path"]
    assert steps["eager"] > 0 and steps.get("compiled", 0) == steps.get("direct", 0) == 0
    printed = capsys.readouterr().out
    assert "4 of 4 requests served at 4 req/s" in printed and "| arrivals from (s) |" in printed
    said = result["startup_log"]  # the server's start, up to its port opening: ready, its KV pool, its steps
    assert any(line.startswith("KV cache:") for line in said) and "every step runs eager" in said[-2]
    assert said[-1].startswith("serving builtin on http://") and f"server: {said[0]}" in printed


def test_a_bad_rate_is_one_line_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["steady", "--rate", "0"]) == 2
    assert capsys.readouterr().err == "bench steady: error: --rate=0 is not allowed: must be > 0\n"
