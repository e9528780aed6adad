"""The race: one workload through static batching, continuous batching and three peers.

    python -m batching.bench race --workload seed-lab --modes static,continuous,hf,llamacpp,vllm --ignore-eos --repeat 3

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
import sys
import time
from collections.abc import Sequence
from dataclasses import replace

import torch
from tqdm import tqdm

from batching.arrivals import Schedule
from batching.bench import options
from batching.bench.floor import format_floor, measure_floor
from batching.bench.options import BadInput, RunFailed, load
from batching.bench.peers.contenders import (
    PeerServers,
    check_llamacpp,
    find_llamacpp,
    find_vllm,
    start_peers,
    vllm_settings,
)
from batching.bench.peers.gguf_convert import WEIGHT_FORMATS
from batching.bench.plan import Inputs, ModeRun, Peer, Plan
from batching.bench.report import compare, format_report, machine_info, mode_report
from batching.bench.shapes import build_shape
from batching.bench.workloads import (
    DISTRIBUTIONS,
    RANDOM_NAME,
    LengthRange,
    RefusedRequest,
    encode_requests,
    load_workload,
    random_workload,
)
from batching.command_line import OneLineParser, first_below_one, first_missing_folder
from batching.engine import cuda_graphs
from batching.engine.batcher import MODES as BATCHER_MODES
from batching.engine.batcher import Batcher
from batching.engine.events import FinishedEvent, StepEvent
from batching.engine.geometry import PoolGeometry
from batching.engine.model_support import check_supported
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams
from batching.engine.request import FinishReason, Request
from batching.engine.scheduler import ADMISSIONS
from batching.engine.threads import pick_threads, torch_threads
from batching.engine.torch_gate import allow_internals, compile_route
from batching.runs import ScheduledRun
from config.settings import Settings, load_settings, setting_warnings
from model.loader import LoadedModel
from model.prompting import format_prompt
from utils.export import json_safe

MODES = ("static", "continuous", "compiled", "hf", "llamacpp", "vllm")
PEERS = ("hf", "llamacpp", "vllm")
COMPILED = "compiled"  # the continuous batcher with compiled decode steps
WARM_UP_TOKENS = 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The race's flags."""
    options.add(parser, "--workload", required=True, said="none: give one")
    parser.add_argument("--modes", default="static,continuous", help="comma list of " + ", ".join(MODES))
    parser.add_argument("--floor", action="store_true", help="also time an 8-row decode step against raw matmuls")
    options.add_all(parser, "--policy")
    parser.add_argument(
        "--admission",
        choices=list(ADMISSIONS),
        help="continuous batching's KV blocks: preempt (vLLM) or reserve prompt + cap, never preempt (default: "
        "settings)",
    )
    options.add(parser, "--batch-size", said="the workload's")
    options.add_all(parser, "--max-batched-tokens", "--model", "--model-shape", "--device", "--dtype", "--ignore-eos")
    options.add_all(parser, "--max-new-tokens")
    parser.add_argument("--raw-prompts", action="store_true", help="send prompts as they are, without the Q/A template")
    options.add(parser, "--repeat", 1)
    parser.add_argument("--rate", type=float, help="Poisson arrivals at this many requests/s (seeded)")
    options.add(parser, "--seed", 0)
    parser.add_argument("--random-requests", type=int, default=32, help="random workload: number of requests")
    parser.add_argument("--random-prompt-words", default="4:40", help="random workload: prompt words LOW:HIGH")
    parser.add_argument("--random-max-new-tokens", default="8:256", help="random workload: caps LOW:HIGH")
    parser.add_argument("--random-dist", choices=DISTRIBUTIONS, default="exponential", help="random workload: caps")
    parser.add_argument("--kv-cache-tokens", type=int, help="our KV pool, positions (default: all slots' context)")
    parser.add_argument("--kv-cache-mb", type=float, help="KV pool of our modes in MiB (instead of --kv-cache-tokens)")
    parser.add_argument("--block-size", type=int, help="KV positions per block (default: settings)")
    parser.add_argument("--no-prefix-caching", action="store_true", help="continuous batching computes every prompt")
    options.add(parser, "--threads", said="torch's; llama.cpp's too")
    parser.add_argument("--llama-server", help="llama.cpp's llama-server binary (default: on PATH, else xllamacpp)")
    parser.add_argument("--llamacpp-args", default="", help="more llama-server flags, e.g. '-fa on -kvu'")
    parser.add_argument(
        "--llamacpp-weights",
        choices=("auto", *WEIGHT_FORMATS),
        default="auto",
        help="llama.cpp's copy of the layers' linear weights: auto is q4_0 when ours are 4-bit, else f32",
    )
    options.add_all(parser, "--vllm-python")
    parser.add_argument(
        "--vllm-url", help="race a vLLM server already running instead (on the same model): not started, nor paused"
    )
    options.add_all(parser, "--json", "--plot", "--no-progress")
    parser.add_argument(
        "--no-step-detail", action="store_true", help="step events without their rows (the step inspector's data)"
    )


