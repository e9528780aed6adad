"""The load sweep from the command line: the page's sweep in this process, or a sweep against real servers.

    python -m batching.bench sweep --workload seed-lab --rates 2,4,8,16,32 --requests 32 --json sweep.json
    python -m batching.bench sweep --servers batchscope,vllm --rates 2,4,8,16 --plot sweep.png
    python -m batching.bench sweep --url ours=http://127.0.0.1:8001 --url vllm=http://127.0.0.1:8002 --plot s.png
    python -m batching.bench sweep --router http://127.0.0.1:8000 --replica http://127.0.0.1:8001 --replica ...

In-process (the default), each rate is a race of the workload's requests on a continuous and a static batcher
(`batching.sweep.run_rate`), on the same seeded Poisson arrivals and on the lanes' own clocks, with the batcher the
page's sweep gets from the same settings (slots, token budget, KV memory, prefix caching, the system prompt and
template): for the same workload, rates, requests and seed it measures what the page's "Load sweep" view measures.
With `--servers`, each server (ours, `python -m batching.serve`; vLLM's CPU build; transformers serve) is started
on the model folder and the same token ids arrive at each rate on the wall clock, streamed from `/v1/completions`
and timed as `vllm bench serve` times them (`batching.bench.sweep_client`). With `--url` (servers already running)
and `--router` (a fleet: requests through the router, each `--replica`'s metrics read, or the router's own list of
workers), each is driven alone on the same arrivals and prompts after a warm-up, its rates picked by a probe of its
capacity with `auto`, and what each server's `/metrics` said at each rate is printed beside the client's figures
(`batching.bench.sweep_remote`).

Prints one line per series and rate, each series' goodput (the highest rate at which 90% of requests met the
target) and the curves' knees, then the headline; `--json` writes every figure, `--plot` the
charts (PNG through vl-convert). Bad input is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from tqdm import tqdm

from batching.arrivals import Schedule
from batching.bench import options
from batching.bench.options import BadInput
from batching.bench.peers import serve_peer
from batching.bench.report import host_info, machine_info
from batching.bench.sweep_client import greedy_request, run_remote_rate
from batching.bench.sweep_remote import RemoteSweep, Target, check_names, fleet_target, server_target
from batching.bench.workloads import (
    RANDOM_NAME,
    RefusedRequest,
    Workload,
    encode_requests,
    load_workload,
    random_workload,
)
from batching.command_line import first_below_one, first_missing_folder, text_table
from batching.engine.batcher import MODES, Batcher, BatcherOptions
from batching.engine.events import FinishedEvent
from batching.engine.geometry import PoolGeometry
from batching.engine.model_support import check_supported
from batching.engine.params import RequestParams
from batching.engine.request import Request
from batching.race import LaneStep
from batching.remote import WARM_UP_QUESTION, Endpoint, RemoteError, endpoint_from_settings
from batching.remote.endpoint import local_endpoint
from batching.runs import CPU, WALL, LaneClock, StepClock
from batching.service import engine_options
from batching.sweep import AUTO, DEFAULT_REQUESTS, SweepSpec, auto_rates, capacity, format_rates, parse_rates, run_rate
from config.settings import load_settings
from model.loader import LoadedModel, load_model
from model.prompting import format_prompt
from utils.charts.sweep import KNEE_COLUMNS, sweep_chart
from utils.export import json_safe
from utils.metrics.run import steps_kind
from utils.metrics.sweep import (
    Goodput,
    Slo,
    SweepPoint,
    goodput_ratio,
    goodputs,
    headline,
    knees,
    points_frame,
    record_point,
    servers_headline,
    sweep_point,
)
from utils.metrics.sweep_servers import (
    CLIENT,
    METRICS,
    NOT_REPORTED,
    SERVER_FIGURES,
    ServerPoint,
    server_frame,
    shown,
    spread_lines,
)

DEFAULT_WORKLOAD = "seed-lab"
DEFAULT_TTFT_MS = 200.0
DEFAULT_TPOT_MS = 100.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The sweep's flags."""
    options.add(parser, "--workload", DEFAULT_WORKLOAD)
    parser.add_argument(
        "--rates", default=AUTO, help="requests/s, comma-separated, or auto (picked by a race of every request at once)"
    )
    options.add(parser, "--requests", DEFAULT_REQUESTS, said=f"{DEFAULT_REQUESTS}, the mix cycled")
    options.add(parser, "--seed", 0)
    parser.add_argument("--slo-ttft", type=float, default=DEFAULT_TTFT_MS, help="TTFT target, ms (default 200)")
    parser.add_argument("--slo-tpot", type=float, default=DEFAULT_TPOT_MS, help="TPOT target, ms (default 100)")
    options.add_all(parser, "--batch-size", "--policy", "--max-new-tokens", "--ignore-eos", "--model")
    options.add(parser, "--threads", 1, said="1, as the page's engine")
    parser.add_argument("--eager", action="store_true", help="in-process: eager steps even if the settings compile")
    parser.add_argument("--wall-clock", action="store_true", help="in-process: lanes count wall time, not CPU time")
    parser.add_argument("--servers", help="sweep these servers instead: " + ", ".join(serve_peer.SERVERS))
    options.add_all(parser, "--vllm-python")
    parser.add_argument("--url", action="append", default=[], help="a running server, NAME=URL (repeat for more)")
    parser.add_argument("--router", help="a fleet's router, [NAME=]URL: requests go through it")
    parser.add_argument(
        "--replica", action="append", default=[], help="a replica behind --router (repeat); default: its own list"
    )
    parser.add_argument("--api-key", help="sent to running servers as a bearer key (default: settings' remote key)")
    parser.add_argument("--served-model", help="the model name to send them (default: the first they list)")
    options.add_all(parser, "--json", "--plot", "--no-progress")


