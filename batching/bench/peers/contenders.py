"""The race's peers: which are installed (one that is not is said on stderr and left out of the race), checked
against the model before anything runs, and started sized like our batcher (slots, token budget, threads).

transformers' continuous batching runs on its own instance of the model; llama.cpp's server on a GGUF copy;
vLLM's server on the model's own folder, from its own environment, or one already running (`--vllm-url`), which is
raced as it is: neither started, paused nor counted in the CPU time.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from batching.bench.options import BadInput, load
from batching.bench.peers.gguf_convert import GGUFConversionError, check_convertible, convert
from batching.bench.peers.hf_peer import HFPeer
from batching.bench.peers.llamacpp_peer import NOT_INSTALLED, LlamaCppError, LlamaCppPeer, LlamaCppSettings, find_server
from batching.bench.peers.vllm_peer import VllmPeer
from batching.bench.peers.vllm_server import NOT_INSTALLED as VLLM_NOT_INSTALLED
from batching.bench.peers.vllm_server import VllmNotFoundError, VllmSettings, find_python, vllm_server
from batching.bench.plan import Inputs, Peer, Plan
from batching.engine.batcher import eos_token_ids
from batching.remote.endpoint import RemoteError, fetch_model, local_endpoint, parse_url
from config.settings import Settings
from model.loader import LoadedModel


@dataclass(frozen=True)
class PeerServers:
    """How the race reaches its peers' servers (None: that peer is not in the race): llama.cpp's command, vLLM's
    Python to start one, or the URL of a vLLM server already running."""

    llamacpp: tuple[str, ...] | None = None
    vllm_python: Path | None = None
    vllm_url: str | None = None


def find_llamacpp(args: argparse.Namespace, inputs: Inputs) -> tuple[Inputs, PeerServers]:
    """The command that starts llama.cpp's server; when it is not installed, say so and drop the mode."""
    if "llamacpp" not in inputs.modes:
        return inputs, PeerServers()
    try:
        command = find_server(args.llama_server)
    except LlamaCppError as exc:
        raise BadInput(str(exc)) from None
    if command is not None:
        try:
            import gguf  # noqa: F401  (the converter's package, part of the same optional install)
        except ImportError:
            command = None
    if command is not None:
        return inputs, PeerServers(llamacpp=tuple(command))
    return _without(inputs, "llamacpp", NOT_INSTALLED, "llama.cpp"), PeerServers()


def find_vllm(
    args: argparse.Namespace, settings: Settings, inputs: Inputs, found: PeerServers
) -> tuple[Inputs, PeerServers]:
    """A running vLLM's URL (`--vllm-url`), else the Python of vLLM's environment (flag, else setting, else the
    default install); when vLLM is not installed, say so and drop the mode."""
    if "vllm" not in inputs.modes:
        return inputs, found
    if args.vllm_url:
        try:
            return inputs, replace(found, vllm_url=parse_url(args.vllm_url))
        except RemoteError as exc:
            raise BadInput(f"--vllm-url {exc}") from None
    try:
        python = find_python(args.vllm_python or settings.peers.vllm_python)
    except VllmNotFoundError as exc:
        raise BadInput(str(exc)) from None
    if python is not None:
        return inputs, replace(found, vllm_python=python)
    return _without(inputs, "vllm", VLLM_NOT_INSTALLED, "vLLM"), found


def _without(inputs: Inputs, mode: str, message: str, name: str) -> Inputs:
    """The inputs less a peer that is not installed, after saying so on stderr."""
    print(message, file=sys.stderr)
    modes = tuple(other for other in inputs.modes if other != mode)
    if not modes:
        raise BadInput(f"--modes has no mode left to run without {name}")
    return replace(inputs, modes=modes)


def check_llamacpp(found: PeerServers, loaded: LoadedModel) -> None:
    """BadInput for a model llama.cpp's copy cannot be made of, before anything runs."""
    if found.llamacpp is not None:
        try:
            check_convertible(loaded.model)
        except GGUFConversionError as exc:
            raise BadInput(f"llamacpp: {exc}") from None


