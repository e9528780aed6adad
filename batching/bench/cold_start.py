"""Does the first race after a cold start measure batching, not the compiler?

`python -m batching.bench cold-start [--workloads customer-support,seed-lab] [--starts 3] [--json FILE]`

Each start is a newcomer's: a fresh engine process with compiled steps on (the default) and an empty compile cache.
Each workload is raced at once, as the page races it (the race waits for its graphs, which the engine makes while
it waits, then times compiled steps); then, once the engine says its steps are compiled, each is raced again.
Prints each workload's first-race and after-the-graph speed-ups (the median over starts), how far apart
they are, how each race's steps ran, and how long the graph took. A script that prints figures, not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from batching.bench import options
from batching.bench.options import BadInput
from batching.bench.race_check import RaceResult, add_workloads, race_once, race_queue
from batching.command_line import first_below_one
from batching.service import EngineClient, EngineConfig
from config.settings import Settings, load_settings

COMPILE_TIMEOUT_S = 1800.0


def wait_until_compiled(client: EngineClient) -> float:
    """Wait (the engine idle, so its compile runs) until every graph is made; returns the seconds waited."""
    started = time.monotonic()
    while (stage := client.lifecycle.stats.compile.stage) != "compiled":
        if stage in ("failed", "off", "waiting"):  # waiting: no decode step asked for a graph
            raise RuntimeError(f"the engine's compiled steps are {stage}: nothing to compare with")
        if time.monotonic() - started > COMPILE_TIMEOUT_S:
            raise RuntimeError(f"the graph was not made within {COMPILE_TIMEOUT_S:.0f} s")
        time.sleep(0.5)
    return time.monotonic() - started


def one_start(settings: Settings, workloads: Sequence[str]) -> dict:
    """A cold start: first races, the wait for the graph, the same races again."""
    with tempfile.TemporaryDirectory(prefix="batchscope-cold-") as cache:
        settings = settings.model_copy(deep=True)
        settings.engine.compile_steps, settings.engine.compile_cache_dir = True, Path(cache)
        client = EngineClient(EngineConfig(settings.model, settings.tokenizer, settings.engine), settings.limits)
        try:
            queues = {name: race_queue(settings, name) for name in workloads}
            first: dict[str, RaceResult] = {name: race_once(client, *queues[name]) for name in workloads}
            waited = wait_until_compiled(client)
            after: dict[str, RaceResult] = {name: race_once(client, *queues[name]) for name in workloads}
            compile_s = client.lifecycle.stats.compile.seconds
        finally:
            client.close()
    return {"first": first, "after": after, "waited_s": waited, "compile_s": compile_s}


def summarize(starts: list[dict], workloads: Sequence[str]) -> list[dict]:
    rows = []
    for name in workloads:
        first = [start["first"][name] for start in starts]
        after = [start["after"][name] for start in starts]
        first_x = statistics.median(result.speedup for result in first)
        after_x = statistics.median(result.speedup for result in after)
        rows.append(
            {
                "workload": name,
                "first_speedup": first_x,
                "after_speedup": after_x,
                "gap": first_x / after_x - 1,
                "first_speedups": [result.speedup for result in first],
                "after_speedups": [result.speedup for result in after],
                "first_steps": sorted({kind for result in first for kind in result.kinds.values()}),
                "after_steps": sorted({kind for result in after for kind in result.kinds.values()}),
            }
        )
    return rows


def print_table(rows: list[dict], starts: list[dict]) -> None:
    print(f"{'workload':<18} {'first race':>11} {'after the graph':>16} {'gap':>7}   steps: first race / after")
    for row in rows:
        kinds = f"{', '.join(row['first_steps'])} / {', '.join(row['after_steps'])}"
        print(
            f"{row['workload']:<18} {row['first_speedup']:>10.2f}x {row['after_speedup']:>15.2f}x "
            f"{row['gap']:>+7.1%}   {kinds}"
        )
    # None: a graph was being made again when the races ended (a guard miss remakes it in the background).
    made = ", ".join("still making" if s["compile_s"] is None else f"{s['compile_s']:.0f} s" for s in starts)
    waited = ", ".join(f"{start['waited_s']:.0f} s" for start in starts)
    print(
        f"{len(starts)} cold starts, median speed-ups; the graph took {made} to make (waited {waited} after the races)"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The cold-start check's flags."""
    add_workloads(parser, "customer-support,seed-lab")
    parser.add_argument("--starts", type=int, default=3, help="cold starts; the median speed-up is shown (default 3)")
    options.add_all(parser, "--json")


def run(args: argparse.Namespace) -> int:
    """`python -m batching.bench cold-start`: every start's races, and each workload's median speed-ups."""
    problem = first_below_one(args, ["starts"])
    if problem:
        raise BadInput(problem)
    settings = load_settings()
    workloads = args.workloads
    starts = [one_start(settings, workloads) for _ in range(args.starts)]
    rows = summarize(starts, workloads)
    print_table(rows, starts)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2), encoding="utf-8")
    return 0
