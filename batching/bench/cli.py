"""Benchmark CLI: run one workload through static batching, continuous batching and three peers.

    python -m batching.bench --workload seed-lab --modes static,continuous,hf,llamacpp,vllm --ignore-eos --repeat 3

The peers are transformers' own continuous batching (`hf`), llama.cpp's server (`llamacpp`) and vLLM's server
(`vllm`); the last two are optional installs: the benchmark says so and runs the other modes when one is missing. All
modes share one loaded model (the hf peer gets its own instance, llama.cpp a GGUF copy, vLLM the same folder in its
own environment), run alternately, and the median run of each is reported:
a table on stdout, optionally JSON (`--json`) and a PNG of occupancy and latency charts (`--plot`).
Bad input (workload, flags, a model the engine cannot run exactly) is one line on stderr and exit code 2; a run in
which any request ended with an error prints the first one on stderr and exits with code 1.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import transformers
from tqdm import tqdm

from batching.arrivals import Schedule
from batching.bench.floor import format_floor, measure_floor
from batching.bench.gguf_convert import WEIGHT_FORMATS, GGUFConversionError, check_convertible, convert
from batching.bench.hf_peer import HFPeer
from batching.bench.llamacpp_peer import NOT_INSTALLED, LlamaCppError, LlamaCppPeer, LlamaCppSettings, find_server
from batching.bench.local_server import ServerStartError
from batching.bench.plan import ModeRun, Peer, Plan
from batching.bench.report import compare, format_report, machine_info, mode_report
from batching.bench.shapes import build_shape
from batching.bench.vllm_peer import VllmPeer
from batching.bench.vllm_server import NOT_INSTALLED as VLLM_NOT_INSTALLED
from batching.bench.vllm_server import VllmNotFoundError, VllmSettings, find_python, vllm_server
from batching.bench.workloads import (
    DISTRIBUTIONS,
    RANDOM_NAME,
    LengthRange,
    RefusedRequest,
    Workload,
    encode_requests,
    load_workload,
    random_workload,
)
from batching.engine import cuda_graphs
from batching.engine.batcher import MODES as BATCHER_MODES
from batching.engine.batcher import Batcher, eos_token_ids
from batching.engine.events import FinishedEvent, StepEvent
from batching.engine.geometry import PoolGeometry
from batching.engine.model_support import UnsupportedModelError, check_supported
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams
from batching.engine.request import FinishReason, Request
from batching.engine.scheduler import ADMISSIONS, POLICIES
from batching.engine.threads import pick_threads, torch_threads
from batching.engine.torch_gate import allow_internals, compile_route
from batching.runs import ScheduledRun
from config.settings import Settings, SettingsError, load_settings, setting_warnings
from model.loader import LoadedModel, ModelLoadError, load_model
from model.prompting import format_prompt
from utils.cli import OneLineParser, first_below_one, first_missing_folder
from utils.export import json_safe
from utils.log_setup import configure_logging

MODES = ("static", "continuous", "compiled", "hf", "llamacpp", "vllm")
PEERS = ("hf", "llamacpp", "vllm")
COMPILED = "compiled"  # the continuous batcher with compiled decode steps
WARM_UP_TOKENS = 4


class BenchError(Exception):
    """Bad input: reported as one line on stderr, exit code 2."""


# Reported as one line on stderr with exit code 2 (a peer that fails to start counts: it is the setup, not a run).
BAD_INPUT = (
    BenchError,
    SettingsError,
    ModelLoadError,
    UnsupportedModelError,
    GGUFConversionError,
    LlamaCppError,
    ServerStartError,
)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(error_type=BenchError, prog="python -m batching.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--workload", required=True, help="built-in name, 'random', or a .json/.csv file")
    parser.add_argument("--modes", default="static,continuous", help="comma list of " + ", ".join(MODES))
    parser.add_argument("--floor", action="store_true", help="also time an 8-row decode step against raw matmuls")
    parser.add_argument("--policy", choices=list(POLICIES), help="admission order (default: settings)")
    parser.add_argument(
        "--admission",
        choices=list(ADMISSIONS),
        help="continuous batching's KV blocks: preempt (vLLM) or reserve prompt + cap, never preempt (default: "
        "settings)",
    )
    parser.add_argument("--batch-size", type=int, help="slots (default: the workload's)")
    parser.add_argument("--max-batched-tokens", type=int, help="tokens per step (default: settings)")
    parser.add_argument("--model", help="builtin, a hub id or a local folder (default: settings)")
    parser.add_argument(
        "--model-shape",
        help="a real size with random weights, built here once (e.g. qwen2-0.5b, or qwen2-0.5b:4 for 4 layers)",
    )
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
    parser.add_argument("--kv-cache-tokens", type=int, help="our KV pool, positions (default: all slots' context)")
    parser.add_argument("--kv-cache-mb", type=float, help="KV pool of our modes in MiB (instead of --kv-cache-tokens)")
    parser.add_argument("--block-size", type=int, help="KV positions per block (default: settings)")
    parser.add_argument("--no-prefix-caching", action="store_true", help="continuous batching computes every prompt")
    parser.add_argument("--threads", type=int, help="torch CPU threads, and llama.cpp's (default: torch's)")
    parser.add_argument("--llama-server", help="llama.cpp's llama-server binary (default: on PATH, else xllamacpp)")
    parser.add_argument("--llamacpp-args", default="", help="more llama-server flags, e.g. '-fa on -kvu'")
    parser.add_argument(
        "--llamacpp-weights",
        choices=("auto", *WEIGHT_FORMATS),
        default="auto",
        help="llama.cpp's copy of the layers' linear weights: auto is q4_0 when ours are 4-bit, else f32",
    )
    parser.add_argument("--vllm-python", help="vLLM's environment's Python (default: settings)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--plot", type=Path, help="write occupancy and latency charts here (PNG)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--no-step-detail", action="store_true", help="step events without their rows (the step inspector's data)"
    )
    return parser


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
    positive = ("batch_size", "max_batched_tokens", "max_new_tokens", "threads", "repeat", "kv_cache_tokens")
    problem = first_below_one(args, positive) or first_missing_folder(args)
    if problem:
        raise BenchError(problem)
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
        schedule = workload.schedule(args.rate, args.seed)
    except ValueError as exc:
        raise BenchError(str(exc)) from None
    return Inputs(modes, workload, schedule)


def make_plan(args: argparse.Namespace, settings: Settings, loaded: LoadedModel, inputs: Inputs) -> Plan:
    """Tokenise the workload and check each request against the model's context; raises BenchError."""
    workload = inputs.workload
    default_cap = args.max_new_tokens or settings.generation.max_new_tokens
    try:
        options = BatcherOptions(
            max_batch_size=args.batch_size or workload.batch_size,
            max_batched_tokens=args.max_batched_tokens or settings.batching.max_batched_tokens,
            policy=args.policy or settings.batching.policy,
            admission=args.admission or settings.batching.admission,
            max_prompt_tokens=settings.tokenizer.max_prompt_tokens,
            max_seq_len=settings.batching.max_seq_len,
            step_detail=not args.no_step_detail,
            compile_autotune=settings.engine.compile_autotune,  # for the compiled mode
            compile_prompt_steps=settings.engine.compile_prompt_steps,
            cuda_graphs=settings.engine.cuda_graphs,
            # The pool only as the flags set it (not the settings): without them, every slot's whole context.
            block_size=args.block_size or settings.batching.block_size,
            kv_cache_tokens=args.kv_cache_tokens,
            kv_cache_mb=args.kv_cache_mb,
            prefix_caching=settings.batching.prefix_caching and not args.no_prefix_caching,
        )
        builder = PoolGeometry.of(loaded.model).request_builder(loaded.tokenizer, options)  # under a block raises
    except ValueError as exc:  # batch size, token budget or KV memory out of range
        raise BenchError(str(exc)) from None
    raw = args.raw_prompts or workload.raw_prompts
    requests = [
        (item.prompt if raw else format_prompt(item.prompt, *_template(settings)), item.max_new_tokens or default_cap)
        for item in workload.requests
    ]
    try:
        prompt_ids, caps = encode_requests(builder, requests)
    except RefusedRequest as exc:
        raise BenchError(f"workload {workload.name} {exc}") from None
    return Plan(
        workload=workload,
        modes=inputs.modes,
        prompt_ids=prompt_ids,
        caps=caps,
        schedule=inputs.schedule,
        options=options,
        ignore_eos=args.ignore_eos,
    )


