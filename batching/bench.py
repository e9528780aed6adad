"""Benchmark CLI: run one workload through static batching, continuous batching and transformers' own peer.

    python -m batching.bench --workload seed-lab --modes static,continuous,hf --ignore-eos --repeat 3

All modes share one loaded model (the peer gets its own instance), run alternately, and the median run of each
is reported: a table on stdout, optionally JSON (`--json`) and a PNG of occupancy and latency charts (`--plot`).
Bad input (workload, flags, model) is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NoReturn

import torch
import transformers
from tqdm import tqdm

from batching.arrivals import ArrivalDriver, Schedule, drive
from batching.continuous import ContinuousBatcher
from batching.engine import Batcher, eos_token_ids
from batching.events import FinishedEvent, StepEvent
from batching.hf_peer import HFPeer
from batching.scheduler import POLICIES
from batching.static import StaticBatcher
from batching.workloads import (
    DISTRIBUTIONS,
    RANDOM_NAME,
    LengthRange,
    Workload,
    load_workload,
    random_workload,
)
from config.settings import Settings, SettingsError, load_settings
from model.loader import LoadedModel, ModelLoadError, load_model
from utils.metrics import RunRecord, percentile, summarize
from utils.prompting import format_prompt

MODES = ("static", "continuous", "hf")
BATCHERS: dict[str, type[Batcher]] = {"static": StaticBatcher, "continuous": ContinuousBatcher}
WARM_UP_TOKENS = 4


class BenchError(Exception):
    """Bad input: reported as one line on stderr, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse would print the usage too: keep it to one line
        raise BenchError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m batching.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--workload", required=True, help="built-in name, 'random', or a .json/.csv file")
    parser.add_argument("--modes", default="static,continuous", help="comma list of static, continuous, hf")
    parser.add_argument("--policy", choices=list(POLICIES), help="admission order (default: settings)")
    parser.add_argument("--batch-size", type=int, help="slots (default: the workload's)")
    parser.add_argument("--max-batched-tokens", type=int, help="tokens per step (default: settings)")
    parser.add_argument("--model", help="builtin, a hub id or a local folder (default: settings)")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda", "mps"], help="default: settings")
    parser.add_argument("--dtype", choices=["auto", "float32", "float16", "bfloat16"], help="default: settings")
    parser.add_argument("--ignore-eos", action="store_true", help="generate every request up to its cap")
    parser.add_argument("--max-new-tokens", type=int, help="cap of requests the workload leaves uncapped")
    parser.add_argument("--raw-prompts", action="store_true", help="send prompts as they are, without the Q/A template")
    parser.add_argument("--repeat", type=int, default=1, help="timed runs per mode, alternating; the median is shown")
    parser.add_argument("--rate", type=float, help="Poisson arrivals at this many requests/s (seeded)")
    parser.add_argument("--seed", type=int, default=0, help="seed of Poisson arrivals and the random workload")
    parser.add_argument("--random-requests", type=int, default=32, help="random workload: number of requests")
    parser.add_argument("--random-prompt-words", default="4:40", help="random workload: prompt words LOW:HIGH")
    parser.add_argument("--random-max-new-tokens", default="8:256", help="random workload: caps LOW:HIGH")
    parser.add_argument("--random-dist", choices=DISTRIBUTIONS, default="exponential", help="random workload: caps")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--plot", type=Path, help="write occupancy and latency charts here (PNG)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


@dataclass(frozen=True)
class Plan:
    """Everything a run needs, validated: token ids and caps in workload order, the arrival schedule."""

    workload: Workload
    modes: tuple[str, ...]
    prompt_ids: tuple[tuple[int, ...], ...]
    caps: tuple[int, ...]
    schedule: Schedule
    batch_size: int
    max_batched_tokens: int
    policy: str
    max_prompt_tokens: int
    max_seq_len: int
    ignore_eos: bool


@dataclass
class ModeRun:
    """One timed run of one mode: its events, the longest sequence in each step (for step-time statistics), and
    the CPU time the process used (well below the wall time when other work on the machine took the CPU)."""

    record: RunRecord
    kv_lens: list[int] = field(default_factory=list)
    cpu_s: float = math.nan


