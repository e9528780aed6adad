"""What a compiled graph kept on disk is made for, and what happens when one read back cannot be trusted.

A graph read back from inductor's disk cache is made for one model: `graph_cache_key` says which (its config and a
digest of every weight), its dtype and device, torch's version, the CPU's instruction set, and a digest of the
engine's own code. Where the door to torch's internals is open, that key is part of inductor's own
(`torch_door.inductor_cache`): a graph made for anything else is a miss. Where it is closed, the weights are inputs
of the graph, not constants, and inductor's own key does.

A graph read back from the cache is checked: its first step is run eager too and the logits must agree
(`check_against_eager`). A cached graph that fails to load or disagrees is not used: the cache folder is cleared
and the graph compiled afresh (`StepCompiler._make`).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import shutil
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from batching.engine.step_forward import ran_graph

ENGINE_DIR = Path(__file__).resolve().parent
_weights: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


@functools.cache
def engine_code_digest() -> str:
    """A digest of the engine's source (every Python and C++ file of `batching/engine`): a graph made by other code
    is a miss, whatever inductor's own key says."""
    digest = hashlib.sha256()
    for path in sorted(ENGINE_DIR.rglob("*")):
        if path.suffix in (".py", ".cpp", ".h"):
            digest.update(path.relative_to(ENGINE_DIR).as_posix().encode())
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
        f"torch {torch.version.__version__}",
        f"cpu {torch.backends.cpu.get_cpu_capability()}",
        f"device {device.type} {hardware}",
        f"dtype {model.dtype}",
        f"config {model.config.to_json_string()}",
        f"weights {weights}",
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


class UntrustedGraph(RuntimeError):
    """A graph's first step disagreed with the model's own code."""


def check_against_eager(
    forward: Callable[..., Any], eager: Callable[..., Any], hits: Callable[[], int | None]
) -> Callable[..., Any]:
    """`forward` wrapped so that a call that ran a graph read from the disk cache (`hits`, the graphs read so far;
    None where that cannot be told, and every graph is compared) also runs `eager` on the same inputs and compares
    the logits: `UntrustedGraph` when they differ by more than 5% of the largest (rounding is far below that; a
    wrong graph is far above). A step writes its keys and values at fixed slots, so running it twice writes the same
    ones; models with recurrent state (which a second run would advance) are not compared."""

    def checked(model: PreTrainedModel, **inputs: Any) -> Any:
        before = hits()
        outputs = forward(model, **inputs)
        recurrent = any(getattr(value, "recurrent_states", None) is not None for value in inputs.values())
        if recurrent or not ran_graph(outputs) or (before is not None and hits() == before):
            return outputs
        expected, got = eager(model, **inputs)[0].float(), outputs[0].float()
        scale = float(expected.abs().max()) or 1.0
        if got.shape != expected.shape or not torch.allclose(got, expected, rtol=0.0, atol=0.05 * scale):
            worst = float((got - expected).abs().max()) if got.shape == expected.shape else float("nan")
            raise UntrustedGraph(f"its logits differ from eager by {worst:.3g} (largest logit {scale:.3g})")
        return outputs

    return checked


def clear_folder(folder: Path) -> None:
    """Empty a cache folder (inductor's: graphs, kernels, their builds), so a graph read from it that could not be
    trusted is compiled afresh, its kernels included."""
    for entry in list(folder.iterdir()) if folder.is_dir() else []:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
