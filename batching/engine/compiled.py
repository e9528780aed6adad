"""Compiled decode steps: `torch.compile` of the model's own forward, one graph per slot count and block size.

A decode step (every row one new token) keeps its row count symbolic (one row is padded to two, as a size of 1
would be specialised on), and its cached columns are rounded up to a multiple of `KV_STEP` and kept symbolic, so
one graph with no graph breaks covers every decode step of a batcher, whatever its rows and history. The graph
is made in a background thread on a scratch runner with its own cache (or up front: `compile_now`, as the API server
and the benchmark do); until it is ready, steps run eager, and for good once it fails to be made or fails at run
time (that step reruns eager). The thread sleeps while `pause_compiles(True)` holds (the engine holds it whenever a
batcher has work), so no step shares the interpreter with a compile. Steps with prompt chunks have a graph of their
own (`StepKind` "mixed", see `runner`), used for the steps `fits_prompt_graph` admits. Once a graph's first calls
agree with it, the runner calls it directly, without `torch.compile`'s entry (`torch_door.direct_call`). How graphs
are made and run (torch's internals, or its public APIs only) is the process's route (`torch_gate`).

A ready graph is never switched off, and no step ever compiles: steps call the graphs in dynamo's run-only mode
(`StepCompiler.graphs_only`; the stance `eager_on_recompile` on the public route), which runs a step its guards
admit through its graph, runs any other step as the model's own code, eager, and never takes dynamo's compile lock
(which a compile in another thread, perhaps paused, holds for its whole length). A step no graph admitted (a guard
miss) says it ran eager, and the graph is made again for that step's shape in the background
(`StepCompiler.missed`, at most `MAX_REMAKES` times).
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import torch
from transformers import PreTrainedModel

from batching.engine.direct_path import DirectPath
from batching.engine.graph_cache import UntrustedGraph, check_against_eager
from batching.engine.step_forward import run_model
from batching.engine.torch_gate import CompileRoute, compile_route

logger = logging.getLogger(__name__)

Bucket = tuple[int, int]  # (rows, cached columns) of a padded decode step
KV_STEP = 32  # columns are rounded up to this: never 0 or 1 (sizes the compiler would specialise on)
StepKind = Literal["decode", "mixed"]  # every row one token; or prompt chunks (beside decode rows or not)
# Which steps with prompt chunks go through their graph (`fits_prompt_graph`). Where attention reads the pools
# through the block tables (`paged_decode`: every new token a query row of its own, nothing padded), every step:
# measured at the 0.5B shape (4 of its layers, AMD EPYC, 2026-11-27, a machine loaded to 8-10, min of 4-6 alternating
# pairs), the graph against eager at 2 threads: one 400-token chunk 1.55 against 3.00 s, three of 170 2.49 against
# 3.52, eight of 60 1.60 against 2.90, 7 decode rows + 200 0.98 against 1.38; at 1 thread 1.23-1.75x (its fused
# norms, rotary and residual adds replace a dozen eager passes over the tokens a layer, and its linears read
# weights packed for oneDNN). Elsewhere (the gathered groups) up to MIXED_MAX_TOKENS tokens in all, or any number
# (up to the step budget) of chunks none longer than MIXED_MAX_CHUNK. What loses there is a long chunk: its queries
# are padded into a group of at least two rows, and its attention runs on a full mask. Measured (1 thread, one step
# alone, compiled against eager, 2026-11-26): on the embedded model (autotuned) one 300-token chunk 42.1 against
# 32.2 ms, 7 decode rows + 200 tokens 31.0 against 24.3, but eight 39-token first chunks (312 tokens) 25.8 against
# 27.9 and eight of 64 (512) 38.9 against 39.5.
MIXED_MAX_TOKENS = 128
MIXED_MAX_CHUNK = 64


def fits_prompt_graph(tokens: int, longest_chunk: int, through_tables: bool = False) -> bool:
    """Whether a step with prompt chunks of `tokens` new tokens in all, its longest chunk `longest_chunk`, goes
    through the prompt-step graph (else eager). `through_tables`: its attention reads the pools through the block
    tables, one query row per token, so no chunk is padded and every step does."""
    return through_tables or tokens <= MIXED_MAX_TOKENS or longest_chunk <= MIXED_MAX_CHUNK


# Measured on the embedded model, 8 rows over 100 cached tokens, 1 thread, against raw matmuls over the same
# weights: 2.2x that floor with inductor's defaults; 1.83x with the weights frozen into the graph (packed once for
# MKL; 28 s to compile); 1.31x with `max_autotune` choosing inductor's C++ GEMM templates for the linear layers
# (70 s to compile: each template is timed against the packed MKL call, which it beat 1.3-9x at 8 rows).
# - Freezing only takes effect with dynamo's `prepare_freezing` on while the graph is traced (else the weights
#   stay graph inputs): the door's route does (`torch_door.route`), the public route cannot.
# - The C++ wrapper calls the kernels without Python between them.
# - Guards on the model's modules are skipped (its weights are constants of the graph and it never trains): the
#   guard check went from 0.24-0.43 ms a step to 0.1 ms.
COMPILE_OPTIONS: dict[str, str | int | bool | Callable[..., Any]] = {
    "freezing": True,
    "cpp_wrapper": True,
    "guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe,
    # On a GPU, inductor's matmul padding pass specialised the symbolic column count to a constant (64) and the
    # compile failed (H100, torch 2.11); the pass does nothing on a CPU.
    "shape_padding": False,
}
# On a GPU the decode graph is replayed from CUDA graphs (`cuda_graphs`), so its wrapper runs only while one is
# captured: inductor's Python wrapper, which needs no C++ compile. The prompt-step graph, launched every step, keeps the
# C++ one: without it, on an H100 (torch 2.11), its steps took 28.5 ms against 12 with it on an H200, its kernels
# launched from Python (about 3,000 a step).
CUDA_DECODE_OPTIONS: dict[str, str | int | bool | Callable[..., Any]] = {"cpp_wrapper": False}
AUTOTUNE_OPTIONS: dict[str, str | int | bool | Callable[..., Any]] = {
    "max_autotune": True,
    "max_autotune_gemm_backends": "CPP,ATEN",  # ATEN too: the attention's batched matmuls have no C++ template
    # Its timings are not printed (to stderr, a table per matrix shape): the log says what was compiled and how long.
    "autotune_num_choices_displayed": 0,
    "max_autotune_report_choices_stats": False,
}

# A small model's decode graph on a CPU: its linear layers as inductor's C++ GEMM templates only, not oneDNN's packed
# call beside them (each oneDNN call builds its descriptors anew: a fixed cost that a small layer's work does not
# hide). Measured, decode steps alone, one process, the two graphs alternating (2026-11-28, 2-vCPU AMD EPYC): the
# embedded model (largest weight 3027 x 256) at two threads 0.51 / 0.56 / 0.70 / 1.40 ms at 1 / 2 / 4 / 8 rows against
# 0.59 / 0.64 / 0.75 / 1.43 with autotuning's mix, at one thread 0.65 against 1.21 ms at 1 row; seed-blog at two
# threads 1.06x. The 0.5B shape (weights up to 4864 x 896) went the other way at 8 rows (84.4 against 63.5 ms; 45.1
# against 60.4 at 1 row), so larger models keep the mix. A graph the templates cannot make alone (a batched matmul
# in attention has no template here) is compiled again with every kernel.
TEMPLATES_ONLY_MAX_WEIGHT = 1 << 20  # elements of the largest linear layer's weight
TEMPLATES_ONLY: dict[str, str | int | bool | Callable[..., Any]] = {"max_autotune_gemm_backends": "CPP"}


def templates_only(model: torch.nn.Module, autotune: bool, kind: StepKind) -> bool:
    """Whether `model`'s `kind` graph takes its linear layers from inductor's C++ GEMM templates only: an autotuned
    decode graph on a CPU of a model whose weights (every parameter with two dimensions or more) are linear layers'
    and embeddings', none over `TEMPLATES_ONLY_MAX_WEIGHT` elements in a linear layer."""
    largest = _largest_linear(model, autotune, kind)
    return largest is not None and largest <= TEMPLATES_ONLY_MAX_WEIGHT


