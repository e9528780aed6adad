"""Calling a compiled step's graph without dynamo's frame, AOT's runtime wrappers and inductor's Python wrapper.

On a small model's decode step those layers are a fifth of the step's time (docs/benchmarks.md has the figures):
dynamo's frame and AOT's wrappers, and inductor's wrapper turning each symbolic size into a new tensor. The guards
are not the cost, and they still run.

How a graph comes to be called directly:
- **Capture.** One call through `torch.compile` is watched. Each compiled graph the door's backend makes
  (`CompiledFxGraph`) has its own callable wrapped (`watch_calls_of`: that one object, the class as torch made it),
  which records the flat inputs it gets: the step's tensors, and the symbolic sizes as ints.
- **Recipe.** Each tensor input is matched, by identity, to one of the step's tensors (its "roles",
  `StepInputs.roles`). Each size is matched to a dimension of the first tensor input after it: dynamo passes a new
  symbol just before the first tensor that has it. An input that cannot be matched, or matched two ways: no recipe.
- **Check.** The first calls run both ways, and their outputs and cache writes must be equal. The caller does
  this (`step_call.StepCaller._checked_direct`).

Dynamo's guards still decide (its own check of the graph's one cache entry): a step they refuse (a history
past a sliding window the graph branched on, a global flag switched) takes the normal call, which re-traces or
fails as before. Their answer is kept by the step's signature (`StepInputs.roles`: every tensor's dtype, sizes and
strides, the plans' other values), while torch's global state (the flags dynamo's guards read) stays as it was
when kept: a step's inputs are new tensors each time, and checking them afresh took 60-80 us of a 1.4 ms step.
What is skipped is dynamo's frame, its bytecode around the graph (after the graph it only resets
transformers' output-capture variable, which stays reset) and the wrappers; a graph with outputs beyond the step's
two would be replaying Python side effects, and is never called directly.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._C._dynamo.guards import GlobalStateGuard
from torch._dynamo.eval_frame import _debug_get_cache_entry_list  # no public accessor

from batching.engine.step_inputs import Signature

MAX_ADMITTED = 4096  # signatures kept per graph (a decode graph meets one per row bucket and table width)

UNWATCHED = "batchscope_unwatched"  # a watched graph's callable keeps the graph's own under this name
_watch = threading.local()  # `sink`: the list a watched call appends its graph calls to (this thread only)


def watch_calls_of(graph: Any) -> None:
    """Let a watched call see `graph` (a compiled graph the door's backend made) called, with its flat inputs: the
    graph's own callable wrapped, on this one object."""
    call = graph.current_callable
    if call is None or hasattr(call, UNWATCHED):
        return

    def watched(inputs: Sequence[Any]) -> Any:
        sink = getattr(_watch, "sink", None)
        if sink is not None:
            sink.append((graph, list(inputs)))  # before the call: inductor's entry empties the list it is given
        return call(inputs)

    setattr(watched, UNWATCHED, call)
    graph.current_callable = watched


@contextlib.contextmanager
def watching_graph_calls() -> Iterator[list[tuple[Any, list[Any]]]]:
    """Within the block, this thread's compiled graph calls are recorded: (graph, its flat inputs)."""
    sink: list[tuple[Any, list[Any]]] = []
    _watch.sink = sink
    try:
        yield sink
    finally:
        _watch.sink = None


Source = tuple[int, int]  # (role, dim): the role's tensor itself when dim is -1, else its size along dim


def recipe_for(inputs: Sequence[Any], roles: Sequence[torch.Tensor]) -> list[Source] | None:
    """Where each of a graph's flat inputs comes from among `roles`; None when one cannot be told for sure."""
    by_id = {id(tensor): index for index, tensor in enumerate(roles)}
    recipe: list[Source] = []
    pending: list[int] = []  # sizes waiting for the tensor that introduces them
    for item in inputs:
        if isinstance(item, torch.Tensor):
            role = by_id.get(id(item))
            if role is None:
                return None
            if pending:
                dims = _dims_of(pending, tuple(roles[role].shape))
                if dims is None:
                    return None
                recipe += [(role, dim) for dim in dims]
                pending = []
            recipe.append((role, -1))
        elif isinstance(item, int) and not isinstance(item, bool):
            pending.append(item)
        else:
            return None
    return None if pending else recipe


def _dims_of(sizes: list[int], shape: tuple[int, ...]) -> list[int] | None:
    """The dimensions of `shape` that `sizes` are, in order (dynamo makes a tensor's symbols in dimension order); None
    unless exactly one choice fits."""
    choices: list[list[int]] = []

    def extend(chosen: list[int], start: int) -> None:
        if len(choices) > 1:
            return
        if len(chosen) == len(sizes):
            choices.append(chosen)
            return
        for dim in range(start, len(shape)):
            if shape[dim] == sizes[len(chosen)]:
                extend([*chosen, dim], dim + 1)

    extend([], 0)
    return choices[0] if len(choices) == 1 else None


def graph_guards(forward: Callable[..., object]) -> Any | None:
    """Dynamo's guards of a compiled function's graph (`check(f_locals)`), when it has exactly one graph."""
    function = getattr(forward, "_torchdynamo_orig_callable", None)
    code = getattr(function, "__code__", None)
    if code is None:
        return None
    entries = _debug_get_cache_entry_list(code)
    return entries[0].guard_manager if len(entries) == 1 else None


@dataclass
class DirectCall:
    """A compiled graph, its guards and the recipe of its inputs: call it with the step's roles, in the runner's
    order."""

    graph_call: Callable[[list[Any]], Sequence[torch.Tensor]]
    guards: Any  # dynamo's guard manager of the graph: `check({"model": ..., "inputs": {...}})`
    recipe: list[Source]
    roles: int  # how many roles the recipe was made for
    _sizes: threading.local = field(default_factory=threading.local)
    _admitted: set[Hashable] = field(default_factory=set)  # (model, cache, signature) the guards accepted
    _state: Any = None  # dynamo's snapshot of torch's global state while `_admitted` was filled

    @classmethod
    def of(
        cls, forward: Callable[..., object], graph: Any, inputs: Sequence[Any], roles: Sequence[torch.Tensor]
    ) -> DirectCall | None:
        """The direct call of `forward`'s graph, seen called with `inputs`; None when it cannot be made safely."""
        recipe = recipe_for(inputs, roles)
        call = getattr(graph, "current_callable", None)
        call = getattr(call, UNWATCHED, call)  # past the watch (`watch_calls_of`)
        guards = graph_guards(forward)
        if recipe is None or call is None or guards is None:
            return None
        return cls(call, guards, recipe, len(roles))

    def admits(self, model: object, inputs: dict[str, Any], cache: object, signature: Signature) -> bool:
        """Whether dynamo's guards accept this call (the frame's locals of `compiled._run_model`; `cache` is the
        object among them that lives on, `signature` what the guards can read of the rest): asked once per
        signature while torch's global state and its function modes stay as they were."""
        key = (id(model), id(cache), torch._C._len_torch_function_stack(), signature)
        state = self._state
        if state is not None and key in self._admitted and state.check():
            return True
        if not self.guards.check({"model": model, "inputs": inputs}):
            return False
        if state is None or not state.check() or len(self._admitted) >= MAX_ADMITTED:
            self._admitted = set()
            self._state = GlobalStateGuard()
        self._admitted.add(key)
        return True

    def __call__(self, roles: Sequence[torch.Tensor]) -> Sequence[torch.Tensor]:
        sizes, size_tensors = self._size_buffers()
        args: list[Any] = []
        for index, (role, dim) in enumerate(self.recipe):
            if dim < 0:
                args.append(roles[role])
            else:
                # Inductor's C++ entry reads a size from a one-element tensor: written in place, not made anew.
                sizes[index] = roles[role].shape[dim]
                args.append(size_tensors[index])
        return self.graph_call(args)

    def _size_buffers(self) -> tuple[Any, list[torch.Tensor]]:
        """This thread's sizes: one int64 tensor's numpy view to write, and a 0-d view of each element to pass."""
        buffers = getattr(self._sizes, "buffers", None)
        if buffers is None:
            sizes = torch.zeros(len(self.recipe), dtype=torch.int64)
            buffers = self._sizes.buffers = (sizes.numpy(), [sizes[i] for i in range(len(self.recipe))])
        return buffers
