"""What AOT autograd and freezing made of a step's graph, kept on disk, so a second start only traces with dynamo.

A start that finds every graph in inductor's disk cache still spent most of its time before the cache lookup: for
each graph, dynamo traced the step (a fifth of the time), then AOT autograd traced it again and collected its
metadata, and freezing ran its passes (each three fake-tensor passes over thousands of nodes), before inductor's FX
graph cache answered with the compiled graph. AOT autograd's own cache would skip all that, but it refuses frozen
graphs: a frozen graph's weights are constants that inductor's cache does not store, taken at load time from the graph
freezing made, which a cache hit does not have.

`FrozenGraphBackend` (the dynamo backend of every step graph) keeps what is needed to do without that graph:
- the compiled graph's FX graph cache key and the arguments inductor compiled it with;
- how to make each frozen constant from the model's weights (`Recipes`): a weight itself, or the ops freezing's
  constant folding ran on weights (transposes, MKL-DNN packing), recorded as it ran them; small constants the graph
  held before freezing are stored as they are.
A later start with the same graph (the same traced code and inputs, the same model, options, torch and engine code)
rebuilds the constants from the weights and loads the compiled graph from inductor's cache: dynamo's trace and the
load only. Only graphs whose AOT wrappers do nothing are kept (every weight frozen, no input mutated outside the
graph, no output aliasing an input, no duplicated inputs); any other graph, and any entry that fails to load, takes
the full path, and a graph read back is still checked against eager on its first step (`graph_cache`).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import io
import logging
import operator
import os
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from batching.engine.torch_door.direct_call import watch_calls_of

logger = logging.getLogger(__name__)

FOLDER = "batchscope-frozen-graphs"  # inside inductor's cache folder, so clearing that clears these too
FORMAT = 1  # bumped when what an entry holds changes


@dataclass(frozen=True)
class Param:
    """A weight: AOT autograd's flat parameter `index`."""

    index: int


@dataclass(frozen=True)
class Attr:
    """A constant made earlier, or held by the graph before freezing, by name."""

    name: str


@dataclass(frozen=True)
class Call:
    """An op constant folding ran: its name (`_op_name`) and arguments, which hold steps and plain values."""

    op: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


Step = Param | Attr | Call


class Unrecordable(Exception):
    """Freezing did something a recipe cannot say; the graph is not kept."""


def _op_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"op:{target.namespace}::{target._opname}.{target._overloadname}"
    if isinstance(target, torch._ops.OpOverloadPacket):
        return f"packet:{target._qualified_op_name}"
    name = getattr(target, "__name__", None)
    if isinstance(name, str) and getattr(operator, name, None) is target:
        return f"operator:{name}"
    raise Unrecordable(f"a constant made by {target!r}")


def _resolve_op(name: str) -> Callable[..., Any]:
    kind, _, rest = name.partition(":")
    if kind == "operator":
        return getattr(operator, rest)
    if kind == "packet":
        namespace, _, op = rest.partition("::")
        return getattr(getattr(torch.ops, namespace), op)
    qualified, _, overload = rest.rpartition(".")
    namespace, _, op = qualified.partition("::")
    return getattr(getattr(getattr(torch.ops, namespace), op), overload)


