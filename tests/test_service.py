"""The shared engine: many sessions at once, limits, cancellation, dead sessions, and engine-thread faults."""

from __future__ import annotations

import random
import threading
import time

import pytest

from batching.engine.batcher import Batcher, BatcherOptions
from batching.engine.events import FinishedEvent, StepEvent, TokenEvent
from batching.engine.params import RequestParams, SamplingParams
from batching.engine.request import FinishReason
from batching.service import EngineService, QueueFullError, ServiceLimits
from tests.engine_helpers import loaded, random_prompts, reference


@pytest.fixture(scope="module")
def qwen(tiny_model_dirs):
    return loaded(str(tiny_model_dirs["qwen2"]))


@pytest.fixture
def service(qwen):
    made = EngineService(
        lambda: Batcher(qwen.model, qwen.tokenizer, BatcherOptions(max_batch_size=8, max_batched_tokens=64)),
        ServiceLimits(max_queue_per_session=16, max_queue_total=200, session_timeout_s=30),
    )
    yield made
    made.stop()


def drain(session, until: float = 60.0) -> list:
    events, deadline = [], time.monotonic() + until
    while session.pending and time.monotonic() < deadline:
        events += session.poll(timeout=0.05)
    return events + session.poll()


def assert_engine_empty(service: EngineService) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (service.batcher.running or service.in_flight()):
        time.sleep(0.01)
    batcher = service.batcher
    assert service.in_flight() == 0
    assert batcher.runner.cache.active_rows == 0
    assert batcher.runner.cache.held_requests == ()
    assert batcher.running == {} and len(batcher.scheduler.waiting) == 0


def test_eight_clients_sixteen_requests_each_with_random_cancellations(service, qwen) -> None:
    results: dict[int, dict] = {}
    errors: list[BaseException] = []
    all_steps: list[StepEvent] = []

    def client(index: int) -> None:
        try:
            rng = random.Random(index)
            session = service.open_session()
            prompts = random_prompts(16, vocab=300, seed=100 + index, longest=20)
            caps = [rng.randrange(1, 40) for _ in prompts]
            requests = [
                session.submit(p, RequestParams(c, ignore_eos=rng.random() < 0.5))
                for p, c in zip(prompts, caps, strict=True)
            ]
            doomed = {r.request_id for r in rng.sample(requests, 3)}
            events = session.poll(timeout=0.05)
            for request_id in doomed:
                service.batcher.cancel(request_id)
            events += drain(session)
            results[index] = {"session": session, "requests": requests, "doomed": doomed, "events": events}
            all_steps.extend(e for e in events if isinstance(e, StepEvent))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=240)
    assert not errors, errors
    assert len(results) == 8

    for result in results.values():
        session, events = result["session"], result["events"]
        mine = [e for e in events if not isinstance(e, StepEvent)]
        assert all(session.owns(e.request_id) for e in mine), "a client saw another client's tokens"
        finished = {e.request_id: e for e in mine if isinstance(e, FinishedEvent)}
        assert set(finished) == {r.request_id for r in result["requests"]}
        for request in result["requests"]:
            done = finished[request.request_id]
            tokens = [e.token_id for e in mine if isinstance(e, TokenEvent) and e.request_id == request.request_id]
            assert tokens == list(done.output_ids)
            if done.reason is FinishReason.CANCELLED:
                assert request.request_id in result["doomed"]
                continue
            assert done.reason in (FinishReason.EOS, FinishReason.LENGTH)
            expected = reference(
                qwen.model, request.prompt_ids, request.max_new_tokens, ignore_eos=request.params.ignore_eos
            )
            assert list(done.output_ids) == expected
    assert max(s.active for s in all_steps) == 8, "requests of different clients shared the batch"
    shared = [s for s in all_steps if len({rid.split("/")[0] for rid in s.slots if rid}) > 1]
    assert shared, "no step ever held requests of two sessions"
    assert_engine_empty(service)