def templates_beside(model: torch.nn.Module, autotune: bool, kind: StepKind) -> bool:
    """Whether `model`'s `kind` steps have a second graph, its linear layers from the C++ templates only, beside the
    main one (which autotuning's mix keeps): as `templates_only`, for a model with a linear weight over the limit.
    Steps of few rows stream the weights faster through the templates, full batches through the mix: each row
    count's steps take the faster graph, timed (`graph_choice`)."""
    largest = _largest_linear(model, autotune, kind)
    return largest is not None and largest > TEMPLATES_ONLY_MAX_WEIGHT


def _largest_linear(model: torch.nn.Module, autotune: bool, kind: StepKind) -> int | None:
    """The elements of `model`'s largest linear weight where its `kind` graph may take the C++ templates alone (an
    autotuned decode graph on a CPU of a model whose matrices are linear layers' and embeddings', its weights frozen
    into the graph: the templates need constant weights), else None."""
    if not autotune or kind != "decode" or next(model.parameters()).device.type != "cpu":
        return None
    if not compile_route()[1].frozen_weights:
        return None
    linear = {
        id(module.weight): module.weight.numel() for module in model.modules() if isinstance(module, torch.nn.Linear)
    }
    embedding = {id(module.weight) for module in model.modules() if isinstance(module, torch.nn.Embedding)}
    matrices = [parameter for parameter in model.parameters() if parameter.dim() >= 2]
    if not linear or any(id(weight) not in linear and id(weight) not in embedding for weight in matrices):
        return None
    return max(linear.values())


