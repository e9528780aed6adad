"""The benchmark half of the GPU check (scripts/gpu_check.sh): both reference workloads on one loaded model, its graphs
compiled once, while the engine tests run beside it; the timed runs wait until the tests are done.

    python -m batching.bench gpu-check --out DIR [--wait-for FILE] [--deadline-s S] [--device cuda --dtype bfloat16]

In order, so that a run cut short has kept what matters most: compile both graphs (their seconds; inductor's cache
packed into DIR for a second run to start from), then wait for FILE; seed-lab with our compiled mode, our eager
continuous batching and transformers' continuous batching (median of 3) and the raw-matmul floor; seed-blog compiled
and transformers (median of 3), then eager (one run); a profile of one compiled seed-lab run. Every result is written
to DIR as it comes; the last lines printed are a short table. A step that would start past the deadline is left out,
and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import tarfile
import time
from pathlib import Path

import torch
import transformers

from batching.bench import race
from batching.bench.floor import format_floor
from batching.bench.options import add, load
from batching.bench.peers.contenders import PeerServers
from batching.bench.report import format_report
from batching.bench.shapes import build_shape
from batching.engine import cuda_graphs
from config.settings import load_settings
from utils.export import json_safe

WORKLOADS = ("seed-lab", "seed-blog")
# Seconds a step is expected to need at most (0.5B shape): one that would end past the deadline is left out. On an
# H100 seed-lab took 117 s, about 90 of them before its first timed run (transformers' peer, the warm-up runs).
NEEDS = {"seed-lab": 120, "seed-blog": 90, "seed-blog eager": 30, "profile": 20}
CACHE_LIMIT = 16 * 2**20  # the largest file the device machine sends back


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The GPU check's flags."""
    parser.add_argument("--out", type=Path, required=True, help="folder for the results")
    parser.add_argument("--wait-for", type=Path, help="time nothing until this file exists (the tests are done)")
    parser.add_argument("--deadline-s", type=float, default=400.0, help="leave out steps that would end later")
    add(parser, "--model-shape", "qwen2-0.5b")
    add(parser, "--device", "cuda")
    add(parser, "--dtype", "bfloat16")
    add(parser, "--repeat", 3)
    parser.add_argument("--no-pack-cache", dest="pack_cache", action="store_false", help="keep inductor's cache here")