@dataclass(frozen=True)
class Mix:
    """The sweep's requests, tokenised once: prompt token ids and caps, in the order they arrive."""

    workload: str
    prompt_ids: tuple[tuple[int, ...], ...]
    caps: tuple[int, ...]
    ignore_eos: bool = False


def check_args(args: argparse.Namespace) -> tuple[SweepSpec, Slo, Workload]:
    """Everything checked before a model loads or a server starts."""
    problem = first_below_one(args, ("batch_size", "max_new_tokens", "threads")) or first_missing_folder(args)
    if problem:
        raise BadInput(problem)
    running = bool(args.url or args.router)
    if running and args.servers:
        raise BadInput("--servers starts servers, --url and --router sweep running ones: give one or the other")
    if args.replica and not args.router:
        raise BadInput("--replica names a replica behind a router: give the router too (--router URL)")
    try:
        spec = SweepSpec(parse_rates(args.rates), args.requests, args.seed)
        if spec.auto and args.servers:
            raise ValueError("--rates auto picks rates for the in-process sweep: give the servers' rates, e.g. 2,4,8")
        slo = Slo(args.slo_ttft / 1000, args.slo_tpot / 1000)
        workload = random_workload(seed=args.seed) if args.workload == RANDOM_NAME else load_workload(args.workload)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    return spec, slo, workload


def batcher_options(args: argparse.Namespace) -> BatcherOptions:
    """The page's sweep batcher from the same settings (its shared choices: slots, policy, KV memory), without the
    step detail a sweep does not read."""
    settings = load_settings()
    try:
        options = engine_options(settings, args.batch_size, args.policy)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    return replace(options, step_detail=False, compile_steps=options.compile_steps and not args.eager)


def tokenised_mix(
    loaded: LoadedModel, options: BatcherOptions, spec: SweepSpec, workload: Workload, args: argparse.Namespace
) -> Mix:
    """The workload's prompts in the settings' template, each checked as the engine checks it, cycled to
    `spec.requests`."""
    settings = load_settings()
    builder = PoolGeometry.of(loaded.model).request_builder(loaded.tokenizer, options)
    default_cap = args.max_new_tokens or settings.generation.max_new_tokens
    template = (settings.prompt.system_prompt, settings.prompt.template)
    mix = [
        (format_prompt(item.prompt, *template), item.max_new_tokens or default_cap)
        for item in spec.mix(workload.requests)
    ]
    try:
        ids, caps = encode_requests(builder, mix)
    except RefusedRequest as exc:
        index = exc.index % len(workload.requests)
        raise BadInput(f"workload {workload.name} request {index}: {exc.reason}") from None
    return Mix(workload.name, ids, caps, args.ignore_eos)


