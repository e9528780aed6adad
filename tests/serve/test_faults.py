"""The API under faults of its engine, on a real server (`python -m batching.serve`): a deadline ends a request no
answer can reach (its engine stopped), and a server whose engine is restarted too often exits non-zero."""

from __future__ import annotations

import http.client
import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.serve.helpers import our_server, post_json, sse_events

MODEL = "builtin"
BODY = {"model": MODEL, "prompt": "Q: Hello\nA:", "max_tokens": 50, "ignore_eos": True}


@pytest.fixture(scope="module")
def deadline_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """A deadline of 1 s, and an engine allowed a long silence (so a stopped one is left stopped)."""
    env = {"BATCHSCOPE_SERVER__REQUEST_TIMEOUT_S": "1", "BATCHSCOPE_ENGINE__HEARTBEAT_TIMEOUT_S": "600"}
    with our_server(tmp_path_factory.mktemp("deadline"), env) as (url, process):
        yield url, process.pid


def _aborted(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith('batchscope:request_success_total{finished_reason="abort"}'):
                return float(line.split()[-1])
    return 0.0


def test_a_request_past_the_deadline_is_a_504_whole_or_streamed_and_is_cancelled(deadline_server) -> None:
    """The engine is stopped, so no answer can come: each request ends at its deadline, and once the engine goes
    on, both are cancelled (counted `abort`)."""
    url, pid = deadline_server
    (engine,) = psutil.Process(pid).children()
    before = _aborted(url)
    engine.suspend()
    try:
        status, answer = post_json(url, "/v1/completions", BODY)
        streamed, events = sse_events(url, "/v1/completions", {**BODY, "stream": True})
    finally:
        engine.resume()
    assert status == 504 and answer["error"]["type"] == "timeout_error"
    assert "deadline of 1 s (BATCHSCOPE_SERVER__REQUEST_TIMEOUT_S)" in answer["error"]["message"]
    assert streamed == 200 and events[-1] == "[DONE]" and json.loads(events[-2])["error"]["code"] == 504
    deadline = time.monotonic() + 60
    while _aborted(url) < before + 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _aborted(url) == before + 2
    assert post_json(url, "/v1/completions", {**BODY, "max_tokens": 2})[0] == 200


def test_a_server_whose_engine_dies_more_often_than_allowed_exits_non_zero(tmp_path: Path) -> None:
    with our_server(tmp_path, {"BATCHSCOPE_ENGINE__MAX_RESTARTS": "0"}) as (url, process):
        (engine,) = psutil.Process(process.pid).children()
        os.kill(engine.pid, signal.SIGKILL)
        assert process.wait(timeout=60) == 3
    log = next(tmp_path.glob("serve-*.log")).read_text()
    assert "the server exits: the engine stopped (the engine process stopped: killed by signal 9)" in log
    with pytest.raises(OSError):
        http.client.HTTPConnection(url.removeprefix("http://"), timeout=2).request("GET", "/health")


def test_a_signal_to_the_whole_group_stops_server_and_engine_and_restarts_nothing(tmp_path: Path) -> None:
    """systemd's stop (SIGTERM to every process of the service): the engine dies of it too, and is not restarted
    while the server shuts down; the server ends by that signal (uvicorn raises it again once it has shut down)."""
    with our_server(tmp_path) as (_, process):
        (engine,) = psutil.Process(process.pid).children()
        os.killpg(process.pid, signal.SIGTERM)
        assert process.wait(timeout=60) == -signal.SIGTERM
        assert not engine.is_running()
    log = next(tmp_path.glob("serve-*.log")).read_text()
    assert "restarting the engine" not in log
