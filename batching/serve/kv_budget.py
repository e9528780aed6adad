"""The API server's KV pool, sized for serving from a memory budget, as vLLM's CPU build sizes its own
(`--kv-cache-memory-bytes`, else a share of the machine's memory), not the page's demo pool.

The page's race keeps `kv_cache_tokens` (1,024 positions), a pool small enough that memory visibly decides who runs.
A server with that pool runs two or three requests of a real model at a time and preempts the rest (its TTFT ten
times vLLM's on the 0.5B shape: docs/benchmarks.md). So unless the KV memory is given (`--kv-cache-mb`, or
`BATCHSCOPE_BATCHING__KV_CACHE_MB` / `__KV_CACHE_TOKENS` set), the server's pool holds `CONTEXTS_PER_SLOT` whole
contexts for each slot (room for every slot's longest request, and for prefix caching to keep what finished requests
computed), within `MEMORY_SHARE` of the memory available at start.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from batching.engine.geometry import PoolGeometry
from batching.engine.options import BatcherOptions

CONTEXTS_PER_SLOT = 4
MEMORY_SHARE = 0.25


def available_memory_bytes() -> int:
    """Memory this process may still take: the kernel's MemAvailable, within its cgroup's limit where one is set (a
    container's)."""
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    limit, usage = Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory.current")
    if limit.is_file() and usage.is_file() and limit.read_text().strip().isdigit():
        available = min(available, int(limit.read_text()) - int(usage.read_text()))
    return max(available, 0)


def serving_pool(
    options: BatcherOptions, geometry: PoolGeometry, given: bool, available: int
) -> tuple[BatcherOptions, str]:
    """The server's batcher options with its pool (as given when `given`, else sized for serving from `available`
    bytes), and the startup log's line about it: its MiB, blocks and how many requests of the whole context fit."""
    if not given:
        slots = options.max_batch_size
        wanted = geometry.pool_mb(CONTEXTS_PER_SLOT * slots * geometry.context(options), slots)
        share = MEMORY_SHARE * available / 2**20
        budget = min(wanted, share) or wanted  # no memory figure (0): the contexts alone
        options = dataclasses.replace(options, kv_blocks=None, kv_cache_tokens=None, kv_cache_mb=budget)
    blocks = geometry.pool_blocks(options)
    tokens = geometry.kv_tokens(options)
    mb = geometry.pool_mb(tokens, options.max_batch_size)
    why = (
        "as set"
        if given
        else f"{CONTEXTS_PER_SLOT} whole contexts a slot, at most {MEMORY_SHARE:.0%} of the "
        f"{available / 2**30:.1f} GiB available; --kv-cache-mb sets it"
    )
    line = (
        f"KV cache: {mb:,.1f} MiB ({why}): {blocks:,} blocks of {options.block_size}, {tokens:,} positions, "
        f"{geometry.full_contexts(options):,} requests of the whole {geometry.context(options):,}-token context at once"
    )
    return options, line