# --- in-process: the page's sweep ----------------------------------------------------------------------------------
def compile_graphs(loaded: LoadedModel, options: BatcherOptions) -> float | None:
    """Make both lanes' graphs before anything is timed (the page's engine makes them while it is idle)."""
    if not options.compile_steps:
        return None
    total = 0.0
    for mode in MODES:
        runner = Batcher(loaded.model, loaded.tokenizer, options, mode=mode).runner
        for compiler in runner.compilers():
            seconds = compiler.compile_now()
            if seconds is None and not compiler.second:  # without a second graph, the main one takes every step
                raise BadInput(f"{compiler.what} could not be compiled (see the log above)")
            total += seconds or 0.0
    return total


@dataclass
class InProcess:
    """What the in-process sweep ran: its points, the rates (picked by the calibration race with `auto`, and what
    each schedule served in it), and how each lane's steps ran."""

    points: list[SweepPoint]
    rates: tuple[float, ...]
    capacities: dict[str, float]
    steps: dict[str, str]
    clock: str = "wall"


def sweep_in_process(
    loaded: LoadedModel,
    options: BatcherOptions,
    mix: Mix,
    spec: SweepSpec,
    slo: Slo,
    clock: LaneClock,
    on_finished: Callable[[], object] = lambda: None,
) -> InProcess:
    """`auto`'s calibration race first, then every rate as a race of both schedules, on lane clocks that count
    `clock` during their steps."""
    builder = PoolGeometry.of(loaded.model).request_builder(loaded.tokenizer, options)
    params = [RequestParams(cap, ignore_eos=mix.ignore_eos) for cap in mix.caps]
    requests: list[Request] = [
        builder.build(list(ids), params[index], request_id=f"q{index}") for index, ids in enumerate(mix.prompt_ids)
    ]

    def make(mode: str, clock: StepClock) -> Batcher:
        return Batcher(loaded.model, loaded.tokenizer, options, mode=mode, clock=clock)

    def counted(step: LaneStep) -> None:
        for event in step.events:
            if isinstance(event, FinishedEvent):
                on_finished()

    capacities: dict[str, float] = {}
    if spec.auto:
        records = run_rate(make, requests, Schedule.at_once(len(requests)), counted, clock)
        capacities = {mode: capacity(record) for mode, record in records.items()}
        try:
            spec = replace(spec, rates=auto_rates(capacities["static"], capacities["continuous"]))
        except ValueError as exc:
            raise BadInput(str(exc)) from None
    done = InProcess([], spec.rates, capacities, {}, clock.name)
    for rate in spec.rates:
        for mode, record in run_rate(make, requests, spec.schedule(rate), counted, clock).items():
            done.points.append(record_point(mode, rate, record, slo, spec.requests))
            done.steps[f"{mode} at {rate:g}/s"] = steps_kind(record)
    return done


def lane_clock(loaded: LoadedModel, wall: bool) -> LaneClock:
    """CPU time where it is all of a step's work (a CPU model on one torch thread), as the page's engine counts."""
    return CPU if not wall and loaded.device.type == "cpu" and torch.get_num_threads() == 1 else WALL


# --- against servers -----------------------------------------------------------------------------------------------
def sweep_servers(
    args: argparse.Namespace, mix: Mix, spec: SweepSpec, slo: Slo, on_finished: Callable[[], object]
) -> tuple[list[SweepPoint], list[str]]:
    """Each server started on the model folder in turn, the same token ids sent at every rate on the wall clock."""
    names, vllm_python = serve_peer.available_servers(serve_peer.parse_servers(args.servers), args.vllm_python)
    model = args.model or "model/builtin"
    if not (serve_peer.ROOT / model / "config.json").is_file():
        raise BadInput(f"--model {model!r} is not a model folder (the servers load a local folder)")
    longest_prompt = max(len(ids) for ids in mix.prompt_ids)
    load = serve_peer.Load(
        rates=spec.rates,
        requests=spec.requests,
        prompt_tokens=longest_prompt,
        prompt_tokens_min=min(len(ids) for ids in mix.prompt_ids),
        prompt_tokens_max=longest_prompt,
        output_tokens=max(mix.caps),
        throughput=False,
    )
    slots = args.batch_size or load_settings().batching.max_batch_size
    budget = load_settings().batching.max_batched_tokens
    points: list[SweepPoint] = []
    with tempfile.TemporaryDirectory(prefix="sweep-servers-") as tmp:
        workdir = Path(tmp)
        (workdir / "hf-cache").mkdir()
        specs = serve_peer.server_specs(model, slots, budget, load, workdir / "hf-cache", vllm_python)
        for name in names:
            server = server_spec(specs[name], slots, load)
            print(f"sweep: {name} ...", file=sys.stderr, flush=True)
            with serve_peer.running_server(server, model, workdir) as url:
                requests = [
                    greedy_request(ids, cap, mix.ignore_eos) for ids, cap in zip(mix.prompt_ids, mix.caps, strict=True)
                ]
                for rate in spec.rates:
                    timings, duration = run_remote_rate(
                        local_endpoint(url), model, requests, spec.schedule(rate), on_finished
                    )
                    points.append(sweep_point(name, rate, timings, duration, slo, spec.requests))
    return points, list(names)