def vllm_settings(loaded: LoadedModel, plan: Plan) -> VllmSettings:
    """vLLM's server on the model's own folder, sized like our batcher: slots, token budget, threads, dtype;
    BadInput for a model it cannot be given here (checked before anything runs)."""
    folder = Path(loaded.model.name_or_path or ".")
    if not (folder / "config.json").is_file():
        raise BadInput(f"vllm: the model must be a local folder (vLLM runs offline here), not {loaded.name!r}")
    if loaded.device.type != "cpu":
        raise BadInput(f"vllm: this is vLLM's CPU build; run the benchmark with --device cpu, not {loaded.device}")
    return VllmSettings(
        model=str(folder),
        served_name=loaded.name,
        slots=plan.options.max_batch_size,
        batch_tokens=plan.options.max_batched_tokens,
        max_model_len=_longest(plan),
        threads=torch.get_num_threads(),
        # vLLM's GPTQ kernels on a CPU take bfloat16 activations only (float32 is refused at start).
        dtype="bfloat16" if loaded.weights.quantized else str(loaded.dtype).removeprefix("torch."),
    )


def start_peers(
    stack: contextlib.ExitStack,
    args: argparse.Namespace,
    settings: Settings,
    planned: tuple[Plan, LoadedModel],
    found: PeerServers,
    vllm: VllmSettings | None,
) -> dict[str, Peer]:
    """Every peer the plan runs, started on `stack` (stopped when it closes); vLLM's server from `vllm`."""
    plan, loaded = planned
    peers: dict[str, Peer] = {}
    if "hf" in plan.modes:
        peers["hf"] = stack.enter_context(start_hf(args, settings, plan))
    if found.llamacpp is not None:
        log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-llamacpp-")))
        extra = shlex.split(args.llamacpp_args)
        weights = llamacpp_weights(args.llamacpp_weights, loaded)
        llamacpp = start_llamacpp(loaded, plan, list(found.llamacpp), extra, log_dir, weights)
        peers["llamacpp"] = stack.enter_context(llamacpp)
    if found.vllm_url is not None:
        try:
            served = fetch_model(local_endpoint(found.vllm_url))
        except RemoteError as exc:
            raise BadInput(f"--vllm-url: {exc}") from None
        peers["vllm"] = VllmPeer(found.vllm_url, served, plan.options.max_batch_size)
    elif found.vllm_python is not None and vllm is not None:
        log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-vllm-")))
        server = stack.enter_context(vllm_server(found.vllm_python, vllm, log_dir / "vllm-server.log"))
        peers["vllm"] = VllmPeer(server.url, loaded.name, plan.options.max_batch_size, server)
    return peers


def start_hf(args: argparse.Namespace, settings: Settings, plan: Plan) -> HFPeer:
    """transformers' continuous batching on its own model instance (it leaves state on the model it runs)."""
    own = load(args, settings)
    return HFPeer(
        own.model,
        own.tokenizer,
        batch_size=plan.options.max_batch_size,
        max_batched_tokens=plan.options.max_batched_tokens,
        max_len=_longest(plan),
        eos_ids=eos_token_ids(own.model, own.tokenizer),
    )


def llamacpp_weights(choice: str, loaded: LoadedModel) -> str:
    """The GGUF format of llama.cpp's copy: as chosen, or (auto) Q4_0 beside our 4-bit weights, else F32."""
    if choice != "auto":
        return choice
    return "q4_0" if loaded.weights.precision.startswith("4-bit") else "f32"


def start_llamacpp(
    loaded: LoadedModel, plan: Plan, command: list[str], extra: list[str], log_dir: Path, weights: str = "f32"
) -> LlamaCppPeer:
    """llama.cpp's server on a GGUF copy of the model (converted once, then cached), sized like our batcher."""
    settings = LlamaCppSettings(
        model=convert(loaded.model, loaded.tokenizer, weights=weights),
        slots=plan.options.max_batch_size,
        context_per_slot=_longest(plan),
        threads=torch.get_num_threads(),
        batch_tokens=plan.options.max_batched_tokens,
        extra=tuple(extra),
    )
    return LlamaCppPeer(command, settings, loaded.tokenizer, log_dir)


def _longest(plan: Plan) -> int:
    """The longest request of the plan, prompt and cap: every slot of a peer must hold it whole."""
    return max(len(ids) + cap for ids, cap in zip(plan.prompt_ids, plan.caps, strict=True))
