"""Plain helpers the tests of every folder share: the repository's root, the compile setting the session keeps off,
and a free port for a server."""

from __future__ import annotations

import socket
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The setting the test session keeps at "false" (tests/conftest.py), also where a test clears BATCHSCOPE_* variables.
KEEP_EAGER = "BATCHSCOPE_ENGINE__COMPILE_STEPS"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
