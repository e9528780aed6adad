"""TCMalloc for the processes that run steps, as vLLM's CPU backend runs (its docs and image preload it).

A compiled step allocates and frees its buffers every call (inductor's C++ wrapper, oneDNN's scratchpads and
descriptors, the step's input tensors): under glibc's malloc that was about a tenth of the stepping thread's time
(`perf`, seed-blog at two threads: `_int_malloc`, `_int_free`, `malloc_consolidate`). TCMalloc keeps those sizes in
per-thread caches. Measured on the embedded model (2-vCPU AMD EPYC, 2026-11-27, runs alternating between processes,
medians of 7): seed-blog at two threads 3,009 and 3,183 tok/s against glibc's 2,621 and 2,716, at one thread 2,534
against 2,169; jemalloc gained about half as much.

A process's allocator is chosen as it starts (`LD_PRELOAD`), so the entry points that run steps (`python -m
batching.serve`, `python -m batching.bench`) start again under it once, before torch is imported
(`relaunch_with_tcmalloc`, called by the `batching` package as it loads); the processes they start (the engine
process, forked; the peers' servers) inherit it. The page's engine process is forked from Streamlit's, and has what
Streamlit was started with. Where the library is not installed (Debian: `libtcmalloc-minimal4`, which the Dockerfile
and the test installer add) or `BATCHSCOPE_ALLOCATOR=system`, nothing changes. Only the standard library here: it
runs before torch is imported.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

ENV = "BATCHSCOPE_ALLOCATOR"  # "system": glibc's malloc, never relaunched
ENTRY_POINTS = ("batching.serve", "batching.bench")  # `python -m` these: they run steps in their processes
NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
FOLDERS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
)


def find_tcmalloc(folders: Sequence[str] = FOLDERS) -> Path | None:
    """The TCMalloc library installed here, or None."""
    for folder in folders:
        for name in NAMES:
            path = Path(folder) / name
            if path.is_file():
                return path
    return None


def relaunch_env(environ: Mapping[str, str], library: Path | None) -> dict[str, str] | None:
    """The environment to start again in, with `library` preloaded; None when there is nothing to do: no library,
    `BATCHSCOPE_ALLOCATOR=system`, or TCMalloc preloaded already (which also ends the relaunch after one)."""
    if library is None or environ.get(ENV, "").lower() == "system":
        return None
    preload = environ.get("LD_PRELOAD", "")
    if "tcmalloc" in preload:
        return None
    return {**environ, "LD_PRELOAD": f"{library} {preload}".strip()}


def started_as_entry_point(argv: Sequence[str]) -> bool:
    """Whether the interpreter's command line (`sys.orig_argv`) runs one of `ENTRY_POINTS` with `-m`."""
    try:
        module = argv[argv.index("-m") + 1]
    except (ValueError, IndexError):
        return False
    return module in ENTRY_POINTS


def relaunch_with_tcmalloc() -> None:
    """When this process was started as one of `ENTRY_POINTS`: start its command again with TCMalloc preloaded
    (same interpreter, options and arguments), replacing this process; returns when there is nothing to do. Called
    by the `batching` package as it is first imported (`python -m batching.serve` imports it before the entry
    point's own module), before it imports torch, so the first start pays for no import of its own."""
    if not started_as_entry_point(sys.orig_argv):
        return
    env = relaunch_env(os.environ, find_tcmalloc())
    if env is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def allocator_state(maps: Path = Path("/proc/self/maps")) -> str:
    """Which malloc this process runs on, in words, for a report's machine line and a server's log."""
    try:
        mapped = maps.read_text()
    except OSError:
        return "unknown"
    for line in mapped.splitlines():
        if "tcmalloc" in line:
            return f"TCMalloc ({line.split()[-1]})"
        if "jemalloc" in line:
            return f"jemalloc ({line.split()[-1]})"
    if os.environ.get(ENV, "").lower() == "system":
        return f"glibc's malloc ({ENV}=system)"
    if find_tcmalloc() is None:
        return "glibc's malloc (TCMalloc is not installed: libtcmalloc-minimal4)"
    return "glibc's malloc"