@dataclass
class Recipes:
    """How each frozen constant of one graph is made, in the order freezing made them."""

    steps: list[tuple[str, Step]] = field(default_factory=list)  # (constant name, how it is made), in order
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)  # constants the graph held before freezing

    @property
    def names(self) -> set[str]:
        return {name for name, _ in self.steps}

    def record(self, gm: torch.fx.GraphModule, node: torch.fx.Node, constant: Any, params: Sequence[Any]) -> Step:
        """The step that makes `constant`, `node`'s value: a weight that replaced a placeholder, or what constant
        folding ran."""
        if node.op == "placeholder":
            index = next((i for i, param in enumerate(params) if param is constant), None)
            if index is None:
                raise Unrecordable("a placeholder replaced by a tensor that is not a weight")
            return Param(index)
        return self._describe(gm, node)

    def _describe(self, gm: torch.fx.GraphModule, node: torch.fx.Node) -> Step:
        if node.op == "get_attr":
            name = str(node.target)
            if name not in self.names and name not in self.tensors:
                value = getattr(gm, name)
                if not isinstance(value, torch.Tensor) or value.is_mkldnn or value.device.type == "meta":
                    raise Unrecordable(f"the constant {name} held before freezing")
                self.tensors[name] = value.detach().clone()
            return Attr(name)
        if node.op != "call_function":
            raise Unrecordable(f"a constant made by a {node.op} node")

        def arg(value: Any) -> Any:
            if isinstance(value, torch.fx.Node):
                return self._describe(gm, value)
            if isinstance(value, list | tuple):
                return type(value)(arg(item) for item in value)
            if isinstance(value, dict):
                return {key: arg(item) for key, item in value.items()}
            if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool | torch.Tensor):
                raise Unrecordable(f"a constant made from a {type(value).__name__}")
            return value

        return Call(_op_name(node.target), arg(tuple(node.args)), arg(dict(node.kwargs)))

    def make(self, params: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every constant, made from `params` (AOT's flat parameters of the graph being loaded), as freezing did."""
        from torch._inductor.freezing_utils import maybe_set_is_frozen_param

        made: dict[str, Any] = {}

        def run(step: Any) -> Any:
            if isinstance(step, Param):
                return params[step.index]
            if isinstance(step, Attr):
                return made[step.name] if step.name in made else self.tensors[step.name]
            if isinstance(step, Call):
                return _resolve_op(step.op)(*run(step.args), **run(step.kwargs))
            if isinstance(step, list | tuple):
                return type(step)(run(item) for item in step)
            if isinstance(step, dict):
                return {key: run(item) for key, item in step.items()}
            return step

        with torch.no_grad():
            for name, step in self.steps:
                made[name] = run(step)
                if isinstance(made[name], torch.Tensor):
                    maybe_set_is_frozen_param(made[name])
        return made


@dataclass
class Entry:
    """One graph as a later start needs it."""

    param_names: list[str]  # AOT's flat parameters, by name, in order
    inputs: int  # the graph's inputs (dynamo's placeholders)
    fx_key: str
    fx_debug_lines: list[str]
    graph_kwargs: dict[str, Any]  # what inductor compiled the graph with (its boxed values rebuilt on load)
    recipes: Recipes
    needed: list[str]  # the constants the compiled graph takes


class _Recording:
    """What one compile did, gathered by the hooks below while it runs in this thread."""

    def __init__(self) -> None:
        self.recipes = Recipes()
        self.params: list[Any] | None = None
        self.aot_inputs = 0
        self.preserved: list[int] | None = None
        self.wrapped_by: str | None = "not traced"
        self.graphs: list[tuple[Any, dict[str, Any]]] = []  # (compiled graph, its inner-compile kwargs)
        self.failure: str | None = None
        self.frozen: torch.fx.GraphModule | None = None  # the graph freezing made, its constants as attributes


stats: collections.Counter[str] = collections.Counter()  # graphs kept, and loaded from what was kept, in this process
_recording = threading.local()
_hooks_lock = threading.Lock()
_hooked = False


def _active() -> _Recording | None:
    return getattr(_recording, "current", None)


def _wrapped_by(fw_metadata: Any) -> str | None:
    """What AOT autograd's runtime wrappers do for this graph beyond calling it (None: nothing)."""
    from torch._functorch._aot_autograd.schemas import MutationType, OutputType, SubclassCreationMeta

    aliased = [o.output_type for o in fw_metadata.output_info if o.output_type != OutputType.non_alias]
    mutated = [
        i.mutation_type
        for i in fw_metadata.input_info
        if i.mutation_type not in (MutationType.NOT_MUTATED, MutationType.MUTATED_IN_GRAPH)
    ]
    checks = {
        f"outputs alias {aliased}": bool(aliased),
        "intermediate bases": fw_metadata.num_intermediate_bases != 0,
        "effect tokens": bool(fw_metadata.tokens),
        "functionalized random numbers": fw_metadata.is_rng_op_functionalized,
        f"inputs mutated outside the graph {mutated}": bool(mutated),
        "tensor subclasses": any(isinstance(meta, SubclassCreationMeta) for meta in fw_metadata.subclass_inp_meta),
    }
    return next((what for what, found in checks.items() if found), None)


def _install_hooks() -> None:
    """Wrap freezing and its constant replacement once, so a compile this thread records can say what it did."""
    global _hooked
    with _hooks_lock:
        if _hooked:
            return
        from torch._inductor import constant_folding, freezing

        original_replace = constant_folding.replace_node_with_constant
        original_freeze = freezing.freeze

        def replace(gm: Any, node: Any, constant: Any = None, name: Any = None) -> None:
            recording = _active()
            step = None
            if recording is not None and constant is not None and recording.failure is None:
                try:
                    step = recording.recipes.record(gm, node, constant, recording.params or [])
                except Exception as exc:  # recording never fails the compile: the graph is only not kept
                    recording.failure = str(exc) if isinstance(exc, Unrecordable) else f"{type(exc).__name__}: {exc}"
            before = {*gm._buffers, *gm._parameters}  # a weight is kept as a parameter
            original_replace(gm, node, constant, name)
            if step is not None and recording is not None:
                added = [key for key in (*gm._buffers, *gm._parameters) if key not in before]
                if len(added) == 1:
                    recording.recipes.steps.append((added[0], step))
                else:
                    recording.failure = f"a constant replaced under a name it already had ({node.target})"

        def freeze(dynamo_gm: Any, aot_gm: Any, example_inputs: Any) -> Any:
            recording = _active()
            if recording is None:
                return original_freeze(dynamo_gm, aot_gm, example_inputs)
            context = torch._guards.TracingContext.try_get()
            if context is None or context.params_flat_unwrap_subclasses is None or context.fw_metadata is None:
                recording.failure = "no tracing context"
                return original_freeze(dynamo_gm, aot_gm, example_inputs)
            try:
                recording.params = list(context.params_flat_unwrap_subclasses)
                recording.aot_inputs = len(aot_gm.graph.find_nodes(op="placeholder"))
                recording.wrapped_by = _wrapped_by(context.fw_metadata)
            except Exception as exc:
                recording.failure = f"{type(exc).__name__}: {exc}"
            frozen, preserved = original_freeze(dynamo_gm, aot_gm, example_inputs)
            recording.preserved = list(preserved)
            recording.frozen = frozen
            return frozen, preserved

        constant_folding.replace_node_with_constant = replace
        freezing.replace_node_with_constant = replace
        freezing.freeze = freeze  # type: ignore[assignment]
        _hooked = True


@contextlib.contextmanager
def _recording_compile(enabled: bool) -> Iterator[_Recording]:
    """A compile in this thread, recorded when `enabled` (a CPU graph, with a cache folder to keep it in)."""
    recording = _Recording()
    if not enabled:
        yield recording
        return
    _install_hooks()
    _recording.current = recording
    try:
        yield recording
    finally:
        _recording.current = None


def _aot_params(gm: torch.fx.GraphModule) -> tuple[list[str], list[torch.Tensor]]:
    """AOT autograd's flat parameters of a dynamo graph: its parameters, then its buffers (`aot_module_simplified`)."""
    named = {**dict(gm.named_parameters(remove_duplicate=False)), **dict(gm.named_buffers(remove_duplicate=False))}
    return list(named), list(named.values())


def _placeholder_values(gm: torch.fx.GraphModule) -> list[Any]:
    return [node.meta.get("example_value") for node in gm.graph.find_nodes(op="placeholder")]


def _describe_value(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor {value.dtype} {value.device} {tuple(value.shape)} {tuple(value.stride())}"
    return f"{type(value).__name__} {value}"


class FrozenGraphBackend(torch._TorchCompileInductorWrapper):
    """Inductor with `options`, as `torch.compile` makes it, keeping each graph's AOT and freezing results on disk
    (`key`: what the graphs are made for, `graph_cache.graph_cache_key`)."""

    def __init__(self, options: dict[str, Any], key: str) -> None:
        super().__init__(None, options, None)
        self.key = key

    def __call__(
        self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, config_patches: dict[str, Any] | None = None
    ) -> Callable[..., Any]:
        from torch._inductor.compile_fx import compile_fx, compile_fx_inner

        patches = {**self.config, **(config_patches or {})}
        path = self._path(gm, patches)
        if path is not None and path.is_file():
            try:
                with torch._inductor.config.patch(patches):
                    compiled = self._load(path, gm)
            except Exception as exc:  # a stale or broken entry: the full path makes it again
                logger.warning("a kept graph could not be used (%s: %s): compiled in full", type(exc).__name__, exc)
                path.unlink(missing_ok=True)
            else:
                stats["loaded"] += 1
                return compiled
        with _recording_compile(enabled=path is not None) as recording:

            def inner_compile(graph: torch.fx.GraphModule, inputs: Sequence[Any], **kwargs: Any) -> Any:
                compiled_graph = compile_fx_inner(graph, inputs, **kwargs)
                recording.graphs.append((compiled_graph, dict(kwargs)))
                watch_calls_of(compiled_graph)
                return compiled_graph

            made: Any = compile_fx(gm, example_inputs, inner_compile=inner_compile, config_patches=patches)
        if path is not None:
            try:
                self._keep(path, gm, recording)
            except Exception as exc:  # keeping is a saving for later starts, never a reason to fail this one
                logger.warning("graph not kept for later starts: %s: %s", type(exc).__name__, exc)
        return made

    def _path(self, gm: torch.fx.GraphModule, patches: dict[str, Any]) -> Path | None:
        if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
            return None
        values = _placeholder_values(gm)
        if any(isinstance(value, torch.Tensor) and value.device.type != "cpu" for value in values):
            return None  # kept for CPU graphs only (a GPU's decode graphs are replayed from CUDA graphs)
        from torch._inductor import config as inductor_config
        from torch._inductor.utils import parallel_num_threads

        digest = hashlib.sha256()
        options = {name: value for name, value in patches.items() if not callable(value)}
        names, params = _aot_params(gm)
        for part in (
            f"format {FORMAT}",
            f"torch {torch.version.__version__}",
            f"key {self.key}",
            f"options {sorted(options.items())!r}",
            # What inductor's own key holds beside the graph and is not in `options`: its whole configuration (set
            # from the environment too) and the thread count its C++ kernels were made for (a graph kept at one
            # thread, loaded at two, ran every kernel but the attention's on one thread).
            f"inductor {sorted(inductor_config.save_config_portable(ignore_private_configs=False).items())!r}",
            f"threads {parallel_num_threads()}",
            gm.code,
            *(f"{name} {_describe_value(param)}" for name, param in zip(names, params, strict=True)),
            *(_describe_value(value) for value in values),
        ):
            digest.update(part.encode())
            digest.update(b"\0")
        return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]) / FOLDER / f"{digest.hexdigest()}.pt"

    def _keep(self, path: Path, gm: torch.fx.GraphModule, recording: _Recording) -> None:
        why = self._why_not_kept(gm, recording)
        if why is not None:
            logger.info("graph not kept for later starts: %s", why)
            return
        compiled_graph, kwargs = recording.graphs[0]
        needed = sorted(set(compiled_graph.frozen_param_names.values()))
        missing = [name for name in needed if name not in recording.recipes.names]
        if missing:
            logger.info("graph not kept for later starts: no recipe for %s", missing[:3])
            return
        names, params = _aot_params(gm)
        entry = Entry(
            param_names=names,
            inputs=len(_placeholder_values(gm)),
            fx_key=compiled_graph._fx_graph_cache_key,
            fx_debug_lines=list(compiled_graph._fx_graph_cache_debug_lines or []),
            graph_kwargs={k: v for k, v in kwargs.items() if k not in ("cudagraphs", "boxed_forward_device_index")},
            recipes=recording.recipes,
            needed=needed,
        )
        # The recipes must make what freezing made, value for value, before they are trusted with a later start.
        made = entry.recipes.make(params)
        for name in needed:
            if not _same(made[name], getattr(recording.frozen, name, None)):
                logger.info("graph not kept for later starts: its constant %s was not made again exactly", name)
                return
        buffer = io.BytesIO()
        try:
            torch.save(entry, buffer)
        except Exception as exc:
            logger.info("graph not kept for later starts: %s", exc)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_bytes(buffer.getvalue())
        temporary.replace(path)
        stats["kept"] += 1

    @staticmethod
    def _why_not_kept(gm: torch.fx.GraphModule, recording: _Recording) -> str | None:
        if recording.failure is not None:
            return recording.failure
        if recording.preserved is None or recording.params is None or len(recording.graphs) != 1:
            return "not one frozen graph"
        compiled_graph, _ = recording.graphs[0]
        if getattr(compiled_graph, "_fx_graph_cache_key", None) is None or not hasattr(
            compiled_graph, "frozen_param_names"
        ):
            return "not in inductor's cache"
        _, weights = _aot_params(gm)
        if len(weights) != len(recording.params) or any(
            a is not b for a, b in zip(weights, recording.params, strict=True)
        ):
            return "AOT autograd's weights are not the graph's, in order"
        inputs = len(_placeholder_values(gm))
        params = len(recording.params)
        if recording.aot_inputs != params + inputs or recording.preserved != list(range(params, params + inputs)):
            return "AOT autograd changed the graph's inputs"
        if recording.wrapped_by is not None:
            return f"AOT autograd's wrappers handle its {recording.wrapped_by}"
        return None

    def _load(self, path: Path, gm: torch.fx.GraphModule) -> Callable[..., Any]:
        from torch._inductor.codecache import FxGraphCache
        from torch._inductor.cudagraph_utils import BoxedDeviceIndex
        from torch._inductor.output_code import CompiledFxGraphConstantsWithGm
        from torch._inductor.utils import BoxedBool

        entry = torch.load(path, weights_only=False)
        if not isinstance(entry, Entry):
            raise TypeError("not an entry")
        names, params = _aot_params(gm)
        if names != entry.param_names:
            raise ValueError("other parameters")
        inputs = _placeholder_values(gm)
        if len(inputs) != entry.inputs or any(value is None for value in inputs):
            raise ValueError("other inputs")
        made = entry.recipes.make(params)
        kept = types.SimpleNamespace(**{name: made[name] for name in entry.needed})  # what the graph holds, no more
        constants = CompiledFxGraphConstantsWithGm(kept)  # type: ignore[arg-type]
        graph, _ = FxGraphCache.load_with_key(
            entry.fx_key,
            entry.fx_debug_lines,
            inputs,
            local=True,
            remote_cache=None,
            is_backward=False,
            constants=constants,
        )
        if graph is None:
            raise LookupError("not in inductor's cache")
        graph._fx_graph_cache_key = entry.fx_key
        graph._fx_graph_cache_debug_lines = entry.fx_debug_lines
        kwargs = {
            **entry.graph_kwargs,
            "cudagraphs": BoxedBool(False),
            "boxed_forward_device_index": BoxedDeviceIndex(None),
        }
        kwargs.setdefault("is_backward", False)
        graph.post_compile(inputs, constants, kwargs)  # type: ignore[arg-type]
        watch_calls_of(graph)

        def run(*args: Any) -> Any:
            return graph(list(args))

        return run


def _same(a: Any, b: Any) -> bool:
    """Whether a constant made by a recipe is the one freezing made. Packed weights (MKL-DNN tensors) are opaque
    buffers whose padding bytes differ from one packing to the next: only their shape and dtype are compared (a
    graph loaded with a wrong one fails the check against eager on its first step, `graph_cache`)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.is_mkldnn != b.is_mkldnn or a.shape != b.shape or a.dtype != b.dtype:
            return False
        return a.is_mkldnn or bool(torch.equal(a, b))
    return bool(a == b)