def server_spec(spec: serve_peer.ServerSpec, slots: int, load: serve_peer.Load) -> serve_peer.ServerSpec:
    """Ours with KV memory for every slot's longest request (vLLM gets a whole GiB), prefix caching off as vLLM's
    is (every rate sends the same prompts), and eager steps: its background compile runs while it is idle, so it
    would switch mid-sweep (vLLM compiles before it listens)."""
    if spec.name != "batchscope":
        return spec
    env = {
        **spec.env,
        "BATCHSCOPE_BATCHING__KV_CACHE_TOKENS": str(slots * (load.prompt_tokens_max + load.output_tokens)),
        "BATCHSCOPE_BATCHING__PREFIX_CACHING": "false",
        "BATCHSCOPE_BATCHING__MAX_SEQ_LEN": str(max(2048, load.prompt_tokens_max + load.output_tokens)),
        "BATCHSCOPE_ENGINE__COMPILE_STEPS": "false",
    }
    return replace(spec, env=env)


# --- against running servers and fleets ---------------------------------------------------------------------------
def running_targets(args: argparse.Namespace) -> list[Target]:
    """Each `--url` server, then the `--router` fleet, with the key and timeouts of the remote settings."""
    settings = load_settings().remote
    key = args.api_key or settings.api_key

    def endpoint_of(url: str) -> Endpoint:
        return endpoint_from_settings(settings, url, key)

    try:
        targets = [server_target(text, endpoint_of, args.served_model) for text in args.url]
        if args.router:
            targets.append(fleet_target(args.router, args.replica, endpoint_of, args.served_model))
        check_names(targets)
    except (RemoteError, ValueError) as exc:
        raise BadInput(str(exc)) from None
    return targets


def running_prompts(spec: SweepSpec, workload: Workload, args: argparse.Namespace) -> list[tuple[str, int]]:
    """The mix as text in the settings' template, cycled to the requests per rate, each with its cap."""
    settings = load_settings()
    default_cap = args.max_new_tokens or settings.generation.max_new_tokens
    template = (settings.prompt.system_prompt, settings.prompt.template)
    return [
        (format_prompt(item.prompt, *template), item.max_new_tokens or default_cap)
        for item in spec.mix(workload.requests)
    ]


