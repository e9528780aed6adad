"""Attention read through the block tables: each query's keys and values where they lie in the pool, its own row's
columns only, with no gathered copy. A decode row is one query; a prompt chunk's tokens are a query each (the
runner gives each its row's table and its own column: causal by construction).

The gathered path (`kv_cache.gather_blocks`, then batched matmuls) copies every row's blocks up to the step's
longest row into one tensor and attends over all of it, masked: a row of 40 tokens beside one of 400 reads 400
columns, and every column is read three times (the copy's read and write, then the matmul). Measured on the
embedded model's shape (8 rows, 2 key heads of 32, 1 thread, one layer): 9 against 59 us at 20 cached tokens,
22 against 259 us when one row holds 300 tokens and the others 40-180, 45 against 249 at 300 each.

Where the CPU has AVX-512 (and for head sizes 32, 64 and 128 in blocks of 16) every pass is written in 16-wide
vectors: a block's keys are transposed in registers so each query's 16 scores are multiply-adds, the softmax's
exponentials are a polynomial and one `scalef`, and each column's values are loaded once for several query heads.
That took the layer above from 21, 82 and 172 us (the same loops left to the compiler's vectoriser, which is what
other CPUs and sizes still run).

A small C++ operator (`batchscope::paged_decode`, its source in `paged_decode.cpp` beside this file), built once per
machine with torch's extension builder into torch's extension cache, in the background thread that makes the
compiled graphs (about 15 s here), never in a step, for the instruction sets torch found on the CPU, which the
build's name carries (`build_target`). It is a real operator with a fake (shape-only) implementation, so a
compiled decode graph calls it like any other. Float32 on the CPU only, and only for model families whose attention
takes the cache's keys and values as the cache returns them, with no logit soft-capping or sinks (`supports`);
everything else keeps the gathered path.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import PreTrainedModel

try:
    import fcntl
except ImportError:  # not POSIX
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

# Families whose attention layers hand what the cache returns straight to the attention function, without soft-capped
# logits or sinks: checked token for token with `generate` by the families matrix (tests/engine/test_families.py).
FAMILIES = frozenset({"llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "granite", "smollm3", "olmo2", "starcoder2"})

SOURCE = Path(__file__).with_suffix(".cpp")
# `-fno-math-errno` lets `floor` vectorise (no effect on results). `-fopenmp`: `at::parallel_for` is a header
# template over OpenMP; the build then needs `libgomp.so.1`, which is torch's own (already loaded, same soname), so
# the operator's threads are torch's (`torch.set_num_threads`).
_FLAGS = ["-O3", "-fopenmp", "-fno-math-errno"]
# The instruction sets a build may use, by torch's name for the CPU's (`build_target`): exactly what torch's own
# kernels for that capability are compiled with and checked for (AVX-512 F, BW, VL and DQ with FMA; AVX2 with FMA),
# 512-bit vectors preferred where there are some. Any other capability (none of these, another architecture) gets
# the compiler's default for the architecture.
_TARGETS = {
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-mprefer-vector-width=512"],
    "AVX2": ["-mavx2", "-mfma"],
}
_NAME = "batchscope_paged_decode"
_lock = threading.Lock()
_state: dict[str, bool] = {}  # "loaded": the operator is registered in this process; "failed": it cannot be


def supports(model: PreTrainedModel) -> bool:
    """Whether this model's steps may read through the tables (once the operator is loaded)."""
    config = model.config.get_text_config()
    return (
        model.device.type == "cpu"
        and model.dtype == torch.float32
        and config.model_type in FAMILIES
        and getattr(config, "attn_logit_softcapping", None) is None
    )


def build_target(capability: str | None = None) -> tuple[str, list[str]]:
    """The extension's name and compiler flags for a CPU of `capability` (torch's name for it, this CPU's by default):
    the name says which instruction sets the build holds, and a digest of the source and flags, so an extension
    cache shared between machines (a home folder on NFS, a CI cache, a container volume) never hands one CPU a build
    made for another's (`-march=native`, as it was, put AVX-512 in a build that another CPU then loaded: SIGILL).

    torch's capability is the one its own kernels are chosen by (`ATEN_CPU_CAPABILITY` lowers it)."""
    capability = (capability or torch.backends.cpu.get_cpu_capability()).upper()
    isa = capability if capability in _TARGETS else "BASE"
    flags = _FLAGS + _TARGETS.get(isa, [])
    digest = hashlib.sha256("\0".join([SOURCE.read_text(), *flags]).encode()).hexdigest()[:12]
    return f"{_NAME}_{isa.lower()}_{digest}", flags


