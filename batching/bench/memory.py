"""KV memory benchmark: what paging buys on the KV memory of 8 full-length slots (a table and JSON, not a test).

    python -m batching.bench memory --threads 1 --json memory.json

One model (the embedded one by default), one run of each configuration, all under the same KV memory: 8 slots of
the whole context. On seed-blog and a seeded 64-request random workload: static batching and continuous batching
with 8 slots (every slot its whole context, as before paging), then both with more slots (`--slots`) sharing that
memory as a pool: continuous admits by free blocks, static waves reserve (longest prompt + largest cap) per member.
On customer-support (every prompt starts with the same system prompt): continuous with prefix caching on and off,
its requests all at once and on seeded Poisson arrivals.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from batching.bench import options
from batching.bench.options import load
from batching.bench.race import check_flags, make_plan, median_run, race_args, run_all
from batching.bench.report import _fmt, mode_report
from batching.command_line import text_table
from batching.engine.geometry import PoolGeometry
from batching.engine.options import BatcherOptions
from config.settings import load_settings
from model.loader import LoadedModel
from utils.export import json_safe

FULL_SLOTS = 8  # the memory budget: this many slots of the whole context
SUPPORT_RATE = 8.0  # requests/s of customer-support's spread-out arrivals (seeded)


@dataclass(frozen=True)
class Config:
    """One run: a label, our mode, and the benchmark flags that shape it (workload, slots, pool, prefix caching)."""

    label: str
    mode: str
    flags: tuple[str, ...]


def configs(budget: int, slots: int, random_requests: int) -> list[tuple[str, list[Config]]]:
    """The runs, by workload: the same KV budget (positions) everywhere."""
    pooled = ("--kv-cache-tokens", str(budget))
    paging = []
    for name, workload in (
        ("seed-blog", ("--workload", "seed-blog", "--ignore-eos")),
        (f"random {random_requests}", ("--workload", "random", "--random-requests", str(random_requests))),
    ):
        eight = (*workload, "--batch-size", str(FULL_SLOTS), *pooled)
        more = (*workload, "--batch-size", str(slots), *pooled)
        runs = [
            Config(f"static, {FULL_SLOTS} slots", "static", eight),
            Config(f"continuous, {FULL_SLOTS} slots", "continuous", eight),
            Config(f"static, {slots} slots", "static", more),
            Config(f"continuous, {slots} slots", "continuous", more),
        ]
        paging.append((name, runs))
    # At once, the first step admits 8 prompts and none finds another's blocks cached yet (blocks are cached once
    # computed, as in vLLM); with arrivals spread out, each later prompt finds the system prompt's blocks.
    support = ("--workload", "customer-support", "--batch-size", str(FULL_SLOTS), *pooled)
    prefix = []
    spread = (*support, "--rate", str(SUPPORT_RATE))
    for arrivals, flags in (("at once", support), (f"Poisson {SUPPORT_RATE:g}/s", spread)):
        prefix += [
            Config(f"continuous, {arrivals}, prefix caching on", "continuous", flags),
            Config(f"continuous, {arrivals}, prefix caching off", "continuous", (*flags, "--no-prefix-caching")),
        ]
    return [*paging, ("customer-support", prefix)]


def run_config(config: Config, loaded: LoadedModel, common: Sequence[str], repeat: int) -> dict:
    """One configuration through the benchmark's own plan and runner: the median run's figures."""
    settings = load_settings()
    args = race_args([*config.flags, *common, "--modes", config.mode, "--repeat", str(repeat)])
    plan = make_plan(args, settings, loaded, check_flags(args))
    runs = run_all(plan, loaded, {}, repeat, show=False)[config.mode]
    return {"label": config.label, "slots": plan.options.max_batch_size, **mode_report(median_run(runs), plan, runs)}


def format_tables(result: dict) -> str:
    """One row per run: throughput, latency, and the pool as each schedule used it."""
    header = ["workload", "run", "tok/s", "wall s", "TTFT p50 ms", "most running", "peak blocks", "peak reserved"]
    header += ["peak tokens", "tokens/reserved", "preemptions", "prefix hits"]
    rows = []
    for workload, runs in result["workloads"].items():
        for run in runs:
            memory = run["memory"]
            rows.append(
                [
                    workload,
                    run["label"],
                    _fmt(run["tokens_per_s"], digits=1),
                    _fmt(run["wall_s"]),
                    _fmt(run["ttft_s"]["p50"], 1000, 1),
                    str(memory["peak_running"]),
                    f"{memory['peak_blocks']} ({_fmt(memory['peak_blocks_share'], 100, 0)}%)",
                    str(memory["peak_reserved"]),
                    str(memory["peak_tokens"]),
                    f"{_fmt(memory['used_over_reserved'], 100, 0)}%",
                    str(memory["preemptions"]),
                    f"{_fmt(memory['prefix_hit_rate'], 100, 0)}%",
                ]
            )
    budget = result["budget"]
    lines = [
        f"KV memory of {FULL_SLOTS} full-length slots: {budget['positions']} positions ({budget['blocks']} blocks of "
        f"{budget['block_size']}), model {result['model']}, {result['threads']} thread(s), "
        f"median of {result['repeat']}",
        text_table(header, rows, gap="  "),
    ]
    support = result["workloads"]["customer-support"]
    for on, off in zip(support[::2], support[1::2], strict=True):
        ttft_on, ttft_off = on["ttft_s"]["p50"], off["ttft_s"]["p50"]
        lines.append(
            f"prefix caching, {on['label'].split(', ')[1]}: TTFT p50 {ttft_on * 1000:.1f} ms on vs "
            f"{ttft_off * 1000:.1f} ms off ({(ttft_on / ttft_off - 1) * 100:+.0f}%), "
            f"{on['memory']['prefix_hits']} of {on['memory']['prefix_queries']} prompt tokens found cached"
        )
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Memory's flags."""
    options.add(parser, "--model", "builtin")
    parser.add_argument("--slots", type=int, default=32, help="slots of the paged runs (default 32)")
    parser.add_argument("--random-requests", type=int, default=64, help="requests of the random workload (default 64)")
    options.add(parser, "--repeat", 1)
    options.add(parser, "--threads", 1)
    options.add(parser, "--json", said="printed")


def run(args: argparse.Namespace) -> int:
    """`python -m batching.bench memory`: every configuration's run, the table, and the figures as JSON."""
    torch.set_num_threads(args.threads)
    common = ["--model", args.model, "--device", "cpu", "--dtype", "float32", "--no-step-detail"]
    settings = load_settings()
    loaded = load(race_args(["--workload", "seed-blog", *common]), settings)
    context = PoolGeometry.of(loaded.model).context(BatcherOptions())
    block_size = settings.batching.block_size
    budget = FULL_SLOTS * -(-context // block_size) * block_size  # what 8 slots of the whole context hold
    result: dict = {
        "model": loaded.name,
        "threads": args.threads,
        "repeat": args.repeat,
        "budget": {"positions": budget, "blocks": budget // block_size, "block_size": block_size},
        "workloads": {},
    }
    for workload, runs in configs(budget, args.slots, args.random_requests):
        result["workloads"][workload] = [run_config(run, loaded, common, args.repeat) for run in runs]
    print(format_tables(result))
    for runs in result["workloads"].values():
        for each in runs:
            each.pop("requests")  # token ids: the race's own JSON has them
    text = json.dumps(json_safe(result), indent=1, allow_nan=False)
    if args.json:
        args.json.write_text(text, encoding="utf-8")
    else:
        print(text)
    return 0
