"""Our OpenAI-compatible server (`python -m batching.serve`) as a subprocess, killable as a whole: for the API's own
tests and the remote tests (page, API and browser side)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from batching.remote.telemetry import read_samples
from tests.helpers import ROOT, free_port


@contextlib.contextmanager
def our_server(tmp_path: Path, env: dict[str, str] | None = None) -> Iterator[tuple[str, subprocess.Popen]]:
    """`python -m batching.serve` on a free port in its own process group (the engine process is its child)."""
    port = free_port()
    log_path = tmp_path / f"serve-{port}.log"
    environment = {**os.environ, "BATCHSCOPE_MODEL__DEVICE": "cpu", "OMP_NUM_THREADS": "1", **(env or {})}
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "batching.serve", "--port", str(port), "--log-level", "warning"],
            cwd=ROOT,
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert process.poll() is None, log_path.read_text()
            with contextlib.suppress(OSError), urllib.request.urlopen(url + "/health", timeout=2) as answer:
                if answer.status == 200:
                    break
            assert time.monotonic() < deadline, "the server did not start in 90 s"
            time.sleep(0.3)
        yield url, process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def served(url: str) -> tuple[int, int]:
    """What our server's /metrics says it has answered so far: (requests finished, tokens generated)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as answer:
        values = read_samples(answer.read().decode())
    finished = values.get("batchscope:request_success_total", [])  # no sample before its first label
    return int(sum(finished)), int(sum(values["batchscope:generation_tokens_total"]))
