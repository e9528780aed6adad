"""Compiled steps through torch's public APIs only (`torch_gate.CompileRoute`): where the door to its internals is
closed (any torch but the checked one, or the setting off), on any torch that has `torch.compile` and
`torch.compiler.set_stance`.

What it gives up against the door (`torch_door.route`; measured in docs/engine.md):
- the weights stay inputs of the graph, not frozen constants (freezing needs dynamo's private `prepare_freezing`
  while tracing), so the C++ GEMM templates, which need constant weights, are not offered;
- sizes cannot be marked symbolic one by one (`mark_dynamic` is dynamo's, and `dynamic=True` makes every size
  symbolic, a model's head count too, which duck shaping then merges with any step size equal to it at the trace,
  and specialises): the graph is traced once as it comes, then once more with other rows and columns (`warmup`),
  and dynamo's automatic dynamic shapes make symbolic what differed. Two graphs where the door makes one;
- inductor's own disk cache keeps the graphs (weights as inputs are not part of its key, and nothing is derived
  from them), but dynamo traces and AOT autograd runs again at each start, and which graphs were read from the cache
  cannot be told: every graph's first step is compared with eager (`graph_cache.check_against_eager`);
- steps run the graphs in the stance `eager_on_recompile` (a step the guards refuse runs eager, never compiles,
  never takes dynamo's compile lock); the stance is one global for every thread, so a thread making a graph that
  enters its compile while a step holds the stance runs that call eager, and calls again (`making`);
- no graph is called directly: every step goes through `torch.compile`'s entry.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from batching.engine.direct_path import DirectGraph
from batching.engine.graph_cache import clear_folder
from batching.engine.step_forward import ran_graph

# Inductor's options that only mean something with the weights frozen into the graph.
FROZEN_ONLY = ("freezing",)
MAKE_TRIES = 100  # calls of a graph-making step that met a step's stance, before the call is left eager
STANCE_WAIT_S = 0.01
_stance = threading.Lock()  # one step at a time sets the global stance and restores it

Dims = Sequence[tuple[torch.Tensor, int]]


class PublicRoute:
    """The public route: see the module's docstring."""

    name = "public torch APIs"
    frozen_weights = False
    marks_sizes = False

    def compile(
        self, run: Callable[..., object], options: dict[str, Any], model: PreTrainedModel
    ) -> Callable[..., object]:
        public = {name: value for name, value in options.items() if name not in FROZEN_ONLY}
        return torch.compile(run, fullgraph=True, dynamic=None, options=public)

    def graphs_only(self, forward: Callable[..., object]) -> Callable[..., object]:
        def run_only(*args: Any, **kwargs: Any) -> object:
            with _stance, torch.compiler.set_stance("eager_on_recompile"):
                return forward(*args, **kwargs)

        return run_only

    def making(self, forward: Callable[..., object]) -> Callable[..., object]:
        def until_traced(*args: Any, **kwargs: Any) -> object:
            outputs: Any = None
            for _ in range(MAKE_TRIES):
                outputs = forward(*args, **kwargs)
                if ran_graph(outputs):
                    break
                time.sleep(STANCE_WAIT_S)  # a step's stance met at the entry: that call ran eager
            return outputs

        return until_traced

    def tracing(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def mark_dynamic(self, dynamic: Dims, maybe_dynamic: Dims) -> None:
        """Nothing: a second trace of other sizes makes them symbolic (`marks_sizes`)."""

    def cache_hits(self) -> int | None:
        return None

    def clear_cache(self) -> None:
        """Empty the cache folder the engine gave inductor (`compiled.use_compile_cache`); inductor's default folder,
        where none was given, is left as it is."""
        folder = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        if folder:
            clear_folder(Path(folder))

    def forget(self, forward: Callable[..., object]) -> bool:
        return False

    def direct_calls(self, device: torch.device) -> bool:
        return False

    def watching(self) -> contextlib.AbstractContextManager[list[tuple[Any, list[Any]]]]:
        return contextlib.nullcontext([])

    def direct_call(
        self, forward: Callable[..., object], seen: list[tuple[Any, list[Any]]], roles: Sequence[torch.Tensor]
    ) -> DirectGraph | None:
        return None
