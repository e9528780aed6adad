"""Big CPU tensors on transparent huge pages.

A decode step of a real-size model streams every weight from memory once. On 4 KiB pages that stream takes a
TLB miss every page; on 2 MiB pages it runs faster. Torch's CPU allocator advises huge pages (`madvise`) for big
tensors when `THP_MEM_ALLOC_ENABLE=1`, and reads that once, at its first allocation: so the engine package sets
it before any of its modules imports torch (a process that imported torch before the engine keeps what torch
read then). The compiled steps' packed weights and the KV pool are such tensors; an eager step reads the weights
where the loader left them (safetensors' memory-mapped file pages). What it gained: docs/benchmarks.md.
`THP_MEM_ALLOC_ENABLE=0` in the environment turns it off.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "THP_MEM_ALLOC_ENABLE"
KERNEL_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def request_huge_pages() -> None:
    """Ask torch's allocator for huge pages, unless the environment says otherwise (call before importing torch)."""
    os.environ.setdefault(ENV, "1")


def kernel_choice() -> str | None:
    """The kernel's transparent-huge-page setting ("always", "madvise", "never"), or None where it has none."""
    try:
        return KERNEL_SETTING.read_text().split("[", 1)[1].split("]", 1)[0]
    except (OSError, IndexError):
        return None


def huge_pages_state() -> str:
    """What big tensors get, in words: "on", or "off" with why (the environment, or the kernel's setting)."""
    if os.environ.get(ENV) != "1":  # torch takes "1" alone as on
        return f"off ({ENV}={os.environ.get(ENV, '')})"
    chosen = kernel_choice()
    if chosen is None:
        return "off (the kernel has no transparent huge pages)"
    return "on" if chosen in ("always", "madvise") else f"off (the kernel's transparent huge pages: {chosen})"
