"""Does the page's race measure what the benchmark measures? Both, back to back, on the same workloads.

`python -m batching.bench race-check [--workloads seed-lab,customer-support] [--repeat 3] [--json FILE]`

For each workload: the benchmark's race of static and continuous (`batching.bench race`, in this process, one torch
thread), then the same queue raced as the page races it (an engine process, both lanes stepped in turn on their own
clocks). It prints each side's speed-up of continuous over static (the median of `--repeat` runs) and how far apart
they are. A script that prints figures, not a test: timings on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass

from batching.arrivals import Schedule
from batching.bench import options
from batching.bench.options import BadInput
from batching.bench.race import benchmark, race_args
from batching.bench.workloads import load_workload
from batching.command_line import first_below_one
from batching.engine.batcher import MODES
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams
from batching.race import LaneStep
from batching.runs import RunRecord
from batching.service import EngineClient, EngineConfig, RaceHandle
from batching.service.client import engine_options
from batching.service.messages import RaceEnded
from config.settings import Settings, load_settings
from model.prompting import format_prompt
from utils.metrics.run import steps_kind

RACE_TIMEOUT_S = 600.0


def bench_speedup(workload: str, repeat: int, options: BatcherOptions) -> float:
    """The benchmark CLI's speed-up (median runs, one torch thread, as the engine process runs a small model), on the
    race's KV memory (the page's settings give it 1,024 positions; the CLI's default is every slot's context)."""
    flags = ["--workload", workload, "--modes", "static,continuous", "--repeat", str(repeat), "--threads", "1"]
    flags += ["--block-size", str(options.block_size)]
    if options.kv_cache_tokens is not None:
        flags += ["--kv-cache-tokens", str(options.kv_cache_tokens)]
    elif options.kv_cache_mb is not None:
        flags += ["--kv-cache-mb", str(options.kv_cache_mb)]
    if not options.prefix_caching:
        flags.append("--no-prefix-caching")
    args = race_args([*flags, "--no-progress"])
    return float(benchmark(args)["modes"]["continuous"]["speedup_vs_static"])


@dataclass(frozen=True)
class RaceResult:
    """One race: each lane's wall time on its own clock, and how its steps ran (`utils.metrics.run.steps_kind`)."""

    walls: dict[str, float]
    kinds: dict[str, str]

    @property
    def speedup(self) -> float:
        return self.walls["static"] / self.walls["continuous"]


def race_once(client: EngineClient, options: BatcherOptions, items: list, schedule: Schedule) -> RaceResult:
    """One race to its end."""
    race: RaceHandle = client.private.start_race(options, items, schedule)
    records: dict[str, RunRecord] = {mode: RunRecord(mode, 0.0) for mode in MODES}
    deadline = time.monotonic() + RACE_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            for message in race.poll(timeout=0.2):
                if isinstance(message, LaneStep):
                    records[message.mode].extend(message.events)
                elif isinstance(message, RaceEnded):
                    if message.error:
                        raise RuntimeError(f"the race failed: {message.error}")
                    walls = {mode: end - start for mode, start, end in message.walls}
                    return RaceResult(walls, {mode: steps_kind(record) for mode, record in records.items()})
    finally:
        race.close()
    raise RuntimeError(f"the race did not end within {RACE_TIMEOUT_S:.0f} s")


def race_queue(settings: Settings, workload_name: str) -> tuple[BatcherOptions, list, Schedule]:
    """The page's race of a workload: its batch size and arrivals, the page's prompt format and settings (compiled
    steps as the settings say)."""
    workload = load_workload(workload_name)
    options = engine_options(settings, workload.batch_size)
    default_cap = settings.generation.max_new_tokens
    template = (settings.prompt.system_prompt, settings.prompt.template)
    items = [
        (format_prompt(r.prompt, *template), RequestParams(r.max_new_tokens or default_cap), f"q{index}")
        for index, r in enumerate(workload.requests)
    ]
    return options, items, workload.schedule()


def race_speedup(client: EngineClient, settings: Settings, workload_name: str, repeat: int) -> float:
    """The page's race on the workload: median speed-up."""
    options, items, schedule = race_queue(settings, workload_name)
    race_once(client, options, items[:2], Schedule.at_once(2))  # warm-up, as the benchmark does
    return statistics.median(race_once(client, options, items, schedule).speedup for _ in range(repeat))


def add_workloads(parser: argparse.ArgumentParser, default: str) -> None:
    """`--workloads`, a comma list of built-in workloads (this check's and `cold-start`'s)."""
    parser.add_argument(
        "--workloads",
        default=default,
        type=lambda text: [name.strip() for name in text.split(",") if name.strip()],
        help=f"comma list of built-in workloads (default: {default})",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The race check's flags."""
    add_workloads(parser, "seed-lab,customer-support")
    options.add(parser, "--repeat", 3, said="3, the median speed-up shown")
    options.add_all(parser, "--json")


def run(args: argparse.Namespace) -> int:
    """`python -m batching.bench race-check`: each workload's two speed-ups and how far apart they are."""
    problem = first_below_one(args, ["repeat"])
    if problem:
        raise BadInput(problem)
    # Eager steps, as the benchmark's static and continuous modes run.
    settings = load_settings().model_copy(deep=True)
    settings.engine.compile_steps = False
    client = EngineClient(EngineConfig(settings.model, settings.tokenizer, settings.engine), settings.limits)
    rows = []
    try:
        for name in args.workloads:
            bench = bench_speedup(name, args.repeat, race_queue(settings, name)[0])
            race = race_speedup(client, settings, name, args.repeat)
            rows.append({"workload": name, "bench_speedup": bench, "race_speedup": race, "gap": race / bench - 1})
    finally:
        client.close()
    print(f"{'workload':<18} {'bench speed-up':>15} {'race speed-up':>14} {'gap':>7}")
    for row in rows:
        print(f"{row['workload']:<18} {row['bench_speedup']:>14.2f}x {row['race_speedup']:>13.2f}x {row['gap']:>+7.1%}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2), encoding="utf-8")
    return 0
