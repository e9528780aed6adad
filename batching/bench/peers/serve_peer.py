"""Our OpenAI-compatible server next to `transformers serve --continuous-batching` and vLLM's own server, driven by
the same load generator.

    python -m batching.bench serve-peer --rates 2,4,8 --requests 30 --json serve-peer.json

Each server runs as a subprocess on a free port with the same model folder, the same number of slots and per-step
token budget, on CPU with one torch thread (vLLM from its own environment, scripts/install-vllm.sh; without it the
script says "not installed" and runs the other two). guidellm (the vLLM project's load generator,
`requirements-bench.txt`) sends the same seeded synthetic prompts, built from the model's own tokenizer, at Poisson
request rates and then all at once (its `throughput` profile); every answer is forced to the same length. Servers
alternate (ours, theirs, ours, ...) because this machine's speed drifts. Prints TTFT / ITL / throughput per server
and rate; bad input is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any

from batching.bench import options
from batching.bench.options import BadInput
from batching.bench.peers import vllm_server
from batching.bench.peers.local_server import LocalServer, ServerStartError, log_tail
from batching.bench.peers.vllm_server import (
    NOT_INSTALLED,
    VllmNotFoundError,
    VllmSettings,
    find_python,
    server_command,
    vllm_version,
)
from batching.command_line import text_table
from config.settings import SettingsError, load_settings

SERVERS = ("batchscope", "transformers", "vllm")
PAGE_SIZE = 256  # transformers' continuous-batching page (KV block) size, in tokens
REPORT_VERSION = 2  # the layout of guidellm's JSON report this parser reads (guidellm 0.8)
STARTUP_TIMEOUT_S = 180.0
ROOT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class Load:
    """What the load generator sends: the same for every server."""

    rates: tuple[float, ...]
    requests: int
    prompt_tokens: int
    prompt_tokens_min: int
    prompt_tokens_max: int
    output_tokens: int
    throughput: bool
    seed: int = 42


@dataclass(frozen=True)
class ServerSpec:
    """How to start one server, and the request field that makes it ignore EOS (answers of equal length)."""

    name: str
    command: tuple[str, ...]
    env: dict[str, str]
    ignore_eos_body: dict[str, Any]
    startup_timeout_s: float = STARTUP_TIMEOUT_S


@dataclass(frozen=True)
class Row:
    """One benchmark of guidellm's report: a server at one rate (or all at once)."""

    server: str
    profile: str
    rate: float | None
    requests: int
    errors: int
    incomplete: int
    requests_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    output_tokens_per_s: float
    output_tokens: int
    round: int = 0  # -1: the median of every round
    load_avg: float = 0.0  # the machine's 1-minute load average when this server started (others' work shows here)


def _positive_floats(text: str) -> tuple[float, ...]:
    try:
        rates = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None
    if not rates or any(not math.isfinite(rate) or rate <= 0 for rate in rates):
        raise argparse.ArgumentTypeError(f"{text!r}: every rate must be a number above 0")
    return rates


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The serving peer's flags."""
    options.add(parser, "--model", "model/builtin", said="model/builtin; a folder every server loads")
    parser.add_argument("--servers", default=",".join(SERVERS), help="comma-separated, from: " + ", ".join(SERVERS))
    parser.add_argument("--rates", type=_positive_floats, default=(2.0, 4.0, 8.0), help="Poisson requests/s")
    parser.add_argument("--no-throughput", action="store_true", help="skip the all-at-once (max throughput) run")
    options.add(parser, "--requests", 30)
    parser.add_argument("--prompt-tokens", type=int, default=48, help="mean synthetic prompt length (default: 48)")
    parser.add_argument("--output-tokens", type=int, default=32, help="tokens every answer gets (default: 32)")
    parser.add_argument("--slots", type=int, default=8, help="requests decoded together (default: %(default)s)")
    options.add(parser, "--max-batched-tokens", 512)
    options.add(parser, "--repeat", 1, said="1; rounds, servers alternating")
    parser.add_argument("--guidellm", help="the guidellm executable (default: the one on PATH)")
    options.add(parser, "--vllm-python", said="BATCHSCOPE_PEERS__VLLM_PYTHON")
    options.add(parser, "--json", said="none; settings and every row")
    parser.add_argument("--keep-reports", type=Path, help="copy guidellm's own JSON reports into this folder")


