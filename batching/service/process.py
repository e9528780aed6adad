"""The engine process: loads the model, then one busy loop reads commands between rounds of steps.

Like vLLM's engine core (vllm/v1/engine/core.py), the loop lives in a process of its own, so nothing a client does
(drawing a page, tokenising, serving HTTP) competes with a step for the interpreter lock. It reads commands only
between rounds, waits on the pipe when every batcher is idle, and exits when the client's end of the pipe closes
(the client exited or was killed) or on `Shutdown`. A thread of its own sends a `Heartbeat` every `HEARTBEAT_S`
with the loop's round count, from before the model loads to the end: its client tells a stopped or hung engine
from a busy one by it.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import logging
import os
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection

import torch

import batching.engine.paged_decode as paged_decode
from batching.engine.batcher import Batcher
from batching.engine.compiled import StepCompiler, pause_compiles, use_compile_cache
from batching.engine.geometry import PoolGeometry
from batching.engine.model_support import UnsupportedModelError, attention_features, check_supported
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams
from batching.engine.runner import ModelRunner
from batching.engine.threads import pick_threads
from batching.engine.torch_gate import allow_internals, compile_route
from batching.service.core import EngineCore
from batching.service.messages import (
    HEARTBEAT_S,
    EngineConfig,
    EngineInfo,
    Heartbeat,
    LoadFailed,
    Progress,
    Ready,
    Shutdown,
)
from model.loader import LoadedModel, ModelLoadError, load_model

logger = logging.getLogger(__name__)

IDLE_WAIT_S = 0.5  # how often an idle engine looks for batchers to close


def main(argv: list[str]) -> None:
    """`python -m batching.service COMMANDS_FD OUTPUTS_FD`: the two pipe ends the client passed; config comes first."""
    commands = Connection(int(argv[0]), writable=False)
    outputs = Connection(int(argv[1]), readable=False)
    engine_main(commands.recv(), commands, outputs)


def engine_main(config: EngineConfig, commands: Connection, outputs: Connection) -> None:
    """Load the model, say so, then run the loop until told to stop or the client goes away."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s engine[%(process)d] %(levelname)s %(message)s")
    if config.initializer is not None:
        config.initializer()
    pulse = Pulse(outputs)
    loaded = _load(config, pulse)
    if loaded is None:
        return
    core = EngineCore(loaded.model, loaded.tokenizer, config.engine, pulse.send)
    if config.background_graphs is not None and config.engine.compile_steps:
        start_graphs(loaded, config.background_graphs)
    try:
        run_loop(core, commands, parent=os.getppid(), pulse=pulse)
    except (EOFError, OSError, BrokenPipeError):
        logger.info("the client went away; the engine stops")


class Pulse:
    """The engine's outputs pipe, shared under a lock by the loop and a heartbeat thread (`Heartbeat` every
    `HEARTBEAT_S`, with how many rounds the loop has gone)."""

    def __init__(self, outputs: Connection) -> None:
        self.outputs = outputs
        self.rounds = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._beat, name="batchscope-heartbeat", daemon=True).start()

    def send(self, message: object) -> None:
        with self._lock:
            self.outputs.send(message)

    def _beat(self) -> None:
        while True:
            try:
                self.send(Heartbeat(self.rounds))
            except OSError:  # the client is gone; the loop sees it too
                return
            time.sleep(HEARTBEAT_S)


def run_loop(core: EngineCore, commands: Connection, parent: int, pulse: Pulse | None = None) -> None:
    """Commands, then one step of every busy batcher, until `Shutdown`; an idle engine sleeps on the pipe. Each
    round is counted on `pulse` (its heartbeat says so).

    Also stops when the client's process is gone (`parent` is no longer our parent): another engine forked from
    it may hold a copy of our command pipe, so EOF alone cannot tell.
    """
    next_check = time.monotonic() + IDLE_WAIT_S
    while True:
        if pulse is not None:
            pulse.rounds += 1
        wake = core.next_work_s()  # 0: a batcher can step now; > 0: only slow-motion pauses; None: idle
        if commands.poll(IDLE_WAIT_S if wake is None else min(wake, IDLE_WAIT_S)):
            while True:
                command = commands.recv()
                if isinstance(command, Shutdown):
                    return
                core.handle(command)
                if not commands.poll(0):
                    break
        pause_compiles(core.holds_compiles())
        core.step_round()
        if time.monotonic() >= next_check:
            if os.getppid() != parent:
                return
            core.close_idle()
            next_check = time.monotonic() + IDLE_WAIT_S


