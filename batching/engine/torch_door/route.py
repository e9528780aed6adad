"""Compiled steps through torch's internals (`torch_gate.CompileRoute`), on the torch they were checked on only.

What each piece buys over the public route (`public_route`), measured in docs/engine.md:
- dynamo's run-only mode (`torch._dynamo.run`): a step the graphs' guards refuse runs eager without taking dynamo's
  compile lock, per call (the public stance is one global for every thread);
- the weights frozen into the graph (dynamo's `prepare_freezing` while tracing): packed once, folded as constants;
- sizes marked symbolic one by one (`mark_dynamic`), without duck shaping (rows and blocks equal at the trace must
  not become one symbol): one graph for every decode step;
- what AOT autograd and freezing made kept on disk (`frozen_graphs`), frozen graphs let into inductor's cache
  (`inductor_cache`): a second start traces with dynamo only;
- a ready graph called directly (`direct_call`), without dynamo's frame and AOT's and inductor's wrappers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch._dynamo
import torch.fx.experimental._config as fx_config
from transformers import PreTrainedModel

from batching.engine.direct_path import DirectGraph
from batching.engine.graph_cache import clear_folder, graph_cache_key
from batching.engine.torch_door.direct_call import DirectCall, watching_graph_calls
from batching.engine.torch_door.frozen_graphs import FrozenGraphBackend
from batching.engine.torch_door.inductor_cache import (
    GraphCacheKey,
    cache_folder,
    cache_frozen_mkldnn_weights,
    cache_hits,
)

Dims = Sequence[tuple[torch.Tensor, int]]


class InternalRoute:
    """The door's route: see the module's docstring."""

    name = "torch internals"
    frozen_weights = True
    marks_sizes = True

    def compile(
        self, run: Callable[..., object], options: dict[str, Any], model: PreTrainedModel
    ) -> Callable[..., object]:
        """`torch.compile(run, fullgraph=True, dynamic=None, options=options)`, with inductor as its backend keeping
        what AOT autograd and freezing made for a later start (`frozen_graphs`), and the model's key in inductor's."""
        key = graph_cache_key(model)
        options = {**options, "post_grad_custom_post_pass": GraphCacheKey(key)}
        cache_frozen_mkldnn_weights()
        guard_filter_fn = options.pop("guard_filter_fn")
        backend = FrozenGraphBackend(options, key)
        return torch._dynamo.optimize(backend=backend, nopython=True, dynamic=None, guard_filter_fn=guard_filter_fn)(
            run
        )

    def graphs_only(self, forward: Callable[..., object]) -> Callable[..., object]:
        return torch._dynamo.run(forward)

    def making(self, forward: Callable[..., object]) -> Callable[..., object]:
        return forward

    @contextlib.contextmanager
    def tracing(self) -> Iterator[None]:
        # Freezing folds the weights into the graph only if dynamo records them as the model's parameters.
        # No duck shaping: rows and blocks equal when the graph is traced (4 and 4) must not become one symbol.
        with torch._dynamo.config.patch(prepare_freezing=True), fx_config.patch(use_duck_shape=False):  # type: ignore[attr-defined]
            yield

    def mark_dynamic(self, dynamic: Dims, maybe_dynamic: Dims) -> None:
        for tensor, dim in dynamic:
            torch._dynamo.mark_dynamic(tensor, dim)
        for tensor, dim in maybe_dynamic:
            torch._dynamo.maybe_mark_dynamic(tensor, dim)

    def cache_hits(self) -> int | None:
        return cache_hits()

    def clear_cache(self) -> None:
        clear_folder(cache_folder())

    def forget(self, forward: Callable[..., object]) -> bool:
        code = getattr(getattr(forward, "_torchdynamo_orig_callable", None), "__code__", None)
        if code is not None:
            torch._dynamo.reset_code(code)
        return True

    def direct_calls(self, device: torch.device) -> bool:
        # A GPU's graphs have Python wrappers, and decode steps there replay CUDA graphs instead (`cuda_graphs`).
        return device.type == "cpu"

    def watching(self) -> contextlib.AbstractContextManager[list[tuple[Any, list[Any]]]]:
        return watching_graph_calls()

    def direct_call(
        self, forward: Callable[..., object], seen: list[tuple[Any, list[Any]]], roles: Sequence[torch.Tensor]
    ) -> DirectGraph | None:
        return DirectCall.of(forward, *seen[0], roles) if len(seen) == 1 else None