def race_args(flags: Sequence[str]) -> argparse.Namespace:
    """The race's flags parsed as `python -m batching.bench race FLAGS` parses them (for the subcommands that run
    races of their own: memory, race-check, gpu-check)."""
    parser = OneLineParser(error_type=BadInput, prog="python -m batching.bench race")
    add_arguments(parser)
    return parser.parse_args(flags)


# --- inputs -------------------------------------------------------------------------------------------------------
def parse_modes(text: str) -> tuple[str, ...]:
    modes = tuple(mode.strip() for mode in text.split(",") if mode.strip())
    bad = [mode for mode in modes if mode not in MODES]
    if bad or not modes or len(set(modes)) != len(modes):
        raise BadInput(f"--modes {text!r} is not allowed: a comma list of distinct modes from {', '.join(MODES)}")
    return modes


def check_flags(args: argparse.Namespace) -> Inputs:
    """Everything that can be checked before loading the model: numbers, modes, workload, arrivals."""
    positive = ("batch_size", "max_batched_tokens", "max_new_tokens", "threads", "repeat", "kv_cache_tokens")
    problem = first_below_one(args, positive) or first_missing_folder(args)
    if problem:
        raise BadInput(problem)
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
        raise BadInput(str(exc)) from None
    return Inputs(modes, workload, schedule)


def make_plan(args: argparse.Namespace, settings: Settings, loaded: LoadedModel, inputs: Inputs) -> Plan:
    """Tokenise the workload and check each request against the model's context; raises BadInput."""
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
        raise BadInput(str(exc)) from None
    raw = args.raw_prompts or workload.raw_prompts
    requests = [
        (item.prompt if raw else format_prompt(item.prompt, *_template(settings)), item.max_new_tokens or default_cap)
        for item in workload.requests
    ]
    try:
        prompt_ids, caps = encode_requests(builder, requests)
    except RefusedRequest as exc:
        raise BadInput(f"workload {workload.name} {exc}") from None
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
            raise BadInput(f"the compiled mode's {compiler.what} could not be compiled (see the log above)")
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
def benchmark(args: argparse.Namespace) -> dict:
    """Check, load, validate, run and summarise; raises BadInput (or a settings/model error) on bad input."""
    for line in setting_warnings():
        print(f"bench race: warning: {line}", file=sys.stderr)
    settings = load_settings()
    allow_internals(settings.engine.torch_internals)
    inputs, found = find_llamacpp(args, check_flags(args))  # bad input is reported before the model is loaded
    if args.model_shape:
        if args.model:
            raise BadInput("--model and --model-shape are not allowed together: give one")
        try:
            args.model = str(build_shape(args.model_shape))
        except ValueError as exc:
            raise BadInput(f"--model-shape {exc}") from None
    inputs, found = find_vllm(args, settings, inputs, found)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads or threads)
    try:
        return race(args, settings, inputs, found)
    finally:
        torch.set_num_threads(threads)  # leave the process as it was (tests call the CLI in-process)


def race(
    args: argparse.Namespace,
    settings: Settings,
    inputs: Inputs,
    found: PeerServers,
    loaded: LoadedModel | None = None,
) -> dict:
    """The race on `loaded` (else the model the flags name, loaded now), with the peers `found`: a run of several
    workloads on one model compiles its graphs once (`gpu_check`)."""
    loaded = loaded or load(args, settings)
    check_supported(loaded.model)  # a model the engine cannot run exactly is refused before any request
    check_llamacpp(found, loaded)
    plan = make_plan(args, settings, loaded, inputs)
    vllm = vllm_settings(loaded, plan) if found.vllm_python is not None else None
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
        peers = start_peers(stack, args, settings, (plan, loaded), found, vllm)
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


def run(args: argparse.Namespace) -> int:
    """`python -m batching.bench race`: the race, its table (and JSON); RunFailed when a request failed."""
    result = benchmark(args)
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
        raise RunFailed(result["first_error"])
    return 0
