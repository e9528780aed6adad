"""A peer's server held while other contenders run: paused as a whole process group, answering again once resumed,
and stoppable while paused. A real server process (Python's http.server answering /health), never a fake."""

from __future__ import annotations

import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

from batching.bench.peers.local_server import LocalServer

SERVER = """
import http.server, sys
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *args): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[-1])), Health).serve_forever()
"""


def _health(server: LocalServer, timeout: float) -> bool:
    try:
        with urllib.request.urlopen(f"{server.url}/health", timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, TimeoutError):
        return False


def _status_becomes(process: psutil.Process, stopped: bool) -> bool:
    """Whether `process` reaches (or leaves) the stopped state: a signal is delivered asynchronously."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if (process.status() == psutil.STATUS_STOPPED) == stopped:
            return True
        time.sleep(0.01)
    return False


def test_a_held_server_is_stopped_as_a_process_group_and_answers_again_once_resumed(tmp_path: Path) -> None:
    server = LocalServer("health", [sys.executable, "-c", SERVER], {}, tmp_path / "log", 60)
    with server:
        assert server.process is not None
        popen = server.process
        process = psutil.Process(popen.pid)
        server.hold(paused=True)
        assert _status_becomes(process, stopped=True)
        assert not _health(server, timeout=1)  # the kernel queues the connection; nothing answers it
        server.hold(paused=False)
        assert _status_becomes(process, stopped=False)
        assert _health(server, timeout=10)
        server.hold(paused=True)
    # Stopped while paused: SIGTERM is taken once the group is resumed (not left pending until SIGKILL at 30 s).
    assert popen.returncode == -signal.SIGTERM
    assert not process.is_running()
    server.hold(paused=False)  # once stopped: nothing to hold, no error