def load() -> bool:
    """Build (once per machine, cached by torch) and load the operator; False, with one warning, when it cannot be
    (no C++ compiler or ninja): steps keep the gathered path."""
    with _lock:
        if "loaded" in _state or "failed" in _state:
            return "loaded" in _state
        try:
            from torch.utils.cpp_extension import load_inline

            name, flags = build_target()
            _put_ninja_on_path()
            folder = build_folder(name)
            with _builder_lock(folder):
                load_inline(
                    name,
                    cpp_sources=SOURCE.read_text(),
                    is_python_module=False,
                    extra_cflags=flags,
                    extra_ldflags=["-fopenmp"],
                    build_directory=str(folder),
                )
        except Exception as exc:  # a machine without g++ or ninja runs the gathered path
            first_line = (str(exc).strip().splitlines() or [""])[0]
            what = "paged decode attention unavailable, steps gather blocks"
            logger.warning("%s: %s: %s", what, type(exc).__name__, first_line)
            _state["failed"] = True
            return False
        torch.library.register_fake("batchscope::paged_decode")(_fake)
        _state["loaded"] = True
        return True


def build_folder(name: str) -> Path:
    """Where extension `name` is built, as torch's builder places it by default (made if missing): under
    `TORCH_EXTENSIONS_DIR`, else under torch's build root in a folder per Python and torch build (a CPU and a CUDA
    torch never share a build)."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is None:
        from torch.utils.cpp_extension import get_default_build_root

        accelerator = f"cu{torch.version.cuda.replace('.', '')}" if torch.version.cuda else "cpu"
        if torch.version.hip:
            accelerator = f"rocm{torch.version.hip.replace('.', '')}"
        root = str(Path(get_default_build_root()) / f"py{sys.version_info.major}{sys.version_info.minor}_{accelerator}")
    folder = Path(root) / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextlib.contextmanager
def _builder_lock(folder: Path) -> Iterator[None]:
    """Hold the machine-wide build lock for the extension built in `folder`, clearing the file lock a killed build
    left behind.

    torch's builder marks a build (and even a load of an up-to-date one) with a `lock` file in the build folder and
    waits, with no end, while that file exists; a process killed meanwhile (Ctrl-C on a first start, a test run cut
    short) leaves it, and every later start's compile then waits forever (seen here: two test workers, 8 minutes,
    idle). An flock on a file beside it is released by the kernel when its holder dies: while we hold it, no other
    process of ours is building, so a `lock` file found then is a dead one's."""
    if fcntl is None:  # not POSIX: a dead build's lock file is left to torch
        yield
        return
    with (folder / "batchscope.flock").open("a") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # released when the file closes, or when this process dies
        stale = folder / "lock"
        if stale.exists():
            logger.warning("removing %s, left by a build that was stopped before it finished", stale)
            stale.unlink(missing_ok=True)
        yield


def _put_ninja_on_path() -> None:
    """torch's builder runs `ninja` from PATH: the pip package's (requirements.txt) when none is there, as when
    the virtual environment's Python is run without activating it."""
    if shutil.which("ninja") is None:
        try:
            import ninja
        except ImportError:
            return
        os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, os.environ.get("PATH", "")])


def ready() -> bool:
    """Whether the operator is loaded in this process (never waits)."""
    return "loaded" in _state


def _fake(  # noqa: PLR0913  (the operator's own arguments)
    q: torch.Tensor,
    kpool: torch.Tensor,
    vpool: torch.Tensor,
    tables: torch.Tensor,
    own: torch.Tensor,
    first: torch.Tensor,
    window: int,
    scale: float,
) -> torch.Tensor:
    return q.new_empty((q.shape[0], q.shape[1], vpool.shape[3]))


def paged_decode(  # noqa: PLR0913  (the operator's own arguments)
    query: torch.Tensor,
    key_pool: torch.Tensor,
    value_pool: torch.Tensor,
    tables: torch.Tensor,
    own: torch.Tensor,
    first: torch.Tensor,
    window: int | None,
    scale: float,
) -> torch.Tensor:
    """`query` [rows, heads, dim] (one query per row) over the pools `[kv_heads, blocks, block_size, dim]` through
    `tables` [rows, n]; `own` and `first` [rows]: each query's column and its row's first real column. Returns
    `[rows, heads, value dim]`."""
    return torch.ops.batchscope.paged_decode(
        query.contiguous(), key_pool, value_pool, tables, own, first, window or 0, scale
    )