# --- inputs -------------------------------------------------------------------------------------------------------
def parse_modes(text: str) -> tuple[str, ...]:
    modes = tuple(mode.strip() for mode in text.split(",") if mode.strip())
    bad = [mode for mode in modes if mode not in MODES]
    if bad or not modes or len(set(modes)) != len(modes):
        raise BenchError(f"--modes {text!r} is not allowed: a comma list of distinct modes from {', '.join(MODES)}")
    return modes


@dataclass(frozen=True)
class Inputs:
    """What the flags ask for, checked before the model is loaded."""

    modes: tuple[str, ...]
    workload: Workload
    schedule: Schedule


def check_flags(args: argparse.Namespace) -> Inputs:
    """Everything that can be checked before loading the model: numbers, modes, workload, arrivals."""
    for flag in ("batch_size", "max_batched_tokens", "max_new_tokens", "threads", "repeat"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise BenchError(f"--{flag.replace('_', '-')}={value} is not allowed: must be >= 1")
    for flag in ("json", "plot"):
        path = getattr(args, flag)
        if path is not None and not path.parent.is_dir():
            raise BenchError(f"--{flag} {path}: the folder {path.parent} does not exist")
    modes = parse_modes(args.modes)
    try:
        if args.workload == RANDOM_NAME:
            workload = random_workload(
                requests=args.random_requests,
                prompt_words=LengthRange.parse(args.random_prompt_words),
                max_new_tokens=LengthRange.parse(args.random_max_new_tokens, args.random_dist),
                batch_size=args.batch_size or 8,
                seed=args.seed,
            )
        else:
            workload = load_workload(args.workload)
        schedule = Schedule.for_workload(workload, args.rate, args.seed)
    except ValueError as exc:
        raise BenchError(str(exc)) from None
    return Inputs(modes, workload, schedule)


def make_plan(args: argparse.Namespace, settings: Settings, loaded: LoadedModel, inputs: Inputs) -> Plan:
    """Tokenise the workload and check each request against the model's context; raises BenchError."""
    workload = inputs.workload
    batch_size = args.batch_size or workload.batch_size
    max_batched_tokens = args.max_batched_tokens or settings.batching.max_batched_tokens
    policy = args.policy or settings.batching.policy
    default_cap = args.max_new_tokens or settings.generation.max_new_tokens
    try:
        checker = ContinuousBatcher(
            loaded.model,
            loaded.tokenizer,
            max_batch_size=batch_size,
            max_batched_tokens=max_batched_tokens,
            policy=policy,
            max_prompt_tokens=settings.tokenizer.max_prompt_tokens,
            max_seq_len=settings.batching.max_seq_len,
        )
    except ValueError as exc:  # batch size or token budget out of range
        raise BenchError(str(exc)) from None
    prompt_ids, caps = [], []
    for index, item in enumerate(workload.requests):
        text = item.prompt if args.raw_prompts else format_prompt(item.prompt, *_template(settings))
        cap = item.max_new_tokens or default_cap
        try:
            request = checker.make_request(text, cap)
        except ValueError as exc:
            raise BenchError(f"workload {workload.name} request {index}: {exc}") from None
        prompt_ids.append(tuple(request.prompt_ids))
        caps.append(cap)
    return Plan(
        workload=workload,
        modes=inputs.modes,
        prompt_ids=tuple(prompt_ids),
        caps=tuple(caps),
        schedule=inputs.schedule,
        batch_size=batch_size,
        max_batched_tokens=max_batched_tokens,
        policy=policy,
        max_prompt_tokens=settings.tokenizer.max_prompt_tokens,
        max_seq_len=settings.batching.max_seq_len,
        ignore_eos=args.ignore_eos,
    )


def _template(settings: Settings) -> tuple[str, str]:
    return settings.prompt.system_prompt, settings.prompt.template


# --- running ------------------------------------------------------------------------------------------------------
def run_batcher(mode: str, loaded: LoadedModel, plan: Plan, progress: tqdm | None = None) -> ModeRun:
    """One run of our static or continuous batcher on a fresh batcher (fresh slots, same model)."""
    batcher = BATCHERS[mode](
        loaded.model,
        loaded.tokenizer,
        max_batch_size=plan.batch_size,
        max_batched_tokens=plan.max_batched_tokens,
        policy=plan.policy,
        max_prompt_tokens=plan.max_prompt_tokens,
        max_seq_len=plan.max_seq_len,
    )
    requests = {}

    def submit(index: int, arrival: float) -> None:
        request_id = f"q{index}"
        request = batcher.builder.build(
            list(plan.prompt_ids[index]),
            plan.caps[index],
            ignore_eos=plan.ignore_eos,
            request_id=request_id,
            arrival=arrival,
        )
        requests[request_id] = batcher.submit(request)

    driver = ArrivalDriver(plan.schedule, submit)
    run = ModeRun(RunRecord(mode=mode, start=driver.start()))
    for event in drive(batcher, driver):
        run.record.add(event)
        if isinstance(event, StepEvent):
            run.kv_lens.append(
                max(len(requests[rid].prompt_ids) + len(requests[rid].output_ids) for rid in event.slots if rid)
            )
        elif isinstance(event, FinishedEvent) and progress is not None:
            progress.update(1)
    run.record.end = time.perf_counter()
    return run


def warm_up(plan: Plan, loaded: LoadedModel, peer: HFPeer | None) -> None:
    """One short untimed run per mode: first-call allocations and lazy initialisation stay out of the timings."""
    count = min(len(plan.caps), 2)
    short = replace(
        plan,
        prompt_ids=plan.prompt_ids[:count],
        caps=tuple(min(cap, WARM_UP_TOKENS) for cap in plan.caps[:count]),
        schedule=Schedule.at_once(count),
    )
    for mode in plan.modes:
        if mode in BATCHERS:
            run_batcher(mode, loaded, short)
    if peer is not None:
        peer.warm_up(plan.prompt_ids[0], WARM_UP_TOKENS)


def run_all(plan: Plan, loaded: LoadedModel, peer: HFPeer | None, repeat: int, show: bool) -> dict[str, list[ModeRun]]:
    """`repeat` rounds of every mode in turn (static, continuous, hf, static, ...)."""
    warm_up(plan, loaded, peer)
    runs: dict[str, list[ModeRun]] = {mode: [] for mode in plan.modes}
    total = repeat * len(plan.modes) * len(plan.caps)
    with tqdm(total=total, unit="req", file=sys.stderr, disable=not show, dynamic_ncols=True) as progress:
        for round_index in range(repeat):
            for mode in plan.modes:
                progress.set_description(f"{mode} {round_index + 1}/{repeat}")
                cpu = time.process_time()
                if mode == "hf":
                    record, kv_lens = peer.run(
                        plan.prompt_ids,
                        plan.caps,
                        plan.schedule,
                        plan.ignore_eos,
                        on_finished=lambda _: progress.update(1),
                    )
                    run = ModeRun(record, kv_lens)
                else:
                    run = run_batcher(mode, loaded, plan, progress)
                run.cpu_s = time.process_time() - cpu
                runs[mode].append(run)
    return runs


def median_run(runs: Sequence[ModeRun]) -> ModeRun:
    """The run with the median wall time (the lower middle one for an even count)."""
    ordered = sorted(runs, key=lambda run: run.record.wall_s)
    return ordered[(len(ordered) - 1) // 2]


# --- figures ------------------------------------------------------------------------------------------------------
def speedup_figures(
    static_wall: float, static_steps: int | None, wall: float, steps: int | None
) -> tuple[float, float, float]:
    """Measured speed-up over static, the one the step counts allow (static steps / these steps), and their ratio."""
    speedup = static_wall / wall if wall > 0 else math.nan
    ideal = static_steps / steps if static_steps and steps else math.nan
    return speedup, ideal, speedup / ideal if ideal > 0 else math.nan


def step_time_stats(run: ModeRun, buckets: int = 4) -> dict:
    """Where the time went: steps with prompt tokens vs decode-only steps, time outside any step, and decode-step
    durations against history (first vs last quarter; by the longest sequence in the step).

    A flat decode step (its cost not growing with the sequence length) shows as `last_over_first` near 1 and
    flat `by_kv_len` rows. `full_batch` repeats the quarters over steps with the most rows, so a batch shrinking
    at the end of a run does not hide growth.
    """
    timed = [
        ((step.end - step.start) * 1000, kv_len, sum(1 for rid in step.slots if rid is not None), step.prefill_tokens)
        for step, kv_len in zip(run.record.steps, run.kv_lens, strict=True)
    ]
    prefill = [ms for ms, _, _, prompt_tokens in timed if prompt_tokens]
    steps = [(ms, kv, rows) for ms, kv, rows, prompt_tokens in timed if not prompt_tokens]
    in_steps = sum(ms for ms, *_ in timed) / 1000
    figures = {
        "in_steps_s": in_steps,
        "outside_steps_s": run.record.wall_s - in_steps if timed else math.nan,
        "prefill_steps": len(prefill),
        "prefill_mean_ms": statistics.fmean(prefill) if prefill else math.nan,
        "prefill_share": sum(prefill) / 1000 / in_steps if in_steps else math.nan,
        "decode_steps": len(steps),
    }
    if not steps:
        return figures
    most_rows = max(rows for *_, rows in steps)
    low = min(kv for _, kv, _ in steps)
    width = max(1, math.ceil((max(kv for _, kv, _ in steps) - low + 1) / buckets))
    by_kv = []
    for bucket in range(buckets):
        inside = [(ms, rows) for ms, kv, rows in steps if low + bucket * width <= kv < low + (bucket + 1) * width]
        if inside:
            by_kv.append(
                {
                    "kv_len": f"{low + bucket * width}-{low + (bucket + 1) * width - 1}",
                    "steps": len(inside),
                    "mean_ms": statistics.fmean(ms for ms, _ in inside),
                    "mean_rows": statistics.fmean(rows for _, rows in inside),
                }
            )
    return {
        **figures,
        "mean_ms": statistics.fmean(ms for ms, *_ in steps),
        "p50_ms": percentile([ms for ms, *_ in steps], 50),
        **_quarters([ms for ms, *_ in steps]),
        "full_batch": {"rows": most_rows, **_quarters([ms for ms, _, rows in steps if rows == most_rows])},
        "by_kv_len": by_kv,
    }


def _quarters(durations: Sequence[float]) -> dict:
    quarter = max(1, len(durations) // 4)
    first, last = statistics.fmean(durations[:quarter]), statistics.fmean(durations[-quarter:])
    return {"first_quarter_ms": first, "last_quarter_ms": last, "last_over_first": last / first if first else math.nan}


def mode_report(run: ModeRun, plan: Plan, runs: Sequence[ModeRun]) -> dict:
    """One mode's JSON: the summary of its median run, its requests in workload order, and its step times."""
    summary = summarize(run.record).as_dict()
    by_id = {event.request_id: event for event in run.record.finished}
    requests = []
    for index, prompt in enumerate(plan.prompt_ids):
        event = by_id.get(f"q{index}")
        requests.append(
            {
                "request_id": f"q{index}",
                "prompt_ids": list(prompt),
                "output_ids": list(event.output_ids) if event else [],
                "finish_reason": event.reason.value if event else None,
                "prompt_tokens": len(prompt),
                "output_tokens": event.output_tokens if event else 0,
                "max_new_tokens": plan.caps[index],
                "arrival_s": event.arrival - run.record.start if event else None,
                "queue_s": event.queue_s if event else None,
                "ttft_s": event.ttft_s if event else None,
                "tpot_s": event.tpot_s if event else None,
                "e2e_s": event.e2e_s if event else None,
            }
        )
    if not run.record.steps:  # the peer could not report its steps
        summary["steps"] = summary["mean_occupancy"] = None
    return {
        **summary,
        "policy": {"static": "fcfs", "hf": "fifo"}.get(run.record.mode, plan.policy),
        "cpu_s": run.cpu_s,
        "requests_finished": len(run.record.finished),
        "wall_s_runs": [other.record.wall_s for other in runs],
        "step_time": step_time_stats(run),
        "requests": requests,
    }


def compare(report: dict[str, dict]) -> None:
    """Add speed-up over static, the ideal from step counts, efficiency, and whether outputs match static.

    The same figures from CPU time (`*_cpu`) are steadier than wall time when other work shares the machine.
    """
    static = report.get("static")
    if static is None:
        return
    for mode, figures in report.items():
        if mode == "static":
            continue
        speedup, ideal, efficiency = speedup_figures(
            static["wall_s"], static["steps"], figures["wall_s"], figures["steps"]
        )
        figures["speedup_vs_static"] = speedup
        figures["ideal_speedup"] = ideal
        figures["efficiency"] = efficiency
        speedup_cpu, _, efficiency_cpu = speedup_figures(
            static["cpu_s"], static["steps"], figures["cpu_s"], figures["steps"]
        )
        figures["speedup_cpu_vs_static"] = speedup_cpu
        figures["efficiency_cpu"] = efficiency_cpu
        pairs = zip(static["requests"], figures["requests"], strict=True)
        mismatched = sum(1 for ours, theirs in pairs if ours["output_ids"] != theirs["output_ids"])
        figures["outputs_match_static"] = mismatched == 0
        figures["requests_differing_from_static"] = mismatched


def machine_info(loaded: LoadedModel) -> dict:
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "device": str(loaded.device),
        "dtype": str(loaded.dtype).removeprefix("torch."),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _clean(value: object) -> object:
    """NaN and infinity become null, so the file is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _clean(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(item) for item in value]
    return value


# --- printing -----------------------------------------------------------------------------------------------------
def _fmt(value: object, scale: float = 1.0, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, int) and scale == 1.0:
        return str(value)
    return f"{value * scale:.{digits}f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)) for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def format_report(result: dict) -> str:
    """The summary table, one row per mode, then decode-step time against sequence length."""
    machine = result["machine"]
    lines = [
        f"workload {result['workload']} ({result['requests']} requests, {result['arrivals']}), "
        f"model {result['model']}, batch size {result['batch_size']}, policy {result['policy']}, max batched tokens "
        f"{result['max_batched_tokens']}, ignore EOS {result['ignore_eos']}, median of {result['repeat']}",
        f"machine: {machine['cpu_count']} x {machine['cpu_model']}, torch {machine['torch']} "
        f"({machine['torch_threads']} threads), transformers {machine['transformers']}, device {machine['device']}, "
        f"dtype {machine['dtype']}",
        "",
    ]
    header = ["mode", "wall s", "cpu s", "out tok", "tok/s", "steps", "occup", "TTFT p50/p99 ms", "TPOT p50/p99 ms"]
    header += ["e2e p50/p99 s", "speed-up", "ideal", "effic", "cpu speed-up", "= static"]
    rows = []
    for mode, figures in result["modes"].items():
        ttft, tpot, e2e = figures["ttft_s"], figures["tpot_s"], figures["e2e_s"]
        match = figures.get("outputs_match_static")
        rows.append(
            [
                mode,
                _fmt(figures["wall_s"]),
                _fmt(figures["cpu_s"]),
                _fmt(figures["output_tokens"]),
                _fmt(figures["tokens_per_s"], digits=1),
                _fmt(figures["steps"]),
                _fmt(figures["mean_occupancy"]),
                f"{_fmt(ttft['p50'], 1000, 1)} / {_fmt(ttft['p99'], 1000, 1)}",
                f"{_fmt(tpot['p50'], 1000, 2)} / {_fmt(tpot['p99'], 1000, 2)}",
                f"{_fmt(e2e['p50'])} / {_fmt(e2e['p99'])}",
                _fmt(figures.get("speedup_vs_static")) + ("x" if "speedup_vs_static" in figures else ""),
                _fmt(figures.get("ideal_speedup")) + ("x" if figures.get("ideal_speedup") else ""),
                _fmt(figures.get("efficiency")),
                _fmt(figures.get("speedup_cpu_vs_static")) + ("x" if "speedup_cpu_vs_static" in figures else ""),
                "-" if match is None else ("yes" if match else f"no ({figures['requests_differing_from_static']})"),
            ]
        )
    lines += [_table(header, rows), "", "step time: steps with prompt tokens, and decode-only steps against history"]
    header = ["mode", "outside steps s", "prompt steps", "ms", "share", "decode steps", "mean ms", "1st quarter"]
    header += ["last quarter", "last/1st", "full batch last/1st", "by longest sequence (tokens: ms @ rows)"]
    rows = []
    for mode, figures in result["modes"].items():
        stats = figures["step_time"]
        prompt = [
            _fmt(stats["outside_steps_s"]),
            str(stats["prefill_steps"]),
            _fmt(stats["prefill_mean_ms"]),
            _fmt(stats["prefill_share"]),
        ]
        if not stats["decode_steps"]:
            rows.append([mode, *prompt, "0", *["-"] * 6])
            continue
        full = stats["full_batch"]
        buckets = ", ".join(f"{b['kv_len']}: {b['mean_ms']:.2f} @ {b['mean_rows']:.1f}" for b in stats["by_kv_len"])
        rows.append(
            [
                mode,
                *prompt,
                str(stats["decode_steps"]),
                _fmt(stats["mean_ms"]),
                _fmt(stats["first_quarter_ms"]),
                _fmt(stats["last_quarter_ms"]),
                _fmt(stats["last_over_first"]),
                f"{_fmt(full['last_over_first'])} ({full['rows']} rows)",
                buckets,
            ]
        )
    lines.append(_table(header, rows))
    return "\n".join(lines)


# --- entry point --------------------------------------------------------------------------------------------------
def load(args: argparse.Namespace, settings: Settings) -> LoadedModel:
    """The model and tokenizer the flags (else the settings) name."""
    updates = {"name_or_path": args.model, "device": args.device, "dtype": args.dtype}
    model_settings = settings.model.model_copy(update={key: value for key, value in updates.items() if value})
    return load_model(model_settings, settings.tokenizer)


def start_peer(args: argparse.Namespace, settings: Settings, plan: Plan) -> HFPeer:
    """transformers' continuous batching on its own model instance (it leaves state on the model it runs)."""
    own = load(args, settings)
    return HFPeer(
        own.model,
        own.tokenizer,
        batch_size=plan.batch_size,
        max_batched_tokens=plan.max_batched_tokens,
        max_len=max(len(ids) + cap for ids, cap in zip(plan.prompt_ids, plan.caps, strict=True)),
        eos_ids=eos_token_ids(own.model, own.tokenizer),
    )


def benchmark(args: argparse.Namespace) -> dict:
    """Parse, load, validate, run and summarise; raises BenchError (or a settings/model error) on bad input."""
    settings = load_settings()
    inputs = check_flags(args)  # bad input is reported before the model is loaded
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads or threads)
    try:
        return _benchmark(args, settings, inputs)
    finally:
        torch.set_num_threads(threads)  # leave the process as it was (tests call main in-process)


def _benchmark(args: argparse.Namespace, settings: Settings, inputs: Inputs) -> dict:
    loaded = load(args, settings)
    plan = make_plan(args, settings, loaded, inputs)
    with contextlib.ExitStack() as stack:
        peer = stack.enter_context(start_peer(args, settings, plan)) if "hf" in plan.modes else None
        runs = run_all(plan, loaded, peer, args.repeat, show=not args.no_progress)
    medians = {mode: median_run(mode_runs) for mode, mode_runs in runs.items()}
    modes = {mode: mode_report(run, plan, runs[mode]) for mode, run in medians.items()}
    compare(modes)
    result = {
        "workload": plan.workload.name,
        "requests": len(plan.caps),
        "arrivals": plan.schedule.description,
        "model": loaded.name,
        "device": str(loaded.device),
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "batch_size": plan.batch_size,
        "policy": plan.policy,
        "max_batched_tokens": plan.max_batched_tokens,
        "ignore_eos": plan.ignore_eos,
        "repeat": args.repeat,
        "machine": machine_info(loaded),
        "modes": modes,
    }
    if args.plot:
        from batching.bench_plot import save_plot

        save_plot({mode: run.record for mode, run in medians.items()}, plan.batch_size, args.plot, plan.workload.name)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    transformers.utils.logging.disable_progress_bar()  # the benchmark's own bar is the one to watch
    try:
        args = build_parser().parse_args(argv)
        result = benchmark(args)
    except (BenchError, SettingsError, ModelLoadError) as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 2
    print(format_report(result))
    if args.json:
        args.json.write_text(json.dumps(_clean(result), indent=1, allow_nan=False), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