ForwardKey = tuple[bool, StepKind, bool, str]  # autotune, kind, templates, route
_compiled: weakref.WeakKeyDictionary[torch.nn.Module, dict[ForwardKey, Callable[..., object]]] = (
    weakref.WeakKeyDictionary()
)
CompilerKey = tuple[int, int, bool, StepKind, bool | None]  # capacity, block size, autotune, kind, second graph
_compilers: weakref.WeakKeyDictionary[torch.nn.Module, dict[CompilerKey, StepCompiler]] = weakref.WeakKeyDictionary()
_lock = threading.RLock()
_model_numbers = itertools.count()
_compiles_may_run = threading.Event()
_compiles_may_run.set()


def pause_compiles(paused: bool) -> None:
    """Hold (True) or release (False) every background compile of this process.

    A compile in a thread of the engine process shares the interpreter lock with the steps: measured here, steps
    ran at a third of their speed, unevenly, while a graph was made, so the first race after a start timed the
    compiler more than the batching (10.5 s on a lane against 0.7 s warm). Held, the compile thread sleeps at its
    next Python call (see `_sleep_while_paused`) and the steps have the interpreter to themselves.
    """
    if paused:
        _compiles_may_run.clear()
    else:
        _compiles_may_run.set()


def compiles_paused() -> bool:
    """Whether background compiles are held now."""
    return not _compiles_may_run.is_set()


# Code that holds a lock other threads take (a logging handler's, an import's module lock, a condition's) is no
# place to sleep: the engine loop, blocked on that lock, would never release the compile.
_HOLDS_LOCKS = ("logging", "importlib", "threading", "concurrent", "queue", "filelock")
# The frames every thread starts from (in `threading`, holding nothing): the walk up the stack ends there.
_THREAD_BASE = {
    threading.Thread.run.__code__,
    threading.Thread._bootstrap.__code__,  # type: ignore[attr-defined]
    threading.Thread._bootstrap_inner.__code__,  # type: ignore[attr-defined]
}