def sweep_running(args: argparse.Namespace, spec: SweepSpec, slo: Slo, workload: Workload) -> dict:
    """The sweep of running servers (and a fleet): warm-ups, the probe with `auto`, every rate on each in turn."""
    targets = running_targets(args)
    settings = load_settings()
    warm_prompt = format_prompt(WARM_UP_QUESTION, settings.prompt.system_prompt, settings.prompt.template)
    sweep = RemoteSweep(
        targets,
        running_prompts(spec, workload, args),
        spec,
        slo,
        args.ignore_eos,
        warm_prompt,
        settings.remote.telemetry_interval_s,
    )
    with tqdm(total=sweep.total_requests(), unit="req", file=sys.stderr, disable=args.no_progress) as bar:
        sweep.run(lambda: bar.update(1))
    if sweep.error is not None:
        raise BadInput(sweep.error)
    series = [target.name for target in targets]
    result = {
        "workload": workload.name,
        "requests_per_rate": spec.requests,
        "rates_asked": args.rates,
        "rates": list(sweep.spec.rates),
        "capacities": sweep.capacities,
        "seed": spec.seed,
        "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "attainment_goal": 0.9},
        "ignore_eos": args.ignore_eos,
        "where": "running servers, each alone: " + ", ".join(f"{t.name} ({t.endpoint.root})" for t in targets),
        "targets": [
            {"name": t.name, "url": t.endpoint.root, "model": t.model, "replicas": [r.root for r in t.replicas]}
            for t in targets
        ],
        "warm_ups_s": sweep.warm_ups,
        "lane_clock": None,
        "machine": {"client": host_info()},
        "sources": {"points": CLIENT, "servers": METRICS + " (null: " + NOT_REPORTED + ")"},
        "servers": [point.as_dict() for point in sweep.servers],
        "spread": spread_lines(sweep.servers),
        **summary(sweep.points, slo, series),
    }
    if args.plot:
        title = f"Load sweep: {workload.name}, {spec.requests} requests per rate, seed {spec.seed}: " + ", ".join(
            series
        )
        save_plot(args.plot, sweep.points, slo, title, sweep.servers)
    return result


def format_server_table(servers: Sequence[dict]) -> str:
    """What each server said at each rate (its /metrics), one line per server and rate; "not reported" where it
    has no such figure."""
    columns = ("running_mean", "running_peak", "waiting_peak", "cache_usage_peak", "preemptions", "finished")
    header = ("series", "server", "rate/s", *(SERVER_FIGURES[name] for name in columns))
    lines = [
        (point["series"], point["server"], f"{point['rate']:g}", *(shown(point[name], name) for name in columns))
        for point in servers
    ]
    return text_table(header, lines)


# --- output --------------------------------------------------------------------------------------------------------
def format_table(points: Sequence[SweepPoint]) -> str:
    """One line per series and rate, in the order they ran."""
    header = (
        "series",
        "rate/s",
        "done",
        "req/s",
        "out tok/s",
        "TTFT p50/p90/p99 ms",
        "TPOT p90 ms",
        "ITL p90 ms",
        "E2E p90 ms",
        "met target",
    )

    def ms(value: float) -> str:
        return f"{value * 1000:.0f}" if value == value else "-"

    lines = [
        (
            point.series,
            f"{point.rate:g}",
            f"{point.completed}/{point.requests}",
            f"{point.request_throughput:.2f}",
            f"{point.output_throughput:.0f}",
            f"{ms(point.ttft_p50)} / {ms(point.ttft_p90)} / {ms(point.ttft_p99)}",
            f"{point.tpot_p90 * 1000:.1f}",
            f"{point.itl_p90 * 1000:.1f}",
            ms(point.e2e_p90),
            f"{point.attainment:.0%}",
        )
        for point in points
    ]
    return text_table(header, lines)


def goodput_lines(found: dict[str, Goodput], slo: Slo) -> list[str]:
    lines = []
    for series, each in found.items():
        if each.rate is None:
            lines.append(f"goodput {series}: below {each.lowest:g} requests/s (no rate met {slo.words()} for 90%)")
        elif each.whole_sweep:
            lines.append(f"goodput {series}: at least {each.rate:g} requests/s (every rate swept met the target)")
        else:
            lines.append(
                f"goodput {series}: {each.rate:.3g} requests/s (90% met the target up to {each.swept:g} requests/s, "
                "crossing before the next rate)"
            )
    return lines


def knee_lines(found: dict[tuple[str, str], float | None]) -> list[str]:
    by_series: dict[str, list[str]] = {}
    for (series, column), rate in found.items():
        by_series.setdefault(series, []).append(f"{column} {'-' if rate is None else f'{rate:g}/s'}")
    return [f"knees {series}: " + ", ".join(parts) for series, parts in by_series.items()]


def summary(points: list[SweepPoint], slo: Slo, series: Sequence[str]) -> dict:
    found = dict(goodputs(points))
    bends = knees(points, KNEE_COLUMNS)
    result: dict[str, object] = {
        "points": [point.as_dict() for point in points],
        "goodput": {name: asdict(each) for name, each in found.items()},
        "knees": {f"{series}/{column}": rate for (series, column), rate in bends.items()},
        "headline": None,
        "ratio": None,
    }
    if set(series) == set(MODES):
        result["headline"] = headline(found["continuous"], found["static"], slo)
        result["ratio"] = goodput_ratio(found["continuous"], found["static"])
    elif found:
        result["headline"] = servers_headline(found, slo)
    result["lines"] = goodput_lines(found, slo) + knee_lines(bends)
    return result


