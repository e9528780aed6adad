"""The engine process supervised by its client: a stopped (SIGSTOP) engine is seen by its missing heartbeat and a
hung step by its loop no longer going round; either way the requests waiting end with an error at once, the process
is killed and a new one started, and the causes are counted. Restarted too often, the client gives up and says so."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil

from batching.engine.events import FinishedEvent, TokenEvent
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams, SamplingParams
from batching.engine.request import FinishReason
from batching.service import EngineClient, EngineConfig
from batching.service.lifecycle import EngineState
from config.settings import EngineSettings, ModelSettings, TokenizerSettings
from tests.service.helpers import HANGING_SEED, hang_sampling_with_seed_777

OPTIONS = BatcherOptions(max_batch_size=4, max_batched_tokens=64)
LONG = RequestParams(400, ignore_eos=True)
WAIT_S = 60.0  # a wait only a broken feature exhausts


def _client(tiny_model_dirs, **engine) -> EngineClient:
    config = EngineConfig(
        ModelSettings(name_or_path=str(tiny_model_dirs["qwen2"]), device="cpu", dtype="float32"),
        TokenizerSettings(),
        EngineSettings(compile_steps=False, **engine),
        initializer=hang_sampling_with_seed_777,
    )
    return EngineClient(config)


def wait_for(condition, seconds: float = WAIT_S) -> bool:
    deadline = time.monotonic() + seconds
    while not (met := condition()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return met


def _finished(session, request_ids: set[str]) -> list[FinishedEvent]:
    done: list[FinishedEvent] = []
    deadline = time.monotonic() + WAIT_S
    while {e.request_id for e in done} != request_ids and time.monotonic() < deadline:
        done += [e for e in session.poll(timeout=0.05) if isinstance(e, FinishedEvent)]
    return done


def _answers_again(client: EngineClient) -> None:
    session = client.open_session(OPTIONS)
    again = session.submit([8, 9], RequestParams(6, ignore_eos=True))
    (done,) = _finished(session, {again.request_id})
    assert done.reason is FinishReason.LENGTH and done.output_tokens == 6
    session.close()


def test_a_stopped_engine_is_seen_by_its_silence_its_requests_fail_and_a_new_one_is_started(tiny_model_dirs) -> None:
    client = _client(tiny_model_dirs, heartbeat_timeout_s=2.0)
    try:
        session = client.open_session(OPTIONS)
        waiting = {session.submit([5, 6, 7], LONG).request_id for _ in range(3)}
        assert wait_for(lambda: any(isinstance(e, TokenEvent) for e in session.poll()))
        stopped = psutil.Process(client.lifecycle.pid)
        stopped.suspend()  # SIGSTOP: the process and its heartbeat thread stand still
        finished = _finished(session, waiting)
        assert {e.request_id for e in finished} == waiting
        assert all(e.reason is FinishReason.ERROR and "no heartbeat for" in e.error for e in finished)
        assert wait_for(lambda: client.lifecycle.alive)
        assert client.lifecycle.pid != stopped.pid and not stopped.is_running()  # killed, not left stopped
        assert client.lifecycle.restart_causes == {"exited": 0, "unresponsive": 1, "hung": 0}
        _answers_again(client)
    finally:
        client.close()


def test_a_step_that_never_returns_is_seen_while_the_heartbeat_goes_on(tiny_model_dirs) -> None:
    client = _client(tiny_model_dirs, heartbeat_timeout_s=30.0, step_timeout_s=1.5)
    try:
        session = client.open_session(OPTIONS)
        hung = session.submit([5, 6, 7], RequestParams(8, SamplingParams(do_sample=True, seed=HANGING_SEED)))
        beside = session.submit([5, 6], LONG)
        finished = _finished(session, {hung.request_id, beside.request_id})
        assert len(finished) == 2 and all("one round of steps ran" in e.error for e in finished)
        assert wait_for(lambda: client.lifecycle.alive)
        assert client.lifecycle.restart_causes == {"exited": 0, "unresponsive": 0, "hung": 1}
        _answers_again(client)
    finally:
        client.close()


def test_an_engine_restarted_too_often_is_given_up_and_started_again_when_asked(tiny_model_dirs) -> None:
    gave_up: list[str] = []
    heard = threading.Event()
    client = _client(tiny_model_dirs, max_restarts=1, restart_window_s=3600)
    client.lifecycle.on_give_up = lambda reason: (gave_up.append(reason), heard.set())
    try:
        first = client.lifecycle.pid
        os.kill(first, signal.SIGKILL)
        assert wait_for(lambda: client.lifecycle.alive and client.lifecycle.pid != first)
        os.kill(client.lifecycle.pid, signal.SIGKILL)
        assert heard.wait(WAIT_S)
        assert client.lifecycle.state is EngineState.GAVE_UP and client.lifecycle.restarts == 1
        assert "after 1 restarts within 3600 s, and is not restarted again" in gave_up[0]
        _answers_again(client)  # a request (a person asking, on the page) starts it again
        assert client.lifecycle.alive and client.lifecycle.restarts == 2
    finally:
        client.close()