def _template(settings: Settings) -> tuple[str, str]:
    return settings.prompt.system_prompt, settings.prompt.template


# --- running ------------------------------------------------------------------------------------------------------
def run_batcher(mode: str, loaded: LoadedModel, plan: Plan, progress: tqdm | None = None) -> ModeRun:
    """One run of our static or continuous batcher on a fresh batcher (fresh slots, same model)."""
    batcher = _batcher(mode, loaded, plan)

    def build(index: int, arrival: float) -> Request:
        params = RequestParams(plan.caps[index], ignore_eos=plan.ignore_eos)
        return batcher.builder.build(list(plan.prompt_ids[index]), params, request_id=f"q{index}", arrival=arrival)

    scheduled = ScheduledRun(batcher, plan.schedule, build)
    kv_lens = []
    for event in scheduled.events():
        if isinstance(event, StepEvent):
            requests = scheduled.requests
            # Lengths only: `all_ids` would copy every history between the timed steps.
            kv_lens.append(
                max(len(requests[rid].prompt_ids) + len(requests[rid].output_ids) for rid in event.slots if rid)
            )
        elif isinstance(event, FinishedEvent) and progress is not None:
            progress.update(1)
    return ModeRun(scheduled.record, kv_lens)


def _batcher(mode: str, loaded: LoadedModel, plan: Plan) -> Batcher:
    if mode == COMPILED:
        return Batcher(loaded.model, loaded.tokenizer, replace(plan.options, compile_steps=True), mode="continuous")
    return Batcher(loaded.model, loaded.tokenizer, plan.options, mode=mode)


