"""What a compiled graph kept on disk was made for, and what happens when one read back cannot be trusted.

Inductor keeps each compiled graph (its C++ wrapper and kernels) in its FX graph cache, under a key of the traced
graph, its config and torch's own source. A frozen graph's weights are constants of the graph: the key describes
them by shape and dtype only, and a graph loaded from the cache takes their values from the graph being compiled;
constants the lowering derives from them (the C++ GEMM templates' packed weights) are stored with the graph. So a
graph cached for one model would be loaded for another of the same shapes, with the first one's packed weights.
`GraphCacheKey`, a pass that changes nothing, puts what the graph was made for into that key: the model (its
config and a digest of every weight), its dtype and device, torch's version, the CPU's instruction set, and a
digest of the engine's own code. A graph made for anything else is a miss, and is compiled.

Inductor bypassed its cache for our graphs ("mkldnn tensors unpickleable": freezing packs the linear layers'
weights for MKL-DNN), so until `cache_frozen_mkldnn_weights` every start compiled every graph again. A second start
traces the step with dynamo, then takes the rest from the disk: what AOT autograd and freezing made
(`frozen_graphs`, as AOT autograd's own cache is off for frozen graphs), and the lowering, the C++ builds and the
kernels' timing from inductor's cache.

A graph read back from the cache is checked: its first step is run eager too and the logits must agree
(`check_against_eager`). A cached graph that fails to load or disagrees is not used: the cache folder is cleared
and the graph compiled afresh (`StepCompiler._make`).
"""

from __future__ import annotations

import functools
import hashlib
import io
import itertools
import pickle
import shutil
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch._dynamo.utils import counters
from torch._inductor.custom_graph_pass import CustomGraphPass
from transformers import PreTrainedModel

ENGINE_DIR = Path(__file__).resolve().parent
_weights: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


class GraphCacheKey(CustomGraphPass):
    """A post-grad pass that changes nothing: inductor adds its `uuid` to the FX graph cache key of every graph it
    is given to, so a graph cached for another model, dtype, torch, CPU or engine code is never loaded."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __call__(self, graph: torch.fx.graph.Graph) -> None:
        return None

    def uuid(self) -> str:
        return self.key


@functools.cache
def engine_code_digest() -> str:
    """A digest of the engine's source (every Python and C++ file of `batching/engine`): a graph made by other code
    is a miss, whatever inductor's own key says."""
    digest = hashlib.sha256()
    for path in sorted(ENGINE_DIR.iterdir()):
        if path.suffix in (".py", ".cpp", ".h"):
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def weights_digest(model: torch.nn.Module) -> str:
    """A digest of every parameter's and buffer's name, shape, dtype and values (`torch.hash_tensor`, one pass over
    the weights: 0.7 s for 2 GB here)."""
    digest = hashlib.sha256()
    for name, tensor in itertools.chain(model.named_parameters(), model.named_buffers()):
        digest.update(f"{name} {tuple(tensor.shape)} {tensor.dtype}\n".encode())
        if tensor.numel():
            value = int(torch.hash_tensor(tensor.detach()).view(torch.int64).item())  # its 64 bits, signed
            digest.update(value.to_bytes(8, "little", signed=True))
    return digest.hexdigest()


def graph_cache_key(model: PreTrainedModel) -> str:
    """What a graph of `model` is made for (see the module's docstring); its weights are read once per model."""
    with _lock:
        weights = _weights.get(model)
        if weights is None:
            weights = _weights[model] = weights_digest(model)
    device = model.device
    hardware = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    parts = [
        f"engine {engine_code_digest()}",
        f"torch {torch.__version__}",
        f"cpu {torch.backends.cpu.get_cpu_capability()}",
        f"device {device.type} {hardware}",
        f"dtype {model.dtype}",
        f"config {model.config.to_json_string()}",
        f"weights {weights}",
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


# Inductor's internals patched by `cache_frozen_mkldnn_weights` were read on torch 2.13 (CPU build) only.
CHECKED_TORCH = "2.13"


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
    if not torch.__version__.startswith(CHECKED_TORCH):  # before reading them: other builds lack some (2.11 did)
        return
    from torch._inductor import codecache
    from torch._inductor.freezing_utils import is_frozen_param

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


def clear_cache() -> Path:
    """Empty inductor's cache folder (graphs, kernels, their builds), so a graph read from it that could not be
    trusted is compiled afresh, its kernels included; returns the folder."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir  # inductor's: where it reads and writes now

    folder = Path(cache_dir())
    for entry in list(folder.iterdir()) if folder.is_dir() else []:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
    return folder


class UntrustedGraph(RuntimeError):
    """A graph's first step disagreed with the model's own code."""


def check_against_eager(forward: Callable[..., Any], eager: Callable[..., Any]) -> Callable[..., Any]:
    """`forward` wrapped so that a call that read a graph from the disk cache also runs `eager` on the same inputs
    and compares the logits: `UntrustedGraph` when they differ by more than 5% of the largest (rounding is far
    below that; a wrong graph is far above). A step writes its keys and values at fixed slots, so running it twice
    writes the same ones; models with recurrent state (which a second run would advance) are not compared."""

    def checked(model: PreTrainedModel, **inputs: Any) -> Any:
        hits = cache_hits()
        outputs = forward(model, **inputs)
        recurrent = any(getattr(value, "recurrent_states", None) is not None for value in inputs.values())
        if cache_hits() == hits or recurrent:
            return outputs
        expected, got = eager(model, **inputs)[0].float(), outputs[0].float()
        scale = float(expected.abs().max()) or 1.0
        if got.shape != expected.shape or not torch.allclose(got, expected, rtol=0.0, atol=0.05 * scale):
            worst = float((got - expected).abs().max()) if got.shape == expected.shape else float("nan")
            raise UntrustedGraph(f"its logits differ from eager by {worst:.3g} (largest logit {scale:.3g})")
        return outputs

    return checked
