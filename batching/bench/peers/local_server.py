"""A server run as a subprocess on a free local port: started, waited for until its /health answers, always stopped
(with every process it started), and the CPU time its processes used. For the peers' servers (vLLM, and the serving
benchmark's), whose work is not ours and is timed from outside.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import psutil


class ServerStartError(Exception):
    """The server exited or gave no /health in time: one line, with the last line of its log."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def log_tail(log: Path) -> str:
    """The log's last non-empty line (where a failing server says why), short."""
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else "(empty log)"


class LocalServer:
    """`command` plus `--port PORT`, in a process group of its own (a server's workers die with it)."""

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        env: dict[str, str],
        log: Path,
        startup_timeout_s: float,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.command = list(command)
        self.env = env
        self.log = log
        self.startup_timeout_s = startup_timeout_s
        self.cwd = cwd
        self.port = 0
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LocalServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start on a free port and wait for /health; stops the server again when that fails."""
        self.port = free_port()
        with self.log.open("w") as out:
            self.process = subprocess.Popen(
                [*self.command, "--port", str(self.port)],
                cwd=self.cwd,
                env={**os.environ, **self.env},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise

    def hold(self, paused: bool) -> None:
        """Pause (SIGSTOP) or resume (SIGCONT) its whole process group: a server paused while other contenders run
        cannot take a core from them (vLLM's engine busy-polls its queue for a second after each request, its
        OpenMP threads spin 200 ms). Nothing when it is not running."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGSTOP if paused else signal.SIGCONT)

    def stop(self) -> None:
        """SIGTERM to its process group (resumed, if paused, to take it), SIGKILL after 30 s; safe to call twice."""
        process, self.process = self.process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
            os.killpg(process.pid, signal.SIGCONT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        with contextlib.suppress(ProcessLookupError):  # a worker that outlived the server
            os.killpg(process.pid, signal.SIGKILL)

    def cpu_s(self) -> float:
        """CPU seconds used so far by the server and every process below it (NaN once it is gone)."""
        if self.process is None:
            return math.nan
        try:
            root = psutil.Process(self.process.pid)
            processes = [root, *root.children(recursive=True)]
        except psutil.Error:
            return math.nan
        total = 0.0
        for process in processes:
            with contextlib.suppress(psutil.Error):
                times = process.cpu_times()
                total += times.user + times.system
        return total

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                code = None if self.process is None else self.process.returncode
                raise ServerStartError(f"{self.name} exited with code {code} before /health: {log_tail(self.log)}")
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                if response.status == 200:
                    return
            time.sleep(0.5)
        raise ServerStartError(
            f"{self.name} gave no /health within {self.startup_timeout_s:.0f} s (log {self.log}): {log_tail(self.log)}"
        )