def build_load(args: argparse.Namespace) -> Load:
    """The load from the arguments, or a BadInput naming the bad value."""
    for name in ("requests", "prompt_tokens", "output_tokens", "slots", "max_batched_tokens", "repeat"):
        if getattr(args, name) < 1:
            raise BadInput(f"--{name.replace('_', '-')} {getattr(args, name)} is not allowed: must be 1 or more")
    if args.prompt_tokens < 8:
        raise BadInput(f"--prompt-tokens {args.prompt_tokens} is not allowed: must be 8 or more")
    return Load(
        rates=args.rates,
        requests=args.requests,
        prompt_tokens=args.prompt_tokens,
        prompt_tokens_min=max(args.prompt_tokens // 3, 1),
        prompt_tokens_max=args.prompt_tokens * 2,
        output_tokens=args.output_tokens,
        throughput=not args.no_throughput,
    )


def parse_servers(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    bad = [name for name in names if name not in SERVERS]
    if not names or bad:
        raise BadInput(f"--servers {text!r} is not allowed: choose from {', '.join(SERVERS)}")
    return names


def request_pages(load: Load) -> int:
    """KV pages of PAGE_SIZE tokens the longest request needs."""
    return math.ceil((load.prompt_tokens_max + load.output_tokens) / PAGE_SIZE)


def transformers_blocks(slots: int, load: Load) -> int:
    """KV blocks for `transformers serve`: room for `slots` requests of the longest length, so no more run at once."""
    return slots * request_pages(load)


def available_servers(names: Sequence[str], vllm_python: str | None) -> tuple[tuple[str, ...], Path | None]:
    """The servers asked for that are installed, and vLLM's Python; says "not installed" for vLLM when it is not."""
    if "vllm" not in names:
        return tuple(names), None
    try:
        python = find_python(vllm_python or load_settings().peers.vllm_python)
    except (VllmNotFoundError, SettingsError) as exc:
        raise BadInput(str(exc)) from None
    if python is not None:
        return tuple(names), python
    print(NOT_INSTALLED, file=sys.stderr)
    left = tuple(name for name in names if name != "vllm")
    if not left:
        raise BadInput("--servers has no server left to run without vLLM")
    return left, None


def server_specs(
    model: str, slots: int, max_batched_tokens: int, load: Load, hf_cache: Path, vllm_python: Path | None = None
) -> dict[str, ServerSpec]:
    """Every server on the same model folder, slots and token budget, CPU, one torch thread, nothing from a hub
    (vLLM only when its Python is given)."""
    common = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hf_cache)}
    specs = {
        "batchscope": _our_spec(model, slots, max_batched_tokens, common),
        "transformers": _transformers_spec(model, transformers_blocks(slots, load), max_batched_tokens, common),
    }
    if vllm_python is not None:
        vllm = VllmSettings(
            model=model,
            slots=slots,
            batch_tokens=max_batched_tokens,
            max_model_len=request_pages(load) * PAGE_SIZE,  # the room transformers serve gets per request
            threads=1,
        )
        specs["vllm"] = ServerSpec(
            name="vllm",
            command=tuple(server_command(vllm_python, vllm)),
            env={**common, **vllm.env()},
            ignore_eos_body={"ignore_eos": True},
            startup_timeout_s=vllm_server.STARTUP_TIMEOUT_S,
        )
    return specs


def _our_spec(model: str, slots: int, max_batched_tokens: int, common: dict[str, str]) -> ServerSpec:
    """`python -m batching.serve` with `slots` slots and the token budget."""
    return ServerSpec(
        name="batchscope",
        command=(
            sys.executable,
            "-m",
            "batching.serve",
            "--host",
            "127.0.0.1",
            "--model",
            model,
            "--log-level",
            "error",
        ),
        env={
            **common,
            "BATCHSCOPE_BATCHING__MAX_BATCH_SIZE": str(slots),
            "BATCHSCOPE_BATCHING__MAX_BATCHED_TOKENS": str(max_batched_tokens),
        },
        ignore_eos_body={"ignore_eos": True},
    )


