"""Chaos on a real server (`python -m batching.serve --no-compile`): while clients stream greedy requests, its
engine is killed, stopped (SIGSTOP) and continued (SIGCONT), and a request with 10,000 stop strings, one with as
many as allowed, a 5 MB body, a lone surrogate and a batch of hang-ups arrive. Every well-formed request ends with
`generate`'s answer or an honest error status, none hangs, `/health` answers throughout, and the pool is empty at
the end. Asserted by the order of events and by counts, never by how long anything took."""

from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import psutil
import pytest

from batching.bench.workloads import load_workload
from batching.serve.stops import MAX_STOP_CHARS, MAX_STOP_STRINGS
from config.settings import ModelSettings
from model.loader import load_model
from model.prompting import format_prompt
from tests.engine.helpers import reference
from tests.serve.helpers import our_server, post_large

MODEL = "builtin"
PROMPTS = [format_prompt(request.prompt) for request in load_workload("customer-support").requests[:4]]
CAP = 24
HONEST = {429, 503}  # a full engine; an engine that died or went silent, being restarted
TIMEOUT_S = 60.0  # any one HTTP call: a call that takes this long has hung
HEALTH_EVERY_S = 0.05
RETRY_S = 0.2


@dataclass
class Log:
    """Every event of the test in one order: (sequence number, what, detail)."""

    events: list[tuple[int, str, object]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _numbers: Iterator[int] = field(default_factory=itertools.count)

    def add(self, what: str, detail: object = None) -> int:
        with self._lock:
            number = next(self._numbers)
            self.events.append((number, what, detail))
            return number

    def of(self, what: str) -> list[tuple[int, object]]:
        with self._lock:
            return [(number, detail) for number, kind, detail in self.events if kind == what]


class Server:
    """A raw HTTP client of the server: every call has a timeout, and what it got is returned as is."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.host, port = url.removeprefix("http://").split(":")
        self.port = int(port)

    def connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT_S)

    def get(self, path: str) -> tuple[int, bytes]:
        connection = self.connect()
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def post(self, body: bytes | dict, connection: http.client.HTTPConnection | None = None) -> tuple[int, dict]:
        own = connection is None
        connection = connection or self.connect()
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        try:
            connection.request("POST", "/v1/completions", raw, {"Content-Type": "application/json"})
            response = connection.getresponse()
            return response.status, json.loads(response.read())
        finally:
            if own:
                connection.close()

    def stream(self, body: dict, on_first=None) -> tuple[int, str, dict | None]:
        """A streamed completion: (status, its text, the error event if one came); `on_first` runs after the
        first chunk is read, before the rest."""
        connection = self.connect()
        try:
            connection.request("POST", "/v1/completions", json.dumps({**body, "stream": True}), _JSON)
            response = connection.getresponse()
            if response.status != 200:
                return response.status, "", json.loads(response.read())
            text, error = [], None
            for line in response:
                data = line.decode().strip().removeprefix("data: ")
                if not data or data == "[DONE]":
                    continue
                chunk = json.loads(data)
                if "error" in chunk:
                    error = chunk
                elif chunk["choices"]:
                    text.append(chunk["choices"][0]["text"])
                    if on_first is not None and len(text) == 1:
                        on_first()
            return 200, "".join(text), error
        finally:
            connection.close()

    def metrics(self) -> dict[str, float]:
        _, text = self.get("/metrics")
        values = {}
        for line in text.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values


_JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def expected() -> dict[str, str]:
    """`generate`'s greedy answer to each prompt alone."""
    loaded = load_model(ModelSettings(name_or_path=MODEL, device="cpu", dtype="float32"))
    answers = {}
    for prompt in PROMPTS:
        ids = reference(loaded.model, loaded.tokenizer(prompt)["input_ids"], CAP, ignore_eos=True)
        answers[prompt] = loaded.tokenizer.decode(ids, skip_special_tokens=True)
    return answers


@contextlib.contextmanager
def running(target, count: int = 1) -> Iterator[threading.Event]:
    """`count` threads running `target(stop)` until the block ends; each must end once told to."""
    stop = threading.Event()
    threads = [threading.Thread(target=target, args=(stop,), daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    try:
        yield stop
    finally:
        stop.set()
        for thread in threads:
            thread.join(TIMEOUT_S + 5)
        assert not any(thread.is_alive() for thread in threads), "a client hung"


def _engine(server_pid: int) -> int | None:
    """The engine process's id (None while there is none, between one and the next)."""
    children = psutil.Process(server_pid).children()
    return children[0].pid if len(children) == 1 else None


def _until(log: Log, condition, what: str) -> int:
    """Wait for `condition`, logging when it held: a wait that only a broken server exhausts."""
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(HEALTH_EVERY_S)
    return log.add(what)


def test_chaos_every_request_ends_answered_or_honestly_and_health_answers_throughout(tmp_path, expected) -> None:
    env = {"BATCHSCOPE_ENGINE__HEARTBEAT_TIMEOUT_S": "2", "BATCHSCOPE_ENGINE__MAX_RESTARTS": "20"}
    with our_server(tmp_path, env, args=["--no-compile"]) as (url, process):
        server, log = Server(url), Log()
        before = server.metrics()

        def poll_health(stop: threading.Event) -> None:
            while not stop.is_set():
                try:
                    status, body = server.get("/health")
                    log.add("health", (status, json.loads(body)["status"]))
                except OSError as exc:
                    log.add("health", ("no answer", repr(exc)))
                time.sleep(HEALTH_EVERY_S)

        def stream_greedy(stop: threading.Event) -> None:
            for prompt in itertools.cycle(PROMPTS):
                if stop.is_set():
                    return
                body = {"model": MODEL, "prompt": prompt, "max_tokens": CAP, "temperature": 0, "ignore_eos": True}
                try:
                    outcome = server.stream(body)
                except OSError as exc:
                    outcome = ("no answer", repr(exc), None)
                log.add("greedy", (prompt, *outcome))
                if outcome[0] != 200:
                    stop.wait(RETRY_S)  # as a client does on a 503 (its Retry-After is longer)

        with running(poll_health), running(stream_greedy, 4):
            _until(log, lambda: any(d[1] == 200 and d[3] is None for _, d in log.of("greedy")), "warm")
            _big_requests(server, log, expected)
            _hang_ups(server, log, before)
            _kill(server, log, process.pid)
            _stop_and_continue(server, log, process.pid)
        _assert_outcomes(log, expected)
        _assert_pool_empty(server, log)


def _big_requests(server: Server, log: Log, expected: dict[str, str]) -> None:
    """Too many stop strings, a 5 MB body and a lone surrogate are refused; as many stop strings as allowed are
    served whole while /health answers."""
    status, answer = server.post({"prompt": PROMPTS[0], "stop": [f"\x07{i}" for i in range(10_000)]})
    assert status == 400 and answer["error"]["param"] == "stop" and "at most 64 items" in answer["error"]["message"]
    status, answer = post_large(server.url, json.dumps({"prompt": "hello " * 850_000}).encode())
    assert status == 413 and "2,000,000 bytes" in answer["error"]["message"]
    connection = server.connect()
    status, answer = server.post(b'{"prompt": "\\ud83d", "max_tokens": 2}', connection)
    assert status == 400 and answer["error"]["param"] == "prompt"
    assert server.post({"prompt": PROMPTS[1], "max_tokens": 2}, connection)[0] in {200, *HONEST}  # same connection
    connection.close()
    stops = [f"\x07{i:03d}" + "x" * (MAX_STOP_CHARS - 4) for i in range(MAX_STOP_STRINGS)]
    body = {"model": MODEL, "prompt": PROMPTS[2], "max_tokens": CAP, "temperature": 0, "ignore_eos": True}

    def health_meanwhile() -> None:
        log.add("big stream started")
        log.add("health during big stream", server.get("/health")[0])

    status, text, error = server.stream({**body, "stop": stops}, on_first=health_meanwhile)
    log.add("big stream ended")
    assert status in {200, *HONEST}
    if status == 200 and error is None:
        assert text == expected[PROMPTS[2]]
    ((started, _),), ((health, code),), ((ended, _),) = (log.of(what) for what in _BIG)
    assert started < health < ended and code in {200, 503}


_BIG = ("big stream started", "health during big stream", "big stream ended")


def _hang_ups(server: Server, log: Log, before: dict[str, float]) -> None:
    """Eight clients leave: four mid-stream, four whole requests right after sending; the streams count `abort`."""
    body = json.dumps({"model": MODEL, "prompt": PROMPTS[3], "max_tokens": 1000, "ignore_eos": True})
    gone = []
    for number in range(8):
        connection = server.connect()
        if number < 4:
            connection.request("POST", "/v1/completions", body[:-1] + ', "stream": true}', _JSON)
            response = connection.getresponse()
            assert response.status == 200 and response.readline().startswith(b"data: ")
        else:
            connection.request("POST", "/v1/completions", body, _JSON)
        gone.append(connection)
    for connection in gone:
        connection.close()
    aborted = 'batchscope:request_success_total{finished_reason="abort"}'
    _until(log, lambda: server.metrics().get(aborted, 0.0) - before.get(aborted, 0.0) >= 4, "hang-ups aborted")


def _kill(server: Server, log: Log, server_pid: int) -> None:
    engine = _engine(server_pid)
    assert engine is not None
    log.add("kill")
    os.kill(engine, signal.SIGKILL)
    _until(log, lambda: server.get("/health")[0] == 200 and _engine(server_pid) not in {engine, None}, "back")


def _stop_and_continue(server: Server, log: Log, server_pid: int) -> None:
    """Stopped past the heartbeat timeout: /health turns 503, the engine is replaced; the continue comes late."""
    engine = _engine(server_pid)
    assert engine is not None
    os.kill(engine, signal.SIGSTOP)
    log.add("stop")
    _until(log, lambda: server.get("/health")[0] == 503, "503 while stopped")
    with contextlib.suppress(ProcessLookupError):  # killed by then, most likely
        os.kill(engine, signal.SIGCONT)
    log.add("continue")
    _until(
        log, lambda: server.get("/health")[0] == 200 and _engine(server_pid) not in {engine, None}, "back after stop"
    )
    restarts = server.metrics()
    assert restarts['batchscope:engine_restarts_total{cause="exited"}'] == 1
    assert restarts['batchscope:engine_restarts_total{cause="unresponsive"}'] == 1


def _assert_outcomes(log: Log, expected: dict[str, str]) -> None:
    """Every greedy stream: generate's answer, or an honest error (an HTTP status, or a stream's error event)."""
    outcomes = [detail for _, detail in log.of("greedy")]
    assert outcomes and all(status != "no answer" for _, status, *_ in outcomes), outcomes
    for prompt, status, text, error in outcomes:
        if status == 200 and error is None:
            assert text == expected[prompt]
        else:
            code = error["error"]["code"]
            assert code in HONEST and error["error"]["type"] in {"server_error", "rate_limit_error"}, error
    answered = [detail for _, detail in log.of("health")]
    assert answered and all(status in {200, 503} for status, _ in answered), answered
    kill = log.of("kill")[0][0]
    assert any(number > kill and status == 200 for number, (status, _) in log.of("health"))


def _assert_pool_empty(server: Server, log: Log) -> None:
    def empty() -> bool:
        figures = server.metrics()
        return (
            figures["batchscope:num_requests_running"] == 0
            and figures["batchscope:num_requests_waiting"] == 0
            and figures["batchscope:kv_cache_usage_perc"] == 0
        )

    _until(log, empty, "pool empty")