class Check:
    """One GPU check: the loaded model shared by every run, the clock against the deadline, what came back."""

    def __init__(self, options: argparse.Namespace) -> None:
        self.options = options
        self.start = time.perf_counter()
        self.settings = load_settings()
        self.results: dict[str, dict] = {}
        self.left_out: list[str] = []
        base = ["--workload", WORKLOADS[0], "--model-shape", options.model_shape, "--device", options.device]
        base += ["--dtype", options.dtype, "--ignore-eos", "--no-progress", "--no-step-detail"]
        self.base = base
        args = self.args(WORKLOADS[0], "compiled", 1)
        args.model = str(build_shape(options.model_shape))
        self.model_folder = args.model
        self.loaded = load(args, self.settings)

    def args(self, workload: str, modes: str, repeat: int, floor: bool = False) -> argparse.Namespace:
        argv = [*self.base, "--modes", modes, "--repeat", str(repeat)]
        argv[1] = workload
        args = race.race_args([*argv, *(["--floor"] if floor else [])])
        args.model_shape, args.model = None, getattr(self, "model_folder", None)
        return args

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def may_run(self, step: str) -> bool:
        if self.elapsed() + NEEDS[step] <= self.options.deadline_s:
            return True
        self.left_out.append(step)
        print(f"gpu check: {step} left out ({self.elapsed():.0f} s gone, needs about {NEEDS[step]} s)", flush=True)
        return False

    def compile_graphs(self) -> None:
        """The compiled mode's graphs, before anything is timed (the benchmark's own call finds them): the decode
        graph, then the prompt-step graph where it would leave time for both workloads (its time budgeted from the
        decode graph's, as it went on an H100: docs/benchmarks.md); else the compiled mode's prompt steps run eager,
        and the output says so."""
        decode = self.compile(prompt_steps=False)
        needs = 1.4 * decode + NEEDS["seed-lab"] + NEEDS["seed-blog"]
        if self.elapsed() + needs <= self.options.deadline_s:
            self.compile(prompt_steps=True)
        else:
            self.left_out.append("prompt-step graph")
            gone = self.elapsed()
            print(f"gpu check: prompt-step graph left out ({gone:.0f} s gone): prompt steps eager", flush=True)
            self.use_prompt_graph(False)

    def compile(self, prompt_steps: bool) -> float:
        """The compiled mode's graphs (the prompt-step graph too, or not); their seconds."""
        self.use_prompt_graph(prompt_steps)
        args = self.args(WORKLOADS[0], "compiled", 1)
        plan = race.make_plan(args, self.settings, self.loaded, race.check_flags(args))
        seconds = race.compile_steps(plan, self.loaded) or 0.0
        print(f"gpu check: graphs compiled (prompt steps {prompt_steps}) in {seconds:.1f} s", flush=True)
        return seconds

    def use_prompt_graph(self, on: bool) -> None:
        engine = self.settings.engine.model_copy(update={"compile_prompt_steps": on})
        self.settings = self.settings.model_copy(update={"engine": engine})

    def bench(self, workload: str, modes: str, repeat: int, floor: bool = False) -> dict:
        """One benchmark run as the CLI makes it, on the shared model; its table printed, its JSON kept."""
        args = self.args(workload, modes, repeat, floor)
        result = race.race(args, self.settings, race.check_flags(args), PeerServers(), loaded=self.loaded)
        print(format_report(result), flush=True)
        if result["floor"] is not None:
            print(format_floor(result["floor"]), flush=True)
        if result["first_error"]:
            print(f"gpu check: {workload}: {result['first_error']}", flush=True)
        previous = self.results.get(workload)
        if previous is not None:  # a later run of other modes joins the workload's figures
            previous["modes"].update(result["modes"])
            result = previous
        self.results[workload] = result
        result["cuda_graphs"] = dict(cuda_graphs.STATS)
        self.write(f"{workload}.json", json.dumps(json_safe(result), indent=1, allow_nan=False))
        return result

    def profile(self) -> None:
        """One compiled seed-lab run under torch's profiler: the host's busiest calls and the device's kernel time."""
        args = self.args(WORKLOADS[0], "compiled", 1)
        plan = race.make_plan(args, self.settings, self.loaded, race.check_flags(args))
        race.run_batcher("compiled", self.loaded, plan)  # a warm-up, as the benchmark's
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as profiler:
            run = race.run_batcher("compiled", self.loaded, plan)
        averages = profiler.key_averages()
        device_us = sum(event.self_device_time_total for event in averages)
        lines = [
            f"one compiled seed-lab run under the profiler: wall {run.record.wall_s * 1000:.0f} ms, "
            f"{len(run.record.steps)} steps, device kernels {device_us / 1000:.0f} ms in all",
            averages.table(sort_by="self_cpu_time_total", row_limit=30),
            averages.table(sort_by="self_device_time_total", row_limit=20),
        ]
        self.write("profile.txt", "\n\n".join(lines))
        print(lines[0], flush=True)

    def pack_cache(self) -> None:
        """Inductor's cache as a tar for a second run to carry (left out when over what comes back)."""
        folder = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        if not folder:
            return
        target = self.options.out / "inductor-cache.tgz"
        with tarfile.open(target, "w:gz") as tar:
            tar.add(folder, arcname="inductor-cache")
        if target.stat().st_size > CACHE_LIMIT:
            print(f"gpu check: inductor's cache is {target.stat().st_size >> 20} MiB, not sent back", flush=True)
            target.unlink()

    def write(self, name: str, text: str) -> None:
        (self.options.out / name).write_text(text, encoding="utf-8")


def summary(results: dict[str, dict]) -> list[str]:
    """The short table: per workload and mode, tok/s, mean decode and prompt step ms, TTFT p50, and ours over hf."""
    lines = ["workload    mode        tok/s  decode ms  prompt ms  TTFT p50 ms  outside s  / hf"]
    for workload, result in results.items():
        modes = result["modes"]
        hf = modes.get("hf", {}).get("tokens_per_s")
        for mode, figures in modes.items():
            steps = figures["step_time"]
            ratio = f"{figures['tokens_per_s'] / hf:.2f}x" if hf else "-"
            lines.append(
                f"{workload:<11} {mode:<10} {figures['tokens_per_s']:>6.1f} {steps.get('mean_ms', float('nan')):>10.2f}"
                f" {steps['prefill_mean_ms']:>10.2f} {figures['ttft_s']['p50'] * 1000:>12.1f}"
                f" {steps['outside_steps_s']:>10.3f}  {ratio}"
            )
    return lines


def run(options: argparse.Namespace) -> int:
    """`python -m batching.bench gpu-check`: the graphs, then each step the deadline leaves room for, in order."""
    options.out.mkdir(parents=True, exist_ok=True)
    check = Check(options)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    machine = f"{device}, torch {torch.version.__version__}"
    print(f"gpu check: {machine}, transformers {transformers.__version__}, model loaded", flush=True)
    check.compile_graphs()
    if options.pack_cache:
        check.pack_cache()
    while options.wait_for is not None and not options.wait_for.exists():
        time.sleep(1)
    print(f"gpu check: timing from {check.elapsed():.0f} s", flush=True)
    repeat = options.repeat
    if check.may_run("seed-lab"):
        check.bench("seed-lab", "compiled,continuous,hf", repeat, floor=True)
    if check.may_run("seed-blog"):
        check.bench("seed-blog", "compiled,hf", repeat)
    if check.may_run("seed-blog eager"):
        check.bench("seed-blog", "continuous", 1)
    if check.may_run("profile"):
        check.profile()
    graphs = dict(cuda_graphs.STATS)
    print(f"gpu check: cuda graphs {graphs}; left out: {', '.join(check.left_out) or 'nothing'}")
    print("gpu check summary:")
    print("\n".join(summary(check.results)))
    return 0