def run_sweep(args: argparse.Namespace) -> dict:
    """The sweep the flags ask for, in-process or against servers: every figure."""
    spec, slo, workload = check_args(args)
    if args.url or args.router:
        return sweep_running(args, spec, slo, workload)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        options = batcher_options(args)
        settings = load_settings()
        updates = {"name_or_path": args.model} if args.model else {}
        loaded = load_model(settings.model.model_copy(update=updates), settings.tokenizer)
        check_supported(loaded.model)
        mix = tokenised_mix(loaded, options, spec, workload, args)
        servers = len(args.servers.split(",")) if args.servers else 0
        total = spec.requests * len(spec.rates) * servers if servers else spec.total_requests
        with tqdm(total=total, unit="req", file=sys.stderr, disable=args.no_progress, dynamic_ncols=True) as bar:
            if args.servers:
                compile_s = None
                points, series = sweep_servers(args, mix, spec, slo, lambda: bar.update(1))
                done = InProcess(points, spec.rates, {}, {})
            else:
                compile_s = compile_graphs(loaded, options)
                clock = lane_clock(loaded, args.wall_clock)
                done = sweep_in_process(loaded, options, mix, spec, slo, clock, lambda: bar.update(1))
                series = list(MODES)
    finally:
        torch.set_num_threads(threads)
    points = done.points
    result = {
        "workload": workload.name,
        "requests_per_rate": spec.requests,
        "rates_asked": args.rates,
        "rates": list(done.rates),
        "capacities": done.capacities,
        "seed": spec.seed,
        "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "attainment_goal": 0.9},
        "ignore_eos": args.ignore_eos,
        "where": "servers: " + ", ".join(series) if args.servers else f"in-process race per rate, {done.clock} clocks",
        "lane_clock": done.clock if not args.servers else None,
        "engine": asdict(options),
        "machine": machine_info(loaded) | {"torch_threads": args.threads},
        "compile_s": compile_s,
        "steps": done.steps,
        **summary(points, slo, series),
    }
    if args.plot:
        save_plot(
            args.plot, points, slo, f"Load sweep: {workload.name}, {spec.requests} requests per rate, seed {spec.seed}"
        )
    return result


def save_plot(path: Path, points: list[SweepPoint], slo: Slo, title: str, servers: Sequence[ServerPoint] = ()) -> None:
    """Every chart of the sweep as a PNG (with each server's own figures when it read them)."""
    frame = server_frame(servers) if servers else None
    chart = sweep_chart(points_frame(points), slo, knees(points, KNEE_COLUMNS), goodputs(points), title, frame)
    chart.save(str(path), format="png")


def run(args: argparse.Namespace) -> int:
    """`python -m batching.bench sweep`: the sweep, its tables and lines (and JSON, and the charts)."""
    result = run_sweep(args)
    print(
        f"workload {result['workload']}, {result['requests_per_rate']} requests per rate, seed {result['seed']}, "
        f"{result['where']}; target {Slo(**{k: result['slo'][k] for k in ('ttft_s', 'tpot_s')}).words()}"
    )
    if result["capacities"]:
        served = ", ".join(f"{mode} {rate:.3g}" for mode, rate in result["capacities"].items())
        print(f"rates picked (auto): {format_rates(result['rates'])} requests/s; every request at once: {served} req/s")
    print(format_table([SweepPoint(**_fields(point)) for point in result["points"]]))
    if result.get("servers"):
        print(f"\neach server's own figures ({METRICS}):")
        print(format_server_table(result["servers"]))
    print()
    print("\n".join(result["lines"] + result.get("spread", [])))
    if result["headline"]:
        print(result["headline"])
    if args.json:
        args.json.write_text(json.dumps(json_safe(result), indent=1, allow_nan=False), encoding="utf-8")
    return 0


def _fields(point: dict) -> dict:
    derived = ("failed", "attainment", "request_throughput", "output_throughput")
    return {key: value for key, value in point.items() if key not in derived}