def compile_steps(plan: Plan, loaded: LoadedModel) -> float | None:
    """Make the compiled mode's graphs (decode steps, and steps with prompt chunks unless the settings say no)
    before anything is timed; their seconds are reported on their own."""
    if COMPILED not in plan.modes:
        return None
    runner = _batcher(COMPILED, loaded, plan).runner
    assert runner.compiler is not None, "the compiled mode's batcher compiles its steps"
    total = 0.0
    for compiler in runner.compilers():
        seconds = compiler.compile_now()
        if seconds is None and not compiler.second:  # without a second graph, the main one takes every step
            raise BenchError(f"the compiled mode's {compiler.what} could not be compiled (see the log above)")
        total += seconds or 0.0
    return total


def warm_up(plan: Plan, loaded: LoadedModel, peers: dict[str, Peer], ours: int | None = None) -> None:
    """One short untimed run per mode: first-call allocations and lazy initialisation stay out of the timings."""
    count = min(len(plan.caps), 2)
    short = replace(
        plan,
        prompt_ids=plan.prompt_ids[:count],
        caps=tuple(min(cap, WARM_UP_TOKENS) for cap in plan.caps[:count]),
        schedule=Schedule.at_once(count),
    )
    for mode in plan.modes:
        if mode in (*BATCHER_MODES, COMPILED):
            with our_threads(ours):
                run_batcher(mode, loaded, short)
    for peer in peers.values():
        peer.warm_up(plan.prompt_ids[0], WARM_UP_TOKENS)


def our_threads(threads: int | None) -> contextlib.AbstractContextManager[None]:
    """torch on `threads` threads for our own modes (None: as it is)."""
    return contextlib.nullcontext() if threads is None else torch_threads(threads)


def run_all(
    plan: Plan, loaded: LoadedModel, peers: dict[str, Peer], repeat: int, show: bool, ours: int | None = None
) -> dict[str, list[ModeRun]]:
    """`repeat` rounds of every mode in turn (static, continuous, hf, llamacpp, static, ...); ours on `ours` torch
    threads, the peers on what the process has (None: ours too). Each runs alone: the servers of the others are
    paused meanwhile (idle, vLLM's took most of a core from ours: seed-blog at two threads 907 against 2,235 tok/s)."""
    warm_up(plan, loaded, peers, ours)
    # As the engine process does after its warm-up: the libraries' objects out of the collector's sight, so no
    # full collection (0.18 s here) lands inside a timed run. Undone after (tests call the benchmark in-process).
    gc.freeze()
    try:
        runs: dict[str, list[ModeRun]] = {mode: [] for mode in plan.modes}
        total = repeat * len(plan.modes) * len(plan.caps)
        with tqdm(total=total, unit="req", file=sys.stderr, disable=not show, dynamic_ncols=True) as progress:
            for round_index in range(repeat):
                for mode in plan.modes:
                    progress.set_description(f"{mode} {round_index + 1}/{repeat}")
                    for name, peer in peers.items():  # every contender runs alone: the others' servers paused
                        peer.hold(paused=name != mode)
                    cpu = time.process_time() + (peers[mode].outside_cpu_s() if mode in PEERS else 0.0)
                    if mode in PEERS:
                        record, kv_lens = peers[mode].run(
                            plan.prompt_ids,
                            plan.caps,
                            plan.schedule,
                            plan.ignore_eos,
                            mode=mode,
                            on_finished=lambda _: progress.update(1),
                        )
                        run = ModeRun(record, kv_lens)
                    else:
                        with our_threads(ours):
                            run = run_batcher(mode, loaded, plan, progress)
                    run.cpu_s = time.process_time() + (peers[mode].outside_cpu_s() if mode in PEERS else 0.0) - cpu
                    runs[mode].append(run)
    finally:
        gc.unfreeze()
        for peer in peers.values():
            peer.hold(paused=False)
    return runs