def _transformers_spec(model: str, blocks: int, max_batched_tokens: int, common: dict[str, str]) -> ServerSpec:
    """`transformers serve --continuous-batching` with `blocks` KV blocks and the token budget."""
    return ServerSpec(
        name="transformers",
        command=(
            # the `transformers` command, run by this interpreter so both servers use the same packages
            sys.executable,
            "-m",
            "transformers.cli.transformers",
            "serve",
            "--continuous-batching",
            "--device",
            "cpu",
            "--cb-num-blocks",
            str(blocks),
            "--cb-max-batch-tokens",
            str(max_batched_tokens),
            "--host",
            "127.0.0.1",
            "--log-level",
            "warning",
            model,
        ),
        env=common,
        # it refuses fields outside OpenAI's schema (vLLM's ignore_eos among them) but takes a per-request
        # generation config, whose eos_token_id it passes to each request
        ignore_eos_body={"generation_config": json.dumps({"eos_token_id": -1, "do_sample": False})},
    )


def scenario(target: str, model: str, tokenizer: Path, spec: ServerSpec, load: Load, profile: dict[str, Any]) -> dict:
    """A guidellm scenario: streamed greedy completions of seeded synthetic prompts, every answer `output_tokens`.

    The answer length goes in as the backend's `max_tokens` plus the server's own ignore-EOS field: guidellm's own
    fixed-length data adds vLLM's `ignore_eos`, which `transformers serve` refuses with a 422.
    """
    return {
        "spec": {
            "backend": {
                "kind": "openai_http",
                "target": target,
                "model": model,
                "request_format": "/v1/completions",
                "stream": True,
                "max_tokens": load.output_tokens,
                "extras": {"body": {"temperature": 0, **spec.ignore_eos_body}},
            },
            "profile": profile,
            "tokenizer": {"kind": "huggingface_auto", "model": str(tokenizer)},
            "data": [
                {
                    "kind": "synthetic_text",
                    "prompt_tokens": load.prompt_tokens,
                    "prompt_tokens_stdev": max(load.prompt_tokens // 3, 1),
                    "prompt_tokens_min": load.prompt_tokens_min,
                    "prompt_tokens_max": load.prompt_tokens_max,
                }
            ],
            # guidellm prefetches 4096 prompts per benchmark by default: seconds of CPU on this machine
            "data_loader": {"kind": "pytorch", "prefetch_factor": max(load.requests, 16)},
            "seed": {"kind": "static", "value": load.seed},
            "constraints": [{"kind": "max_requests", "count": load.requests}],
            "metrics": {"kind": "generative", "sample_size": 4},
        }
    }


def profiles(load: Load) -> list[dict[str, Any]]:
    """One guidellm run for the Poisson rates, one for everything at once."""
    runs: list[dict[str, Any]] = [{"kind": "poisson", "rate": list(load.rates)}] if load.rates else []
    if load.throughput:
        runs.append({"kind": "throughput", "max_concurrency": load.requests})
    return runs


def _percentile(metric: dict[str, Any], name: str) -> float:
    return float(metric["successful"]["percentiles"][name])


def parse_report(report: dict[str, Any], server: str, round_index: int = 0, load_avg: float = 0.0) -> list[Row]:
    """Rows from one guidellm JSON report, or a BadInput if it is not the layout this reads."""
    version = report.get("metadata", {}).get("version")
    if version != REPORT_VERSION:
        raise BadInput(f"guidellm report version {version!r} is not supported: this reads version 2")
    rows = []
    for benchmark in report["benchmarks"]:
        strategy = benchmark["config"]["strategy"]
        metrics = benchmark["metrics"]
        totals = metrics["request_totals"]
        rows.append(
            Row(
                server=server,
                profile=strategy["type_"],
                rate=strategy.get("rate"),
                requests=int(totals["successful"]),
                errors=int(totals["errored"]),
                incomplete=int(totals["incomplete"]),
                requests_per_s=float(metrics["requests_per_second"]["successful"]["mean"]),
                ttft_p50_ms=_percentile(metrics["time_to_first_token_ms"], "p50"),
                ttft_p99_ms=_percentile(metrics["time_to_first_token_ms"], "p99"),
                itl_p50_ms=_percentile(metrics["inter_token_latency_ms"], "p50"),
                itl_p99_ms=_percentile(metrics["inter_token_latency_ms"], "p99"),
                output_tokens_per_s=float(metrics["output_tokens_per_second"]["successful"]["mean"]),
                output_tokens=int(metrics["output_token_count"]["successful"]["total_sum"]),
                round=round_index,
                load_avg=load_avg,
            )
        )
    return rows


MEDIAN_FIELDS = (
    "requests_per_s",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "itl_p50_ms",
    "itl_p99_ms",
    "output_tokens_per_s",
    "load_avg",
)


def median_rows(rows: Sequence[Row]) -> list[Row]:
    """Per server and load, the median of each figure over the rounds (counts summed), ordered by load then server."""
    groups: dict[tuple[str, str, float | None], list[Row]] = {}
    for row in rows:
        groups.setdefault((row.server, row.profile, row.rate), []).append(row)
    loads = list(dict.fromkeys((row.profile, row.rate) for row in rows))
    servers = list(dict.fromkeys(row.server for row in rows))
    medians = [
        replace(
            group[0],
            round=-1,
            requests=sum(row.requests for row in group),
            errors=sum(row.errors for row in group),
            incomplete=sum(row.incomplete for row in group),
            output_tokens=sum(row.output_tokens for row in group),
            **{name: statistics.median(getattr(row, name) for row in group) for name in MEDIAN_FIELDS},
        )
        for group in groups.values()
    ]
    return sorted(medians, key=lambda row: (loads.index((row.profile, row.rate)), servers.index(row.server)))


def _load_label(row: Row) -> str:
    return "all at once" if row.profile == "throughput" else f"{row.profile} {row.rate:g}/s"


def format_table(rows: Sequence[Row]) -> str:
    """A fixed-width table, one line per row, in the order run."""
    header = (
        "server",
        "round",
        "load avg",
        "load",
        "requests",
        "errors",
        "req/s",
        "TTFT p50/p99 ms",
        "ITL p50/p99 ms",
        "out tok/s",
    )
    lines = [
        (
            row.server,
            "median" if row.round < 0 else str(row.round + 1),
            f"{row.load_avg:.1f}",
            _load_label(row),
            str(row.requests),
            str(row.errors + row.incomplete),
            f"{row.requests_per_s:.2f}",
            f"{row.ttft_p50_ms:.1f} / {row.ttft_p99_ms:.1f}",
            f"{row.itl_p50_ms:.1f} / {row.itl_p99_ms:.1f}",
            f"{row.output_tokens_per_s:.1f}",
        )
        for row in rows
    ]
    return text_table(header, lines)


def _post_json(url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return dict(json.load(response))


@contextlib.contextmanager
def running_server(spec: ServerSpec, model: str, workdir: Path) -> Iterator[str]:
    """Start the server on a free port, wait for /health and one warm-up completion, yield its URL, stop it."""
    log = workdir / f"{spec.name}-{len(list(workdir.glob(spec.name + '-*.log')))}.log"
    server = LocalServer(spec.name, spec.command, spec.env, log, spec.startup_timeout_s, cwd=ROOT)
    try:
        server.start()
    except ServerStartError as exc:
        raise BadInput(str(exc)) from None
    try:
        # the first request also starts transformers' batching thread: keep that out of the measurement
        _post_json(
            f"{server.url}/v1/completions",
            {"model": model, "prompt": "Q: hello\nA:", "max_tokens": 4, "temperature": 0, **spec.ignore_eos_body},
            timeout=spec.startup_timeout_s,
        )
        yield server.url
    finally:
        server.stop()


def guidellm_binary(given: str | None) -> tuple[str, str]:
    """The guidellm executable and its version, or a BadInput saying how to install it."""
    path = given or shutil.which("guidellm")
    if not path or not Path(path).exists():
        raise BadInput(
            f"guidellm not found ({given or 'not on PATH'}): pip install -r requirements-bench.txt, or --guidellm PATH"
        )
    path = str(Path(path).resolve())  # guidellm runs in a folder of its own: `PATH=.venv/bin:$PATH` is relative
    result = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        raise BadInput(f"{path} --version failed with code {result.returncode}: {result.stderr.strip()[:200]}")
    return path, result.stdout.strip().rsplit(" ", 1)[-1]


GUIDELLM_ENV = {
    # one worker process: the default spawns ten, each importing torch, which takes half a minute on two cores
    "GUIDELLM__MAX_WORKER_PROCESSES": "1",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
}


def run_guidellm(binary: str, scenario_body: dict[str, Any], workdir: Path, name: str) -> dict[str, Any]:
    """Run one guidellm scenario and return its JSON report (console output goes to a log in `workdir`)."""
    scenario_path = workdir / f"{name}.scenario.json"
    report_path = workdir / f"{name}.report.json"
    body = json.loads(json.dumps(scenario_body))
    body["spec"]["outputs"] = [{"kind": "json", "path": str(report_path)}]
    scenario_path.write_text(json.dumps(body, indent=1))
    log = workdir / f"{name}.guidellm.log"
    with log.open("w") as out:
        result = subprocess.run(
            [binary, "run", "-c", str(scenario_path), "--disable-console-interactive"],
            cwd=workdir,
            env={**os.environ, **GUIDELLM_ENV},
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if result.returncode != 0 or not report_path.exists():
        raise BadInput(f"guidellm exited with code {result.returncode} (log {log}): {log_tail(log)}")
    return dict(json.loads(report_path.read_text()))


def machine_line(vllm_python: Path | None = None) -> str:
    versions = {name: metadata.version(name) for name in ("torch", "transformers")}
    vllm = f", vLLM {vllm_version(vllm_python)} in its own environment" if vllm_python is not None else ""
    return (
        f"machine: {os.cpu_count()} CPUs, torch {versions['torch']} (1 thread per server), "
        f"transformers {versions['transformers']}{vllm}, device cpu, float32"
    )


def settings_lines(load: Load, slots: int, max_batched_tokens: int, version: str) -> list[str]:
    rates = ", ".join(f"{rate:g}" for rate in load.rates)
    return [
        f"load generator: guidellm {version}, backend openai_http /v1/completions streamed, greedy, 1 worker process",
        f"load: synthetic prompts from the model's tokenizer, {load.prompt_tokens} tokens mean "
        f"[{load.prompt_tokens_min}, {load.prompt_tokens_max}], seed {load.seed}; {load.output_tokens} output tokens, "
        f"EOS ignored; {load.requests} requests per profile: poisson at {rates} req/s"
        + ("; throughput (all at once)" if load.throughput else ""),
        f"servers: {slots} slots, {max_batched_tokens} batched tokens per step; transformers serve with "
        f"--cb-num-blocks {transformers_blocks(slots, load)} ({PAGE_SIZE}-token pages) so at most {slots} requests fit",
    ]


def run(args: argparse.Namespace) -> int:
    """`python -m batching.bench serve-peer`: every server at every load, alternating; the table (and JSON)."""
    load = build_load(args)
    servers, vllm_python = available_servers(parse_servers(args.servers), args.vllm_python)
    model_dir = (ROOT / args.model).resolve()
    if not (model_dir / "config.json").is_file():
        raise BadInput(f"--model {args.model!r} is not a model folder: no config.json in {model_dir}")
    binary, version = guidellm_binary(args.guidellm)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="serve-peer-") as tmp:
        workdir = Path(tmp)
        specs = server_specs(args.model, args.slots, args.max_batched_tokens, load, workdir / "hf-cache", vllm_python)
        (workdir / "hf-cache").mkdir()
        for round_index in range(args.repeat):
            for name in servers:
                spec = specs[name]
                print(f"round {round_index + 1}: {name} ...", file=sys.stderr, flush=True)
                load_avg = os.getloadavg()[0]
                with running_server(spec, args.model, workdir) as url:
                    for profile in profiles(load):
                        run_name = f"{name}-{round_index + 1}-{profile['kind']}"
                        body = scenario(url, args.model, model_dir, spec, load, profile)
                        report = run_guidellm(binary, body, workdir, run_name)
                        rows += parse_report(report, name, round_index, load_avg)
                        if args.keep_reports:
                            args.keep_reports.mkdir(parents=True, exist_ok=True)
                            shutil.copy(workdir / f"{run_name}.report.json", args.keep_reports)
    header = [*settings_lines(load, args.slots, args.max_batched_tokens, version), machine_line(vllm_python)]
    print("\n".join(header) + "\n\n" + format_table(rows))
    if args.repeat > 1:
        print(f"\nmedian of {args.repeat} rounds (requests and errors summed):\n\n" + format_table(median_rows(rows)))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "load_generator": {"name": "guidellm", "version": version, "env": GUIDELLM_ENV},
                    "load": asdict(load),
                    "servers": {name: asdict(specs[name]) for name in servers},
                    "scenarios": {
                        name: [scenario("URL", args.model, model_dir, specs[name], load, p) for p in profiles(load)]
                        for name in servers
                    },
                    "settings": header,
                    "rows": [asdict(row) for row in rows],
                    "medians": [asdict(row) for row in median_rows(rows)],
                },
                indent=1,
            )
        )
    return 0
