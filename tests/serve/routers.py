"""The field's routers as real processes in front of servers the tests started: vLLM's `vllm-router` and SGLang's
`sglang-router` (Rust load balancers, binary wheels from the package registry: requirements-dev.txt)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import free_port

# Each router's command line before its worker URLs and ports (round robin: the spread the tests can count), quiet
ROUTERS = {
    "vllm-router": ("vllm-router", "--log-level", "warning"),
    "sglang-router": ("sglang-router", "launch", "--log-level", "warn"),
}


@dataclass(frozen=True)
class Router:
    """A running router: where clients send requests, and where its own Prometheus metrics are."""

    url: str
    metrics_url: str
    workers: tuple[str, ...]


@contextlib.contextmanager
def running_router(kind: str, workers: Sequence[str], tmp_path: Path, start_s: float = 60) -> Iterator[Router]:
    """`kind` (a key of ROUTERS) on free ports in front of `workers`, round robin, in its own process group; its log
    goes to `tmp_path`. Ready once its /health answers (it waits for every worker's health first)."""
    port, metrics_port = free_port(), free_port()
    log_path = tmp_path / f"{kind}-{port}.log"
    command = [
        *ROUTERS[kind],
        "--worker-urls",
        *workers,
        "--policy",
        "round_robin",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(metrics_port),
    ]
    with log_path.open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_s
        while True:
            assert process.poll() is None, log_path.read_text()
            with contextlib.suppress(OSError), urllib.request.urlopen(url + "/health", timeout=2) as answer:
                if answer.status == 200:
                    break
            assert time.monotonic() < deadline, f"{kind} did not start in {start_s:.0f} s: {log_path.read_text()}"
            time.sleep(0.3)
        yield Router(url, f"http://127.0.0.1:{metrics_port}", tuple(workers))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