def first_error(runs: dict[str, list[ModeRun]]) -> str | None:
    """The first request that ended with an error, in run order, as one line; None when none did."""
    for mode, mode_runs in runs.items():
        for index, run in enumerate(mode_runs):
            for event in run.record.finished:
                if event.reason is FinishReason.ERROR:
                    return f"{mode} run {index + 1}: request {event.request_id} failed: {event.error}"
    return None


def median_run(runs: Sequence[ModeRun]) -> ModeRun:
    """The run with the median wall time (the lower middle one for an even count)."""
    ordered = sorted(runs, key=lambda run: run.record.wall_s)
    return ordered[(len(ordered) - 1) // 2]


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
        batch_size=plan.options.max_batch_size,
        max_batched_tokens=plan.options.max_batched_tokens,
        max_len=max(len(ids) + cap for ids, cap in zip(plan.prompt_ids, plan.caps, strict=True)),
        eos_ids=eos_token_ids(own.model, own.tokenizer),
    )


def llamacpp_weights(choice: str, loaded: LoadedModel) -> str:
    """The GGUF format of llama.cpp's copy: as chosen, or (auto) Q4_0 beside our 4-bit weights, else F32."""
    if choice != "auto":
        return choice
    return "q4_0" if loaded.weights.precision.startswith("4-bit") else "f32"


def start_llamacpp(
    loaded: LoadedModel, plan: Plan, command: list[str], extra: Sequence[str], log_dir: Path, weights: str = "f32"
) -> LlamaCppPeer:
    """llama.cpp's server on a GGUF copy of the model (converted once, then cached), sized like our batcher."""
    settings = LlamaCppSettings(
        model=convert(loaded.model, loaded.tokenizer, weights=weights),
        slots=plan.options.max_batch_size,
        context_per_slot=max(len(ids) + cap for ids, cap in zip(plan.prompt_ids, plan.caps, strict=True)),
        threads=torch.get_num_threads(),
        batch_tokens=plan.options.max_batched_tokens,
        extra=tuple(extra),
    )
    return LlamaCppPeer(command, settings, loaded.tokenizer, log_dir)


def llamacpp_command(args: argparse.Namespace, inputs: Inputs) -> tuple[Inputs, list[str] | None]:
    """The command that starts llama.cpp's server; when it is not installed, say so and drop the mode."""
    if "llamacpp" not in inputs.modes:
        return inputs, None
    try:
        command = find_server(args.llama_server)
    except LlamaCppError as exc:
        raise BenchError(str(exc)) from None
    if command is not None:
        try:
            import gguf  # noqa: F401  (the converter's package, part of the same optional install)
        except ImportError:
            command = None
    if command is not None:
        return inputs, command
    return _without(inputs, "llamacpp", NOT_INSTALLED, "llama.cpp"), None


def vllm_python(args: argparse.Namespace, settings: Settings, inputs: Inputs) -> tuple[Inputs, Path | None]:
    """The Python of vLLM's environment (flag, else setting, else the default install); when vLLM is not
    installed, say so and drop the mode."""
    if "vllm" not in inputs.modes:
        return inputs, None
    try:
        python = find_python(args.vllm_python or settings.peers.vllm_python)
    except VllmNotFoundError as exc:
        raise BenchError(str(exc)) from None
    if python is not None:
        return inputs, python
    return _without(inputs, "vllm", VLLM_NOT_INSTALLED, "vLLM"), None


