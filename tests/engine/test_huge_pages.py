"""Big CPU tensors on transparent huge pages: the engine asks torch's allocator for them before torch is imported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from batching.engine import huge_pages
from batching.engine.huge_pages import ENV, huge_pages_state

ROOT = Path(__file__).resolve().parents[2]
# A fresh interpreter imports the engine the way every entry point does (before torch), allocates 64 MiB through
# torch, and prints how much of its anonymous memory sits on huge pages (KiB).
ALLOCATE = (
    "import re, batching.engine, torch; big = torch.ones(64 * 2**20 // 4); "
    "print(re.search(r'AnonHugePages:\\s+(\\d+)', open('/proc/self/smaps_rollup').read()).group(1))"
)


def _huge_kib(environment: dict[str, str]) -> int:
    done = subprocess.run(
        [sys.executable, "-c", ALLOCATE], cwd=ROOT, env=environment, capture_output=True, text=True, check=True
    )
    return int(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(
    huge_pages.kernel_choice() not in ("always", "madvise") or not Path("/proc/self/smaps_rollup").exists(),
    reason="this kernel offers no transparent huge pages",
)
@pytest.mark.long
def test_importing_the_engine_puts_big_tensors_on_huge_pages() -> None:
    environment = {key: value for key, value in os.environ.items() if key != ENV}
    assert _huge_kib(environment) >= 2048  # at least one 2 MiB page of the 64 MiB tensor
    # The environment's word wins: with it off, the same allocation stays on small pages.
    assert _huge_kib({**environment, ENV: "0"}) == 0


def test_the_state_says_why_huge_pages_are_off(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    setting = tmp_path / "enabled"
    monkeypatch.setattr(huge_pages, "KERNEL_SETTING", setting)
    monkeypatch.setenv(ENV, "1")
    setting.write_text("always [madvise] never\n")
    assert huge_pages_state() == "on"
    setting.write_text("always madvise [never]\n")
    assert huge_pages_state() == "off (the kernel's transparent huge pages: never)"
    setting.unlink()
    assert huge_pages_state() == "off (the kernel has no transparent huge pages)"
    monkeypatch.setenv(ENV, "0")
    assert huge_pages_state() == f"off ({ENV}=0)"
