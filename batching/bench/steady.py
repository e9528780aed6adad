"""Steady traffic through the API: a fresh server, Poisson arrivals the moment it answers, latency by window.

    python -m batching.bench steady --rate 6 --seconds 180 [--model DIR] [--server-arg=--no-compile] [--json out.json]

A server lives differently from a benchmark: it starts, and traffic never stops. This starts `python -m
batching.serve` (on an empty compile cache unless `--warm-cache`), times how long it takes to answer, then sends the
workload's prompts (cycled, each templated as the page does) at Poisson arrivals for `--seconds`, streamed, EOS
ignored, each timed as `vllm bench serve` times it (`sweep_client`). It prints TPOT and TTFT p50 of the requests
arriving in each window, and how the engine ran its steps meanwhile (`batchscope:engine_steps_total{path}`): a
server whose graphs stop running under load shows its eager TPOT in the later windows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from batching.arrivals import Schedule
from batching.bench import options
from batching.bench.options import BadInput, RunFailed
from batching.bench.peers.local_server import LocalServer, ServerStartError
from batching.bench.sweep_client import greedy_request, run_remote_rate
from batching.bench.workloads import load_workload, random_workload
from batching.remote.endpoint import local_endpoint
from batching.remote.prometheus import read_metrics
from batching.remote.stream import RemoteRequest
from config.settings import load_settings
from model.prompting import format_prompt
from utils.metrics.sweep import RequestTiming

ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 3600.0  # a cold start makes every graph before it listens
STARTUP_LOGGERS = ("batching.engine.threads", "batching.service.lifecycle", "batching.serve.server")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Steady's flags."""
    options.add(parser, "--model", said="the server's, the embedded model")
    options.add(parser, "--workload", "random", said="random: 32 requests, seed --seed")
    parser.add_argument("--rate", type=float, default=6.0, help="Poisson arrivals per second (default 6)")
    parser.add_argument("--seconds", type=float, default=180.0, help="how long arrivals go on (default 180)")
    parser.add_argument("--window", type=float, default=30.0, help="seconds of arrivals per row (default 30)")
    options.add(parser, "--seed", 3)
    parser.add_argument("--warm-cache", action="store_true", help="keep torch's compile cache (default: empty)")
    parser.add_argument("--server-arg", action="append", default=[], help="passed to the server, e.g. --no-compile")
    options.add(parser, "--json", said="none; the windows and step counts")


def workload_requests(workload_name: str, seed: int, count: int) -> list[RemoteRequest]:
    """`count` greedy completions of the workload's prompts, cycled, templated as the page sends them, EOS ignored."""
    workload = random_workload(seed=seed) if workload_name == "random" else load_workload(workload_name)
    prompt = load_settings().prompt
    items = [workload.requests[index % len(workload.requests)] for index in range(count)]
    return [
        greedy_request(
            format_prompt(item.prompt, prompt.system_prompt, prompt.template), item.max_new_tokens or 128, True
        )
        for item in items
    ]


def steps_by_path(url: str) -> dict[str, float]:
    """`batchscope:engine_steps_total` by path, read from the server's /metrics."""
    return read_metrics(url).by_label("batchscope:engine_steps_total", "path")


def windows(timings: Sequence[RequestTiming], window_s: float) -> list[dict]:
    """TPOT and TTFT p50 (ms) of the served requests arriving in each `window_s` of the run, in order."""
    served = [timing for timing in timings if timing.served]
    if not served:
        return []
    start = min(timing.arrival for timing in timings)
    rows: dict[int, list[RequestTiming]] = {}
    for timing in served:
        rows.setdefault(int((timing.arrival - start) // window_s), []).append(timing)
    table = []
    for index in sorted(rows):
        tpots = [tpot for timing in rows[index] if (tpot := timing.tpot) is not None]
        table.append(
            {
                "from_s": index * window_s,
                "requests": len(rows[index]),
                "tpot_p50_ms": 1000 * statistics.median(tpots) if tpots else None,
                "ttft_p50_ms": 1000 * statistics.median(timing.ttft for timing in rows[index]),
            }
        )
    return table


def format_table(rows: Sequence[dict]) -> str:
    lines = ["| arrivals from (s) | requests | TPOT p50 (ms) | TTFT p50 (ms) |", "|---|---|---|---|"]
    for row in rows:
        tpot = "-" if row["tpot_p50_ms"] is None else f"{row['tpot_p50_ms']:.2f}"
        lines.append(f"| {row['from_s']:.0f} | {row['requests']} | {tpot} | {row['ttft_p50_ms']:.0f} |")
    return "\n".join(lines)


def run_steady(args: argparse.Namespace) -> dict:
    """The server started, its traffic sent and timed: every figure."""
    count = max(1, round(args.rate * args.seconds))
    model_args = ["--model", args.model] if args.model else []
    with tempfile.TemporaryDirectory(prefix="batchscope-steady-") as workdir:
        env = {} if args.warm_cache else {"BATCHSCOPE_ENGINE__COMPILE_CACHE_DIR": str(Path(workdir) / "compiled")}
        command = [sys.executable, "-m", "batching.serve", "--host", "127.0.0.1", *model_args, *args.server_arg]
        server = LocalServer("batchscope", command, env, Path(workdir) / "server.log", STARTUP_TIMEOUT_S, cwd=ROOT)
        launched = time.perf_counter()
        with server:
            startup_s = time.perf_counter() - launched  # /health answers once the server listens
            with urllib.request.urlopen(f"{server.url}/v1/models", timeout=10) as response:
                model = json.load(response)["data"][0]["id"]
            before = steps_by_path(server.url)
            schedule = Schedule.poisson(count, args.rate, seed=args.seed)
            sent = workload_requests(args.workload, args.seed, count)
            timings, duration = run_remote_rate(local_endpoint(server.url), model, sent, schedule)
            after = steps_by_path(server.url)
        startup_log = startup_lines(server.log)
    steps = {path: after.get(path, 0.0) - before.get(path, 0.0) for path in after}
    return {
        "startup_s": startup_s,
        "rate": args.rate,
        "requests": count,
        "served": sum(timing.served for timing in timings),
        "duration_s": duration,
        "steps_by_path": steps,
        "windows": windows(timings, args.window),
        "startup_log": startup_log,
    }


def startup_lines(log: Path) -> list[str]:
    """What the server said as it started, up to the port opening: its threads, each graph made, its KV pool."""
    said = []
    for line in log.read_text(errors="replace").splitlines():
        if "Uvicorn running" in line:
            break
        if any(f"{name}:" in line for name in STARTUP_LOGGERS):
            text = line.split(": ", 1)[-1]
            if text not in said:  # the engine's thread choice is logged by it and again by the start's log
                said.append(text)
    return said


def run(args: argparse.Namespace) -> int:
    """`python -m batching.bench steady`: the run, what the server said as it started, and the windows' table."""
    for name in ("rate", "seconds", "window"):
        if getattr(args, name) <= 0:
            raise BadInput(f"--{name}={getattr(args, name):g} is not allowed: must be > 0")
    try:
        result = run_steady(args)
    except ServerStartError as exc:
        raise RunFailed(str(exc)) from None
    print("\n".join(f"server: {line}" for line in result["startup_log"]))
    print(f"server answered {result['startup_s']:.0f} s after it was launched")
    print(f"{result['served']} of {result['requests']} requests served at {args.rate:g} req/s")
    print("steps by path: " + ", ".join(f"{path} {int(n)}" for path, n in sorted(result["steps_by_path"].items())))
    print(format_table(result["windows"]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0