def test_requests_beyond_the_session_limit_are_refused_with_a_message(qwen) -> None:
    service = EngineService(
        lambda: Batcher(qwen.model, qwen.tokenizer, BatcherOptions(max_batch_size=2)),
        ServiceLimits(max_queue_per_session=3, max_queue_total=5),
    )
    try:
        first, second = service.open_session(), service.open_session()
        for _ in range(3):
            first.submit([5, 6, 7], RequestParams(200, ignore_eos=True))
        with pytest.raises(QueueFullError, match="max_queue_per_session=3"):
            first.submit([5, 6, 7], RequestParams(5))
        second.submit([5, 6], RequestParams(200, ignore_eos=True))
        second.submit([5, 6], RequestParams(200, ignore_eos=True))
        with pytest.raises(QueueFullError, match="max_queue_total=5"):
            second.submit([5, 6], RequestParams(5))
        assert len(first.pending) == 3 and len(second.pending) == 2
        first.cancel_all()
        second.cancel_all()
        drain(first)
        drain(second)
        assert_engine_empty(service)
    finally:
        service.stop()


def test_bad_input_is_refused_without_touching_the_engine(service) -> None:
    session = service.open_session()
    with pytest.raises(ValueError, match="prompt is empty"):
        session.submit("", RequestParams(5))
    with pytest.raises(ValueError, match="max_new_tokens=0"):
        session.submit([5], RequestParams(0))
    assert not session.pending and service.in_flight() == 0


def test_a_session_that_stops_polling_has_its_requests_cancelled(qwen) -> None:
    service = EngineService(
        lambda: Batcher(qwen.model, qwen.tokenizer, BatcherOptions(max_batch_size=2)),
        ServiceLimits(session_timeout_s=0.3),
    )
    try:
        gone = service.open_session()
        requests = [gone.submit([5, 6, 7], RequestParams(400, ignore_eos=True)) for _ in range(4)]
        deadline = time.monotonic() + 10
        while service.sessions and time.monotonic() < deadline:
            time.sleep(0.05)
        assert service.sessions == 0
        assert_engine_empty(service)
        assert all(r.finish_reason is FinishReason.CANCELLED for r in requests)
    finally:
        service.stop()


def test_an_exception_inside_one_request_fails_it_and_the_others_go_on(service, qwen, monkeypatch) -> None:
    import batching.engine.sampling as sampling

    real_choose = sampling.RequestSampler.choose

    def choose(self, logits, history):
        if self.params.seed == 666:
            raise ValueError("tokenizer exploded")
        return real_choose(self, logits, history)

    monkeypatch.setattr(sampling.RequestSampler, "choose", choose)
    session = service.open_session()
    bad = session.submit([5, 6, 7], RequestParams(10, sampling=SamplingParams(do_sample=True, seed=666)))
    good = session.submit([8, 9], RequestParams(10, ignore_eos=True))
    finished = {e.request_id: e for e in drain(session) if isinstance(e, FinishedEvent)}
    assert finished[bad.request_id].reason is FinishReason.ERROR
    assert "tokenizer exploded" in finished[bad.request_id].error
    assert list(finished[good.request_id].output_ids) == reference(qwen.model, [8, 9], 10, ignore_eos=True)
    assert service.alive


def test_a_dead_engine_thread_fails_its_requests_and_restarts_on_the_next_page_load(service, monkeypatch) -> None:
    session = service.open_session()
    batcher = service.batcher

    def die() -> list:
        raise MemoryError("simulated crash of the engine thread")

    monkeypatch.setattr(batcher, "step", die)
    request = session.submit([5, 6, 7], RequestParams(50))
    events = drain(session, until=10)
    finished = [e for e in events if isinstance(e, FinishedEvent)]
    assert [e.request_id for e in finished] == [request.request_id]
    assert finished[0].reason is FinishReason.ERROR and "engine stopped" in finished[0].error
    assert not service.alive
    with pytest.raises(RuntimeError, match="reload the page"):
        session.submit([5], RequestParams(3))

    assert service.ensure_running() is True
    assert service.alive and service.restarts == 1 and service.batcher is not batcher
    assert service.ensure_running() is False
    again = session.submit([5, 6, 7], RequestParams(4, ignore_eos=True))
    done = [e for e in drain(session) if isinstance(e, FinishedEvent)]
    assert done[0].request_id == again.request_id and done[0].reason is FinishReason.LENGTH
