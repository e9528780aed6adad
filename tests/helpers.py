"""Plain helpers the tests of every folder share: the repository's root, the compile setting the session keeps off,
a free port for a server, and a process's children."""

from __future__ import annotations

import os
import socket
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The setting the test session keeps at "false" (tests/conftest.py), also where a test clears BATCHSCOPE_* variables.
KEEP_EAGER = "BATCHSCOPE_ENGINE__COMPILE_STEPS"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def children_of(pid: int) -> list[int]:
    """The processes whose parent is `pid` (read from /proc)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:  # it ended while we looked
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(name))
    return found