def _without(inputs: Inputs, mode: str, message: str, name: str) -> Inputs:
    """The inputs less a peer that is not installed, after saying so on stderr."""
    print(message, file=sys.stderr)
    modes = tuple(other for other in inputs.modes if other != mode)
    if not modes:
        raise BenchError(f"--modes has no mode left to run without {name}")
    return replace(inputs, modes=modes)


def vllm_settings(loaded: LoadedModel, plan: Plan) -> VllmSettings:
    """vLLM's server on the model's own folder, sized like our batcher: slots, token budget, threads, dtype;
    BenchError for a model it cannot be given here (checked before anything runs)."""
    folder = Path(loaded.model.name_or_path or ".")
    if not (folder / "config.json").is_file():
        raise BenchError(f"vllm: the model must be a local folder (vLLM runs offline here), not {loaded.name!r}")
    if loaded.device.type != "cpu":
        raise BenchError(f"vllm: this is vLLM's CPU build; run the benchmark with --device cpu, not {loaded.device}")
    return VllmSettings(
        model=str(folder),
        served_name=loaded.name,
        slots=plan.options.max_batch_size,
        batch_tokens=plan.options.max_batched_tokens,
        max_model_len=max(len(ids) + cap for ids, cap in zip(plan.prompt_ids, plan.caps, strict=True)),
        threads=torch.get_num_threads(),
        # vLLM's GPTQ kernels on a CPU take bfloat16 activations only (float32 is refused at start).
        dtype="bfloat16" if loaded.weights.quantized else str(loaded.dtype).removeprefix("torch."),
    )


def benchmark(args: argparse.Namespace) -> dict:
    """Parse, load, validate, run and summarise; raises BenchError (or a settings/model error) on bad input."""
    for line in setting_warnings():
        print(f"bench: warning: {line}", file=sys.stderr)
    settings = load_settings()
    allow_internals(settings.engine.torch_internals)
    inputs, llamacpp = llamacpp_command(args, check_flags(args))  # bad input is reported before the model is loaded
    if args.model_shape:
        if args.model:
            raise BenchError("--model and --model-shape are not allowed together: give one")
        try:
            args.model = str(build_shape(args.model_shape))
        except ValueError as exc:
            raise BenchError(f"--model-shape {exc}") from None
    inputs, vllm = vllm_python(args, settings, inputs)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads or threads)
    try:
        return _benchmark(args, settings, inputs, llamacpp, vllm)
    finally:
        torch.set_num_threads(threads)  # leave the process as it was (tests call main in-process)


def _benchmark(
    args: argparse.Namespace,
    settings: Settings,
    inputs: Inputs,
    llamacpp: list[str] | None,
    vllm: Path | None,
    loaded: LoadedModel | None = None,
) -> dict:
    """The benchmark on `loaded` (else the model the flags name, loaded now): a run of several workloads on one
    model compiles its graphs once (`gpu_check`)."""
    loaded = loaded or load(args, settings)
    check_supported(loaded.model)  # a model the engine cannot run exactly is refused before any request
    if llamacpp is not None:
        try:
            check_convertible(loaded.model)
        except GGUFConversionError as exc:
            raise BenchError(f"llamacpp: {exc}") from None
    plan = make_plan(args, settings, loaded, inputs)
    vllm_setup = (vllm, vllm_settings(loaded, plan)) if vllm is not None else None
    # `--threads` is the most any contender may use: the peers get them all, ours what the probe chooses of them,
    # timed here (as the engine process times them at its start), before any graph is made; with the compiled mode
    # among ours, chosen as for compiled steps (one count for the whole process).
    ours = any(mode not in PEERS for mode in plan.modes)
    most, compiled = torch.get_num_threads(), "compiled" in plan.modes
    threads = pick_threads(loaded.model, loaded.tokenizer, most, compiled) if ours else None
    ours_threads = None if threads is None else threads.threads
    with our_threads(ours_threads):
        compile_s = compile_steps(plan, loaded)
    with contextlib.ExitStack() as stack:
        peers = _start_peers(stack, args, settings, (plan, loaded), llamacpp, vllm_setup)
        runs = run_all(plan, loaded, peers, args.repeat, show=not args.no_progress, ours=ours_threads)
    floor = measure_floor(loaded.model, autotune=settings.engine.compile_autotune) if args.floor else None
    medians = {mode: median_run(mode_runs) for mode, mode_runs in runs.items()}
    modes = {mode: mode_report(run, plan, runs[mode]) for mode, run in medians.items()}
    compare(modes)
    result = {
        **_setup(plan, loaded),
        "repeat": args.repeat,
        "machine": machine_info(loaded),
        "modes": modes,
        "first_error": first_error(runs),
        "compile_s": compile_s,
        "compile_route": compile_route()[0].line if compile_s is not None else None,
        "cuda_graphs": dict(cuda_graphs.STATS) if loaded.device.type == "cuda" else None,
        "floor": floor,
        "threads": None if threads is None else {"ours": ours_threads, "most": threads.most, "probe": threads.line()},
    }
    if args.plot:
        from batching.bench.plot import save_plot

        save_plot(
            {mode: run.record for mode, run in medians.items()},
            plan.options.max_batch_size,
            args.plot,
            plan.workload.name,
        )
    return result