def _sleep_while_paused(frame: types.FrameType, event: str, arg: object) -> None:
    """The compile thread's trace function: called at each Python call it makes, it waits while compiles are held,
    unless a frame on its stack may hold a lock (it pauses at a later call then).

    Tracing makes the compile itself about 1.8x longer (measured: 28 s to 50 s on the embedded model, warm cache),
    paid while the engine is idle; no C-level hook can pause a thread in Python 3.11. Returns None: no line events.
    """
    if _compiles_may_run.is_set():
        return
    caller: types.FrameType | None = frame
    while caller is not None and caller.f_code not in _THREAD_BASE:
        if caller.f_globals.get("__name__", "").startswith(_HOLDS_LOCKS):
            return
        caller = caller.f_back
    _compiles_may_run.wait()


def default_cache_dir() -> Path:
    """Where compiled graphs are kept by default: the user's cache folder, never the repository."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "batchscope" / "torch-compile"


def use_compile_cache(folder: Path | None = None) -> Path:
    """Keep torch's compile caches (inductor's FX graphs, kernels, AOT graphs) in `folder`, so a second start
    reuses the graphs of the first instead of compiling them again. Call before the first compile."""
    folder = folder or default_cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)  # read by inductor at each cache lookup
    return folder


def compiled_forward(
    model: PreTrainedModel,
    autotune: bool,
    kind: StepKind = "decode",
    templates: bool = False,
    route: CompileRoute | None = None,
    renew: bool = False,
) -> Callable[..., object]:
    """One compiled forward per model, autotune choice, step kind, GEMM choice (`templates`: the C++ templates
    only, `templates_only`) and route (default: the process's), shared by every batcher on it: call it with the
    model, then its inputs. `renew`: a new one in place of the one kept (whose graphs cannot be dropped).

    Each model gets a code object of its own to compile: dynamo keeps its graphs on the code object it starts
    from, and its guards cannot tell two models of one class apart (a model is guarded by type, not identity), so
    through `model.forward` a second model would run the first one's graph, with the first one's weights frozen in.
    Each kind too, so a decode step checks the decode graph's guards only.
    """
    route = route or compile_route()[1]
    with _lock:
        forwards = _compiled.setdefault(model, {})
        key = (autotune, kind, templates, route.name)
        forward = None if renew else forwards.get(key)
        if forward is None:
            code = run_model.__code__.replace(co_name=f"run_model_{next(_model_numbers)}")
            run = types.FunctionType(code, run_model.__globals__, code.co_name)
            options = {
                **COMPILE_OPTIONS,
                **(AUTOTUNE_OPTIONS if autotune else {}),
                **(TEMPLATES_ONLY if templates else {}),
            }
            if model.device.type == "cuda" and kind == "decode":
                options.update(CUDA_DECODE_OPTIONS)
            # Not bound to the model (it is passed at each call): the weak dictionary does not keep its own key alive.
            forward = forwards[key] = route.compile(run, options, model)
        return forward


# Runs one step of a bucket through a compiled forward, which makes its graph; given the compiler (the first time a
# graph is made), then makes and checks the graph's direct call, so serving starts on it (`warmup.make_direct_call`).
Warm = Callable[[Callable[..., object], Bucket, "StepCompiler | None"], None]
# How often one graph is made again after steps its guards refused (each a background compile, tens of seconds);
# after that such steps stay eager, and the graph keeps running the steps it admits.
MAX_REMAKES = 3


def step_compiler(
    model: PreTrainedModel,
    capacity: int,
    block_size: int,
    autotune: bool,
    warm: Warm,
    kind: StepKind = "decode",
    templates: bool | None = None,
) -> StepCompiler:
    """The compiler of this model's decode steps (or steps with prompt chunks) for a slot count and block size:
    batchers of one shape share it (a race's two lanes, whatever their context and pool), so a batcher made after
    another finds the graph ready. `templates`: the second decode graph, from the C++ templates only
    (`templates_beside`); None: the main graph, its kernels as `templates_only` says."""
    with _lock:
        compilers = _compilers.setdefault(model, {})
        key = (capacity, block_size, autotune, kind, templates)
        compiler = compilers.get(key)
        if compiler is None:
            compiler = compilers[key] = StepCompiler(model, capacity, block_size, autotune, warm, kind, templates)
        return compiler


CompileStage = Literal["off", "waiting", "compiling", "compiled", "failed"]


@dataclass(frozen=True)
class CompileState:
    """Where the compiled decode steps of a model stand, for people watching the engine."""

    stage: CompileStage  # waiting: on, but no decode step has asked for a graph yet
    seconds: float | None = None  # how long the slowest graph took to make, once every one is made


def compile_state(model: PreTrainedModel, enabled: bool) -> CompileState:
    """The state of every decode graph of `model`: failed if any failed, compiling while any is being made. A second
    graph that failed is left out: the main one runs every step (`templates_beside`)."""
    if not enabled:
        return CompileState("off")
    with _lock:
        compilers = list(_compilers.get(model, {}).values())
    started = [compiler for compiler in compilers if compiler.started and not (compiler.second and compiler.failed)]
    if any(compiler.failed for compiler in started):
        return CompileState("failed")
    if not started:
        return CompileState("waiting")
    if not all(compiler.ready for compiler in started):
        return CompileState("compiling")
    return CompileState("compiled", max(compiler.compile_s or 0.0 for compiler in started))


def _first_line(exc: Exception) -> str:
    """An error's first line, for a one-line log."""
    return (str(exc).strip().splitlines() or [""])[0]


class StepCompiler:
    """Whether the decode graph is ready; makes it in a background thread the first time a step asks for it.

    `warm(forward, bucket, compiler)` runs one step of that shape through the compiled forward on scratch state (the
    runner provides it), which is what makes the graph, and the first time, makes and checks its direct call.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        capacity: int,
        block_size: int,
        autotune: bool,
        warm: Warm,
        kind: StepKind = "decode",
        templates: bool | None = None,
    ) -> None:
        # The main graph's kernels follow `templates_only`, and where the templates alone cannot make it, it is made
        # with every kernel; a second graph (`templates` set: `templates_beside`) is the templates' or nothing.
        self.route = compile_route()[1]  # how its graphs are made and run (`torch_gate`)
        self.second = templates is not None
        self.templates = templates_only(model, autotune, kind) if templates is None else templates
        self.forward = compiled_forward(model, autotune, kind, self.templates, self.route)
        model_ref = weakref.ref(model)  # the compilers of a model are kept beside it, weakly: no cycle through here
        self._forward_of = lambda templates, renew=False: compiled_forward(
            cast(PreTrainedModel, model_ref()), autotune, kind, templates, self.route, renew
        )
        self.kind = kind
        self.capacity = capacity
        # Columns are rounded to whole blocks and to KV_STEP (both powers of two).
        self.column_step = max(KV_STEP, block_size)
        self.compile_s: float | None = None  # how long making the graph took, once made
        self.from_cache: bool | None = None  # whether it was read from the disk cache (None: cannot be told)
        self.failed = False
        self.remakes = 0  # background re-makes after guard misses (`missed`)
        self.device = model.device
        self.direct = self._direct_path()  # the graph called without torch.compile's entry, where it may be
        self._warm = warm
        self._graphs_only: tuple[Callable[..., object], Callable[..., object]] | None = None  # (forward, its run-only)
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False
        self._lock = threading.Lock()

    def bucket(self, rows: int, kv_len: int) -> Bucket:
        """The padded shape of a decode step with `rows` rows reading `kv_len` cached columns (whole blocks: the
        rows' tables are gathered, so no column count is special, the cache's length included)."""
        # One row is padded to two: a symbolic size of 1 would be specialised on (a second graph).
        return (min(max(rows, 2), self.capacity), self.columns(kv_len))

    def columns(self, kv_len: int) -> int:
        """`kv_len` cached columns rounded up to the graph's column step."""
        return -(-kv_len // self.column_step) * self.column_step

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    @property
    def started(self) -> bool:
        """Whether making the graph has begun (in the background, perhaps paused, or in `compile_now`)."""
        return self._started or self._thread is not None

    def step(self) -> Callable[..., object] | None:
        """The graphs, called without ever compiling (`graphs_only`), once ready; else None (run eager) and the graph
        is made meanwhile. Whatever else is being compiled: a ready graph is never switched off."""
        if self._ready.is_set():
            return self.graphs_only()
        self.start()
        return None

    def _direct_path(self) -> DirectPath:
        """A fresh direct path; given up from the start where the route calls no graph directly."""
        return DirectPath(failed=not self.route.direct_calls(self.device))

    def graphs_only(self) -> Callable[..., object]:
        """`forward` in run-only mode (`CompileRoute.graphs_only`): a call its graphs' guards admit runs a graph, any
        other runs the model's own code, eager, instead of compiling inside the step (tens of seconds, every request
        stalled, and waiting on dynamo's compile lock, which a compile in another thread holds). The runner tells the
        two apart by the call's answer (`step_forward.ran_graph`)."""
        forward = self.forward
        kept = self._graphs_only
        if kept is None or kept[0] is not forward:
            kept = self._graphs_only = (forward, self.route.graphs_only(forward))
        return kept[1]

    def start(self) -> None:
        """Make the graph in a background thread (once; a failure leaves the steps eager for good)."""
        with self._lock:
            if self._thread is None and not self._ready.is_set() and not self.failed:
                self._thread = threading.Thread(target=self._make_paused, name="batchscope-compile", daemon=True)
                self._thread.start()

    def missed(self, bucket: Bucket | None) -> None:
        """A step no graph admitted ran eager: make the graph again in the background for that step's shape (`bucket`;
        None: the shape it was first made for), while the graph that is ready runs every step it admits. At most
        `MAX_REMAKES` times; one at a time."""
        with self._lock:
            if self.failed or not self._ready.is_set() or (self._thread is not None and self._thread.is_alive()):
                return
            if self.remakes >= MAX_REMAKES:
                if self.remakes == MAX_REMAKES:
                    self.remakes += 1
                    logger.warning(
                        "the %s was made again %d times: steps it refuses stay eager", self.what, self.remakes - 1
                    )
                return
            self.remakes += 1
            logger.info("a %s the graph refused ran eager: making it again in the background", self.what)
            self._thread = threading.Thread(
                target=self._make_paused, args=(bucket,), name="batchscope-compile", daemon=True
            )
            self._thread.start()

    def compile_now(self) -> float | None:
        """Make the graph in this thread (the benchmark does, before it times anything); returns its seconds, or
        None when it could not be made (the steps stay eager)."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join()
        elif not self._ready.is_set() and not self.failed:
            self._make()
        return None if self.failed else self.compile_s

    def fail(self, exc: Exception, what: str) -> None:
        """Give up on the graph for good, in one line of the log: every later step runs eager."""
        first_line = _first_line(exc)
        logger.warning("%s, steps stay eager: %s: %s", what, type(exc).__name__, first_line)
        logger.debug("compile failure", exc_info=exc)
        self.failed = True
        self._ready.clear()

    def _make_paused(self, bucket: Bucket | None = None) -> None:
        """`_make` in the background thread, sleeping while compiles are held."""
        sys.settrace(_sleep_while_paused)
        try:
            self._make(bucket)
        finally:
            sys.settrace(None)

    def _make(self, bucket: Bucket | None = None) -> None:
        """Trace and compile through one step of `bucket` (default: every slot, two column steps); the first time,
        the graph is ready after it, or failed; a re-make adds a graph beside the ready one. A graph read from the
        disk cache that cannot be loaded, or whose first step disagrees with eager, is compiled afresh."""
        self._started = True
        remaking = self._ready.is_set()
        start = time.perf_counter()
        hits = self.route.cache_hits()
        try:
            try:
                self._trace(bucket, first=not remaking)
            except Exception as exc:
                if not self._from_cache(exc, hits):
                    raise
                self._afresh(exc)
                self._trace(bucket, first=not remaking)
                if remaking and bucket is not None:
                    self._trace(None, first=False)
        except Exception as exc:  # a model (or a machine without a C++ compiler) that cannot compile stays eager
            if self.templates and not self.second and not remaking and self._with_every_kernel(exc, bucket):
                self._done(start, hits, remaking)
                return
            if remaking:  # the graph made before keeps running what it admits; no more tries
                self.remakes = MAX_REMAKES + 1
                first_line = _first_line(exc)
                logger.warning("making the %s again failed: %s: %s", self.what, type(exc).__name__, first_line)
                return
            self.fail(exc, f"compiling the {self.what} failed")
            return
        self._done(start, hits, remaking)

    def _from_cache(self, exc: Exception, hits: int | None) -> bool:
        """Whether a failure of the graph's making may be a graph read from the disk cache: one was read (where the
        route can tell), or the graph disagreed with eager (where it cannot)."""
        now = self.route.cache_hits()
        return isinstance(exc, UntrustedGraph) if now is None or hits is None else now != hits

    def _afresh(self, exc: Exception) -> None:
        """After a graph read from the cache failed: the cache cleared, the graph to be compiled afresh."""
        first_line = _first_line(exc)
        logger.warning(
            "the %s's graph read from the compile cache could not be used (%s: %s): the cache is cleared and the "
            "graph compiled afresh",
            self.what,
            type(exc).__name__,
            first_line,
        )
        # The graph dynamo installed from it is dropped too (the ready one with it, when remaking: made again; where
        # the route cannot drop it, the compiler takes a new forward), and a direct call made from it (the warm-up
        # makes one, `warmup.make_direct_call`).
        if not self.route.forget(self.forward):
            self.forward = self._forward_of(self.templates, True)
        self.direct = self._direct_path()
        self.route.clear_cache()

    def _with_every_kernel(self, exc: Exception, bucket: Bucket | None) -> bool:
        """After the C++ templates alone could not make the graph: make it with every kernel (True once made)."""
        first_line = _first_line(exc)
        logger.info(
            "the %s's linear layers as C++ templates alone did not compile (%s: %s): compiling with every kernel",
            self.what,
            type(exc).__name__,
            first_line,
        )
        self.templates = False
        self.forward = self._forward_of(False)
        self.direct = self._direct_path()
        try:
            self._trace(bucket, first=True)
        except Exception as again:
            self.fail(again, f"compiling the {self.what} failed")
            return False
        return True

    def _done(self, start: float, hits: int | None, remaking: bool) -> None:
        """Log the graph made (read from the cache or compiled, where the route can tell); the first time, it is
        ready."""
        seconds = time.perf_counter() - start
        now = self.route.cache_hits()
        self.from_cache = None if now is None or hits is None else now > hits
        source = {True: "read from the compile cache", False: "compiled", None: "made"}[self.from_cache]
        if remaking:
            logger.info("%ss of %d rows made again in %.1f s (%s)", self.what, self.capacity, seconds, source)
            return
        self.compile_s = seconds
        self._ready.set()
        logger.info("%ss of %d rows %s in %.1f s", self.what, self.capacity, source, self.compile_s)

    def _trace(self, bucket: Bucket | None, first: bool) -> None:
        """One step of `bucket` through the compiled forward (which makes its graph, or reads it from the disk cache
        and checks it against eager); `first`: the graph's first making, which also makes its direct call."""
        forward = check_against_eager(self.route.making(self.forward), run_model, self.route.cache_hits)
        with self.route.tracing():
            self._warm(forward, bucket or (self.capacity, 2 * self.column_step), self if first else None)

    @property
    def what(self) -> str:
        what = "decode step" if self.kind == "decode" else "prompt step"
        return f"C++-template {what}" if self.second else what