def _load(config: EngineConfig, outputs: Pulse) -> LoadedModel | None:
    """Load and warm up the model, then say `Ready`; on failure send one line (`LoadFailed`) instead."""
    try:
        loaded = load_model(config.model, config.tokenizer)
        check_supported(loaded.model)  # refused before any request rather than answered wrongly
        # As many torch threads as make this model's steps fastest (`pick_threads`), up to torch's count (the cores,
        # or OMP_NUM_THREADS): timed now, before any graph is made (inductor bakes the count into its kernels).
        choice = config.threads or pick_threads(
            loaded.model, loaded.tokenizer, torch.get_num_threads(), config.engine.compile_steps
        )
        torch.set_num_threads(choice.threads)
        if config.prepare is not None:  # the API server, which logs each line of its start
            outputs.send(Progress(choice.line() + (" (the first start's choice)" if config.threads else "")))
        route = ""
        if config.engine.compile_steps:  # graphs are made in the background by the first decode steps
            use_compile_cache(config.engine.compile_cache_dir)
            allow_internals(config.engine.torch_internals)
            route = compile_route()[0].line  # which way compiled steps run: said in the log, and on the info
            if config.prepare is not None:
                outputs.send(Progress(route))
        # One tiny request, so the first real one does not pay for warm-up.
        warm = Batcher(loaded.model, loaded.tokenizer, BatcherOptions(max_batch_size=1, max_batched_tokens=64))
        warm.add("Hello", RequestParams(2))
        for _ in warm.run():
            pass
        if config.prepare is not None and config.engine.compile_steps:
            make_graphs(loaded, config.prepare, lambda line: outputs.send(Progress(line)))
        # The 400k objects of torch, transformers and the model never die: out of the collector's sight, a full
        # collection went from 0.18 s (a step stalled that long now and then, more under load) to nothing.
        gc.freeze()
    except UnsupportedModelError as exc:
        outputs.send(LoadFailed(str(exc), model_error=True, unsupported=True))
        return None
    except ModelLoadError as exc:
        outputs.send(LoadFailed(str(exc), model_error=True))
        return None
    except Exception as exc:  # a broken model folder can fail in many ways; the client gets one line
        outputs.send(LoadFailed(f"{type(exc).__name__}: {str(exc)[:200]}", model_error=False))
        return None
    info = EngineInfo(
        name=loaded.name,
        num_parameters=loaded.num_parameters,
        device=str(loaded.device),
        dtype=str(loaded.dtype).removeprefix("torch."),
        load_seconds=loaded.load_seconds,
        pid=os.getpid(),
        features=attention_features(loaded.model),
        weights=loaded.weights.line(),
        thread_choice=choice,
        geometry=PoolGeometry.of(loaded.model),
        compile_route=route,
    )
    outputs.send(Ready(info))
    return loaded


def start_graphs(loaded: LoadedModel, options: BatcherOptions) -> None:
    """Start making, each in a background thread, every graph a batcher with `options` steps through: they run while
    the engine is idle and sleep while anything steps (`pause_compiles`)."""
    for compiler in _graph_runner(loaded, options).compilers():
        compiler.start()


def _graph_runner(loaded: LoadedModel, options: BatcherOptions) -> ModelRunner:
    """A runner of `options`' shape on the smallest pool: graphs do not depend on the pool's size (they are traced
    on a scratch pool)."""
    small = dataclasses.replace(options, kv_blocks=options.max_batch_size, kv_cache_tokens=None, kv_cache_mb=None)
    return Batcher(loaded.model, loaded.tokenizer, small).runner


def make_graphs(loaded: LoadedModel, options: BatcherOptions, say: Callable[[str], None]) -> None:
    """Make everything compiled that a batcher with `options` will use, in this thread, before the engine says it is
    ready (vLLM compiles and captures at start too): the paged-decode operator, the decode steps' graph and the
    prompt steps' graph, each said with its time. The first start compiles (minutes, with kernels timed); a later
    one reads the graphs from the disk cache (said on their lines) after tracing the steps again. One that cannot be
    made is said, and its steps stay eager.
    """
    runner = _graph_runner(loaded, options)
    eager = "failed: its steps run eager (see the log)"
    # What, how to make it (True: made), what failing means, and its compiler (which says whether it was cached).
    parts: list[tuple[str, Callable[[], bool], str, StepCompiler | None]] = []
    if runner.reads_through_tables:
        parts.append(("the paged-decode operator", paged_decode.load, eager, None))
    for graph in runner.compilers():
        what = f"the graph of {graph.what}s of {graph.capacity} rows"
        failed = "failed: every decode step takes the other graph (see the log)" if graph.second else eager
        parts.append((what, functools.partial(_made, graph), failed, graph))
    started = time.perf_counter()
    for number, (what, make, failed, compiler) in enumerate(parts, 1):
        bar = "#" * (number - 1) + "." * (len(parts) - number + 1)
        say(f"compiling [{bar}] {number}/{len(parts)}: {what}")
        start = time.perf_counter()
        made = make()
        outcome = f"in {time.perf_counter() - start:.1f} s" if made else failed
        if made and compiler is not None and compiler.from_cache:
            outcome += " (read from the compile cache)"
        say(f"compiled  [{'#' * number}{'.' * (len(parts) - number)}] {number}/{len(parts)}: {what} {outcome}")
    if parts:
        say(f"compiled steps ready in {time.perf_counter() - started:.1f} s")


def _made(compiler: StepCompiler) -> bool:
    """Make the graph now; whether it could be."""
    return compiler.compile_now() is not None
