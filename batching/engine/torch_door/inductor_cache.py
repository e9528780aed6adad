"""Inductor's disk cache for the door's graphs: what a graph kept there was made for, and frozen graphs that hold
MKL-DNN packed weights let into it.

Inductor keeps each compiled graph (its C++ wrapper and kernels) in its FX graph cache, under a key of the traced
graph, its config and torch's own source. A frozen graph's weights are constants of the graph: the key describes
them by shape and dtype only, and a graph loaded from the cache takes their values from the graph being compiled;
constants the lowering derives from them (the C++ GEMM templates' packed weights) are stored with the graph. So a
graph cached for one model would be loaded for another of the same shapes, with the first one's packed weights.
`GraphCacheKey`, a pass that changes nothing, puts what the graph was made for (`graph_cache.graph_cache_key`) into
that key: a graph made for anything else is a miss, and is compiled.

Inductor bypassed its cache for our graphs ("mkldnn tensors unpickleable": freezing packs the linear layers'
weights for MKL-DNN), so until `cache_frozen_mkldnn_weights` every start compiled every graph again. A second start
traces the step with dynamo, then takes the rest from the disk: what AOT autograd and freezing made
(`frozen_graphs`, as AOT autograd's own cache is off for frozen graphs), and the lowering, the C++ builds and the
kernels' timing from inductor's cache.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch._dynamo.utils import counters
from torch._inductor import codecache
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch._inductor.freezing_utils import is_frozen_param
from torch._inductor.runtime.cache_dir_utils import cache_dir


class GraphCacheKey(CustomGraphPass):
    """A post-grad pass that changes nothing: inductor adds its `uuid` to the FX graph cache key of every graph it
    is given to, so a graph cached for another model, dtype, torch, CPU or engine code is never loaded."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __call__(self, graph: torch.fx.graph.Graph) -> None:
        return None

    def uuid(self) -> str:
        return self.key


def cache_frozen_mkldnn_weights() -> None:
    """Let inductor keep on disk a frozen graph that holds MKL-DNN packed weights (once per process).

    Freezing packs each linear layer's weight for MKL-DNN (and the C++ GEMM templates that the autotuner picks are
    offered only then); the packed weights are constants of the graph that cannot be pickled, so inductor bypassed
    its cache for every such graph and each start compiled again. It never needs to pickle them: they are frozen
    parameters, which a cached graph does not store but takes from the graph being compiled when it is loaded (the
    start's own freezing packs them again), and which its key describes by shape only. This lets its check and its
    key do for packed weights what they do for other frozen ones; `GraphCacheKey` adds the weights' digest. The
    constants a cached graph does store (the C++ templates' packed weights) are written as raw bytes
    (`_StoragePickler`).
    """
    validator, pickler = codecache.CacheabilityValidator, codecache.FxGraphCachePickler
    check_tensor, reduce_tensor = validator.check_tensor, pickler._reduce_tensor
    if getattr(check_tensor, "batchscope", False):
        return

    def check_frozen_mkldnn(tensor: torch.Tensor) -> None:
        if not (tensor.is_mkldnn and is_frozen_param(tensor)):
            check_tensor(tensor)

    def reduce_frozen_mkldnn(self: Any, tensor: torch.Tensor) -> Any:
        if tensor.is_mkldnn and is_frozen_param(tensor):
            return (codecache._ident, (("frozen mkldnn", str(tensor.dtype), tuple(tensor.shape)),))
        return reduce_tensor(self, tensor)

    check_frozen_mkldnn.batchscope = True  # type: ignore[attr-defined]
    validator.check_tensor = staticmethod(check_frozen_mkldnn)  # type: ignore[method-assign,assignment]
    pickler._reduce_tensor = reduce_frozen_mkldnn  # type: ignore[method-assign,assignment]
    codecache.pickle = _GraphPickle()  # type: ignore[assignment]


class _StoragePickler(pickle.Pickler):
    """Pickles a CPU tensor's storage as its raw bytes, out of torch's legacy format, which took 9.3 s to read back
    the 1.44 GB of packed weights a 0.5B-shaped decode graph from the C++ templates holds (6.5 ms a MB; these load in
    about a tenth of that). Every other object as pickle does."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.storage.TypedStorage) and obj._untyped_storage.device.type == "cpu":
            raw = torch.empty(0, dtype=torch.uint8).set_(obj._untyped_storage)
            return _storage_from_bytes, (pickle.PickleBuffer(raw.numpy().data), obj.dtype)
        return NotImplemented


def _storage_from_bytes(data: bytearray, dtype: torch.dtype) -> torch.storage.TypedStorage:
    """A storage pickled by `_StoragePickler`: its bytes as read back (a writable copy), shared, not copied again."""
    untyped = torch.frombuffer(data, dtype=torch.uint8).untyped_storage() if data else torch.UntypedStorage(0)
    return torch.storage.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)


class _GraphPickle:
    """What inductor's cache module calls `pickle`: graphs dumped with `_StoragePickler`, everything else as is."""

    def __getattr__(self, name: str) -> Any:
        return getattr(pickle, name)

    @staticmethod
    def dumps(obj: Any, protocol: int | None = None, **kwargs: Any) -> bytes:
        # Protocol 5 whatever is asked: the storages' bytes go in as buffers, read back as writable bytearrays.
        buffer = io.BytesIO()
        _StoragePickler(buffer, protocol=5, **kwargs).dump(obj)
        return buffer.getvalue()


def cache_hits() -> int:
    """FX graphs read from inductor's disk cache so far in this process."""
    return int(counters["inductor"]["fxgraph_cache_hit"])


def cache_misses() -> int:
    """FX graphs inductor looked for in its disk cache and compiled, so far in this process."""
    return int(counters["inductor"]["fxgraph_cache_miss"])


def cache_folder() -> Path:
    """Inductor's cache folder, where it reads and writes now (its default where no folder was set)."""
    return Path(cache_dir())