def _start_peers(
    stack: contextlib.ExitStack,
    args: argparse.Namespace,
    settings: Settings,
    planned: tuple[Plan, LoadedModel],
    llamacpp: list[str] | None,
    vllm: tuple[Path, VllmSettings] | None,
) -> dict[str, Peer]:
    """Every peer the plan runs, started on `stack` (stopped when it closes)."""
    plan, loaded = planned
    peers: dict[str, Peer] = {}
    if "hf" in plan.modes:
        peers["hf"] = stack.enter_context(start_peer(args, settings, plan))
    if llamacpp is not None:
        log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-llamacpp-")))
        extra = shlex.split(args.llamacpp_args)
        weights = llamacpp_weights(args.llamacpp_weights, loaded)
        peers["llamacpp"] = stack.enter_context(start_llamacpp(loaded, plan, llamacpp, extra, log_dir, weights))
    if vllm is not None:
        python, setup = vllm
        log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-vllm-")))
        server = stack.enter_context(vllm_server(python, setup, log_dir / "vllm-server.log"))
        peers["vllm"] = VllmPeer(server.url, loaded.name, plan.options.max_batch_size, server)
    return peers


def _setup(plan: Plan, loaded: LoadedModel) -> dict:
    """What was run, on what: the head of the result's JSON."""
    options = plan.options
    return {
        "workload": plan.workload.name,
        "requests": len(plan.caps),
        "arrivals": plan.schedule.description,
        "model": loaded.name,
        "device": str(loaded.device),
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "batch_size": options.max_batch_size,
        "policy": options.policy,
        "admission": options.admission,
        "max_batched_tokens": options.max_batched_tokens,
        "kv": {
            "block_size": options.block_size,
            "kv_cache_tokens": options.kv_cache_tokens,
            "kv_cache_mb": options.kv_cache_mb,
            "prefix_caching": options.prefix_caching,
        },
        "ignore_eos": plan.ignore_eos,
    }


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging(logging.WARNING)  # the engine's warnings (a failed request) on stderr; the table on stdout
    transformers.utils.logging.disable_progress_bar()  # the benchmark's own bar is the one to watch
    try:
        args = build_parser().parse_args(argv)
        result = benchmark(args)
    except BAD_INPUT as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 2
    print(format_report(result))
    if result["compile_s"] is not None:
        print(f"compile: the compiled mode's graphs took {result['compile_s']:.1f} s, outside the run times")
        print(f"compile: {result['compile_route']}")
    if result["cuda_graphs"] is not None:
        graphs = result["cuda_graphs"]
        print(
            f"cuda graphs: {graphs.get('captured', 0)} captured, {graphs.get('replayed', 0)} decode steps replayed, "
            f"{graphs.get('failed', 0)} failed (every mode and the floor together)"
        )
    if result["floor"] is not None:
        print(format_floor(result["floor"]))
    if result["threads"] is not None:
        print(f"threads: ours {result['threads']['probe']}; every peer {result['threads']['most']}")
    if args.json:
        args.json.write_text(json.dumps(json_safe(result), indent=1, allow_nan=False), encoding="utf-8")
    if result["first_error"]:  # figures of failed requests measure nothing: say so, and fail the command
        print(f"bench: error: {result['first_error']}", file=sys.stderr)
        return 1
    return 0
