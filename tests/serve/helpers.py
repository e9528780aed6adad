"""Our OpenAI-compatible server (`python -m batching.serve`) as a subprocess, killable as a whole: for the API's own
tests and the remote tests (page, API and browser side)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import openai

from batching.remote.prometheus import read_metrics
from tests.helpers import ROOT, free_port


@contextlib.contextmanager
def our_server(
    tmp_path: Path, env: dict[str, str] | None = None, args: Sequence[str] = (), start_s: float = 90
) -> Iterator[tuple[str, subprocess.Popen]]:
    """`python -m batching.serve` on a free port in its own process group (the engine process is its child), with
    `args` after ours (a later `--log-level` wins); its output goes to `serve-PORT.log` in `tmp_path`. `start_s`: how
    long to wait for it to answer before calling it stuck."""
    port = free_port()
    log_path = tmp_path / f"serve-{port}.log"
    environment = {**os.environ, "BATCHSCOPE_MODEL__DEVICE": "cpu", "OMP_NUM_THREADS": "1", **(env or {})}
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "batching.serve", "--port", str(port), "--log-level", "warning", *args],
            cwd=ROOT,
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_s
        while True:
            assert process.poll() is None, log_path.read_text()
            with contextlib.suppress(OSError), urllib.request.urlopen(url + "/health", timeout=2) as answer:
                if answer.status == 200:
                    break
            assert time.monotonic() < deadline, f"the server did not start in {start_s:.0f} s"
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


@contextlib.contextmanager
def two_eager_servers(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """Two of `our_server` with `--no-compile` (a fleet's replicas, or two servers to sweep), their URLs."""
    with contextlib.ExitStack() as stack:
        first, second = (stack.enter_context(our_server(tmp_path, args=("--no-compile",)))[0] for _ in range(2))
        yield first, second


def served(url: str) -> tuple[int, int]:
    """What our server's /metrics says it has answered so far: (requests finished, tokens generated)."""
    page = read_metrics(url)
    finished = page.values("batchscope:request_success_total")  # no sample before its first label
    return int(sum(finished)), int(sum(page.values("batchscope:generation_tokens_total")))


def openai_client(url: str, key: str = "unused", timeout: float = 60) -> openai.OpenAI:
    """The real OpenAI client on our server (no retries: a failure is seen as it is)."""
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=timeout)


def async_openai_client(url: str, key: str = "unused", timeout: float = 120) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=timeout)


def post_json(url: str, path: str, body: bytes | dict, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    """POST raw JSON (what a client library would not send) and read the status and the JSON answer."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url + path, raw, {"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def sse_events(url: str, path: str, body: dict) -> tuple[int, list[str]]:
    """POST a streamed request and read every server-sent event's data, in order (raw, without a client)."""
    request = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        text = answer.read().decode()
        return answer.status, [line.removeprefix("data: ") for line in text.split("\n\n") if line]


def post_large(url: str, body: bytes, chunked: bool = False) -> tuple[int, dict]:
    """POST a body the server may refuse before reading it all (and then close the connection on): sent whole
    with its Content-Length, or in chunks without one; the status and the JSON answer."""
    connection = http.client.HTTPConnection(url.removeprefix("http://"), timeout=60)
    pieces = (body[start : start + 65536] for start in range(0, len(body), 65536))
    try:
        headers = {"Content-Type": "application/json"}
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # it answered before the body was all sent
            connection.request("POST", "/v1/completions", pieces if chunked else body, headers, encode_chunked=chunked)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()
