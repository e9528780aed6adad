"""The engine process and its client: many sessions at once, limits, shared batchers per batch size, dead sessions, a
failing request, a private replay timed on its own clock, step times under load, and kill -9 of the process."""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time
from dataclasses import replace

import pytest
import torch

from batching.arrivals import Schedule
from batching.engine.events import FinishedEvent, StepEvent, TokenEvent
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams, SamplingParams
from batching.engine.request import FinishReason, Request
from batching.engine.torch_gate import door_state
from batching.service import EngineClient, EngineConfig, EngineDeadError, QueueFullError
from batching.service.launch import EngineProcess
from batching.service.messages import Heartbeat, Outputs, Ready, Shutdown, Submit
from config.settings import EngineSettings, LimitSettings, ModelSettings, TokenizerSettings
from tests.engine.helpers import loaded, random_prompts, reference
from tests.service.helpers import FAILING_SEED, fail_sampling_with_seed_666

OPTIONS = BatcherOptions(max_batch_size=8, max_batched_tokens=64)
MAX_SHARED_BATCHERS = 3
SESSION_TIMEOUT_S = 3.0
IDLE_BATCHER_S = 1.0


@pytest.fixture(scope="module")
def qwen(tiny_model_dirs):
    """The model in this process, for reference outputs: on one torch thread, as the engine process runs it (two
    threads next to the engine process on two busy cores made `generate` many times slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield loaded(str(tiny_model_dirs["qwen2"]))
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def client(tiny_model_dirs):
    config = EngineConfig(
        ModelSettings(name_or_path=str(tiny_model_dirs["qwen2"]), device="cpu", dtype="float32"),
        TokenizerSettings(),
        EngineSettings(
            max_shared_batchers=MAX_SHARED_BATCHERS,
            idle_shared_batcher_timeout_s=IDLE_BATCHER_S,
            session_timeout_s=SESSION_TIMEOUT_S,
            compile_steps=False,
        ),
        initializer=fail_sampling_with_seed_666,
    )
    made = EngineClient(config, LimitSettings(max_queue_per_session=16, max_queue_total=200))
    yield made
    made.close()


def drain(session, until: float = 60.0) -> list:
    events, deadline = [], time.monotonic() + until
    while session.pending and time.monotonic() < deadline:
        events += session.poll(timeout=0.05)
    return events + session.poll()


def wait_for(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not (met := condition()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return met


def ready_of(process: EngineProcess) -> Ready:
    """The engine process's `Ready`, past the heartbeats it sends from the start."""
    while isinstance(message := process.outputs.recv(), Heartbeat):
        pass
    assert isinstance(message, Ready), message
    return message


def assert_engine_empty(client: EngineClient) -> None:
    """Nothing in flight, and every shared batcher closed for idleness (the engine closes only batchers without
    work: nothing waiting, running or held)."""
    assert wait_for(lambda: client.router.in_flight() == 0)
    assert wait_for(lambda: client.lifecycle.stats.shared == (), IDLE_BATCHER_S + 5), client.lifecycle.stats


def test_eight_clients_sixteen_requests_each_with_random_cancellations(client, qwen) -> None:
    results: dict[int, dict] = {}
    errors: list[BaseException] = []
    all_steps: list[StepEvent] = []

    def one_client(index: int) -> None:
        try:
            rng = random.Random(index)
            session = client.open_session(OPTIONS)
            prompts = random_prompts(16, vocab=300, seed=100 + index, longest=20)
            caps = [rng.randrange(1, 40) for _ in prompts]
            requests = [
                session.submit(p, RequestParams(c, ignore_eos=rng.random() < 0.5))
                for p, c in zip(prompts, caps, strict=True)
            ]
            doomed = {r.request_id for r in rng.sample(requests, 3)}
            events = session.poll(timeout=0.05)
            for request_id in doomed:
                session.cancel(request_id)
            events += drain(session)
            results[index] = {"session": session, "requests": requests, "doomed": doomed, "events": events}
            all_steps.extend(e for e in events if isinstance(e, StepEvent))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=one_client, args=(i,)) for i in range(8)]
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
                qwen.model, list(request.prompt_ids), request.params.max_new_tokens, request.params.ignore_eos
            )
            assert list(done.output_ids) == expected
    assert max(s.active for s in all_steps) == 8, "requests of different clients shared the batch"
    shared = [s for s in all_steps if len({rid.split("/")[0] for rid in s.slots if rid}) > 1]
    assert shared, "no step ever held requests of two sessions"
    assert_engine_empty(client)


def test_requests_beyond_the_queue_limits_are_refused_with_a_message(client) -> None:
    limits, client.admission.limits = client.admission.limits, LimitSettings(max_queue_per_session=3, max_queue_total=5)
    try:
        first, second = client.open_session(OPTIONS), client.open_session(OPTIONS)
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
        reasons = {e.reason for e in drain(first) + drain(second) if isinstance(e, FinishedEvent)}
        assert reasons == {FinishReason.CANCELLED}
    finally:
        client.admission.limits = limits
    assert_engine_empty(client)


def test_bad_input_is_refused_with_the_engines_message_without_reaching_the_engine(client) -> None:
    session = client.open_session(OPTIONS)
    with pytest.raises(ValueError, match="prompt is empty"):
        session.submit("", RequestParams(5))
    with pytest.raises(ValueError, match="prompt has 600 tokens, more than the 511 allowed"):
        session.submit([5] * 600, RequestParams(5))
    with pytest.raises(ValueError, match="max_new_tokens=600 is too large"):
        session.submit([5, 6], RequestParams(600))
    small_pool = client.open_session(replace(OPTIONS, kv_cache_tokens=64))
    with pytest.raises(ValueError, match=r"too large for the KV cache: .* the whole cache holds 64"):
        small_pool.submit([5, 6], RequestParams(63))
    assert not session.pending and not small_pool.pending and client.router.in_flight() == 0


def test_a_session_that_stops_polling_is_dropped_and_its_requests_cancelled(client) -> None:
    one_slot = BatcherOptions(max_batch_size=1, max_batched_tokens=64)
    gone, idle = client.open_session(one_slot), client.open_session(OPTIONS)
    silent_since = time.perf_counter()  # no later than the session was last seen (its submits below)
    requests = [gone.submit([5, 6, 7], RequestParams(500, ignore_eos=True)) for _ in range(16)]  # 8,000 steps
    assert wait_for(lambda: client.router.in_flight() == 0, 300)
    assert gone.closed and wait_for(
        lambda: idle.closed and len(client.router.sessions) == 0
    )  # the idle session went too
    finished = [e for e in gone.poll() if isinstance(e, FinishedEvent)]
    assert sorted(e.request_id for e in finished) == sorted(r.request_id for r in requests)  # one finish each
    # Whatever this machine's speed: requests done before the tab was declared gone ended by their cap, the rest
    # were cancelled, and none before the session's timeout ran out. The last one cannot finish by itself first
    # (8,000 steps): a request was cancelled.
    reasons = [e.reason for e in finished]
    assert set(reasons) <= {FinishReason.LENGTH, FinishReason.CANCELLED} and FinishReason.CANCELLED in reasons
    cancelled = [e for e in finished if e.reason is FinishReason.CANCELLED]
    assert all(e.finished >= silent_since + SESSION_TIMEOUT_S for e in cancelled)
    by_cap = [e.finished for e in finished if e.reason is FinishReason.LENGTH]
    assert not by_cap or max(by_cap) <= min(e.finished for e in cancelled)  # the queue's tail was cancelled


def test_an_exception_inside_one_request_fails_it_and_the_others_go_on(client, qwen) -> None:
    session = client.open_session(OPTIONS)
    bad = session.submit([5, 6, 7], RequestParams(10, sampling=SamplingParams(do_sample=True, seed=FAILING_SEED)))
    good = session.submit([8, 9], RequestParams(10, ignore_eos=True))
    finished = {e.request_id: e for e in drain(session) if isinstance(e, FinishedEvent)}
    assert finished[bad.request_id].reason is FinishReason.ERROR
    assert "tokenizer exploded" in finished[bad.request_id].error
    assert list(finished[good.request_id].output_ids) == reference(qwen.model, [8, 9], 10, ignore_eos=True)
    assert client.lifecycle.alive


def test_sliding_the_batch_size_through_every_value_keeps_at_most_max_shared_batchers_alive(client) -> None:
    seen = []
    for slots in range(1, 17):
        session = client.open_session(BatcherOptions(max_batch_size=slots, max_batched_tokens=64))
        session.submit([5, 6, 7], RequestParams(2))
        drain(session)
        seen.append(client.lifecycle.stats.live_batchers)
        assert 1 <= client.lifecycle.stats.live_batchers <= MAX_SHARED_BATCHERS, client.lifecycle.stats
    assert max(seen) == MAX_SHARED_BATCHERS
    assert_engine_empty(client)  # and idle ones are closed after idle_shared_batcher_timeout_s


def test_a_new_batch_size_is_refused_while_every_shared_batcher_is_busy(client) -> None:
    sessions = [client.open_session(BatcherOptions(max_batch_size=s, max_batched_tokens=64)) for s in (1, 2, 3)]
    for session in sessions:
        session.submit([5, 6, 7], RequestParams(400, ignore_eos=True))
    late = client.open_session(BatcherOptions(max_batch_size=4, max_batched_tokens=64))
    with pytest.raises(QueueFullError, match=f"max_shared_batchers={MAX_SHARED_BATCHERS}"):
        late.submit([5, 6, 7], RequestParams(2))
    sessions[0].submit([5, 6], RequestParams(2))  # a batch size in use is still fine
    for session in sessions:
        session.cancel_all()
        drain(session)
    assert late.submit([5, 6, 7], RequestParams(2)).request_id
    drain(late)
    assert_engine_empty(client)


def replay_items(count: int) -> tuple[list, Schedule]:
    prompts = random_prompts(count, vocab=300, seed=7, longest=20)
    items = [(p, RequestParams(8 + 6 * (i % 5), ignore_eos=True), f"r/{i}") for i, p in enumerate(prompts)]
    return items, Schedule.timed([0.02 * i for i in range(count)])


def best_replay(client: EngineClient, tries: int = 2) -> float:
    items, schedule = replay_items(16)
    walls = []
    for _ in range(tries):
        with client.private.open_private("continuous", OPTIONS) as private:
            record = private.run(items, schedule).complete()
        assert len(record.finished) == 16 and record.steps
        walls.append(record.wall_s)
    return min(walls)


class KeepBusy:
    """Another client keeping a shared batcher full of long requests while the test measures something else."""

    def __init__(self, client: EngineClient) -> None:
        self.session = client.open_session(OPTIONS)
        self.steps: list[StepEvent] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            while len(self.session.pending) < 10:
                self.session.submit([5, 6, 7, 8], RequestParams(60, ignore_eos=True))
            self.steps += [e for e in self.session.poll(timeout=0.05) if isinstance(e, StepEvent)]

    def __enter__(self) -> KeepBusy:
        self.thread.start()
        assert wait_for(lambda: len(self.steps) > 20)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
        self.session.cancel_all()
        drain(self.session)


def test_a_private_replay_counts_only_its_own_steps_while_the_shared_engine_is_busy(client) -> None:
    alone = best_replay(client)
    with KeepBusy(client) as busy:
        started = time.perf_counter()
        loaded_wall = best_replay(client)
        real = (time.perf_counter() - started) / 2
        shared_steps = len(busy.steps)
    ratio = loaded_wall / alone
    print(
        f"\nprivate replay: {alone:.3f} s alone, {loaded_wall:.3f} s with a shared batcher busy ({ratio:.2f}x); "
        f"{real:.3f} s of real time each, {shared_steps} shared steps meanwhile"
    )
    assert shared_steps > 40, "the shared batcher was not busy during the replay"
    assert ratio < 1.5, f"the private clock counted other batchers' steps: {ratio:.2f}x"


def hold_the_gil(seconds: float) -> tuple[float, float]:
    """Pure-Python work in this thread with thread switches held off, so no other thread of this process (a batcher
    stepping in a thread, the client's router) runs meanwhile: what a tab's long rerun does at worst. Returns the
    window, on the monotonic clock every process on this machine reads (`time.perf_counter`)."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(seconds * 10)
    try:
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            sorted(range(1_000), key=lambda value: -value)
        return start, time.perf_counter()
    finally:
        sys.setswitchinterval(interval)


def test_the_engine_steps_on_while_its_client_process_holds_the_gil(client) -> None:
    """The engine steps in a process of its own: while a thread of the client's process holds the GIL, the engine's
    steps go on (a batcher in a thread of that process would take none). Counted from the steps' own times, not timed:
    a StepEvent's start and end come from the engine process's reading of the same monotonic clock."""
    session = client.open_session(OPTIONS)
    for prompt in random_prompts(8, vocab=300, seed=3, longest=10):
        session.submit(prompt, RequestParams(300, ignore_eos=True))
    seen: list = []
    assert wait_for(lambda: any(isinstance(e, StepEvent) for e in seen) or bool(seen.extend(session.poll())))
    start, end = hold_the_gil(1.0)
    events = seen + drain(session)
    steps = [event for event in events if isinstance(event, StepEvent)]
    assert any(start < step.start and step.end < end for step in steps), "no engine step while the GIL was held"
    finished = [event for event in events if isinstance(event, FinishedEvent)]
    assert len(finished) == 8 and {event.reason for event in finished} == {FinishReason.LENGTH}


def test_kill_9_of_the_engine_process_ends_waiting_requests_and_it_is_restarted_at_once(client, qwen) -> None:
    session = client.open_session(OPTIONS)
    waiting = [session.submit([5, 6, 7], RequestParams(400, ignore_eos=True)) for _ in range(3)]
    items, schedule = replay_items(4)
    private = client.private.open_private("static", OPTIONS)
    run = private.run([(p, RequestParams(400, ignore_eos=True), rid) for p, _, rid in items], schedule)
    assert wait_for(lambda: any(isinstance(e, TokenEvent) for e in session.poll()))
    old_pid, restarts = client.lifecycle.pid, client.lifecycle.restarts
    os.kill(old_pid, signal.SIGKILL)

    events = drain(session, until=10)
    finished = [e for e in events if isinstance(e, FinishedEvent)]
    assert sorted(e.request_id for e in finished) == sorted(r.request_id for r in waiting)  # one each
    assert all(e.reason is FinishReason.ERROR for e in finished)
    assert "killed by signal 9" in finished[0].error and "being restarted" in finished[0].error
    assert "page" not in finished[0].error  # API clients read it too
    with pytest.raises(EngineDeadError, match="killed by signal 9"):
        run.complete()
    assert wait_for(lambda: client.lifecycle.alive, 60)  # restarted with no call asking for it
    assert client.lifecycle.restarts == restarts + 1 and client.lifecycle.pid != old_pid
    assert client.lifecycle.restart_causes["exited"] == 1
    assert client.lifecycle.ensure_running() is False

    again = session.submit([8, 9], RequestParams(6, ignore_eos=True))
    done = [e for e in drain(session) if isinstance(e, FinishedEvent)]
    assert [e.request_id for e in done] == [again.request_id]
    assert list(done[0].output_ids) == reference(qwen.model, [8, 9], 6, ignore_eos=True)
    private.close()


def test_the_engine_also_starts_in_a_fresh_interpreter_and_speaks_the_same_protocol(tiny_model_dirs, qwen) -> None:
    """The start used when the client's process has initialised CUDA (a fork could not use it)."""
    settings = ModelSettings(name_or_path=str(tiny_model_dirs["qwen2"]), device="cpu", dtype="float32")
    config = EngineConfig(settings, TokenizerSettings(), EngineSettings(compile_steps=False))
    process = EngineProcess(config, fresh=True)
    try:
        ready = ready_of(process)
        assert ready.info.pid == process.pid != os.getpid()
        process.commands.send(Submit(OPTIONS, Request("t/1", [8, 9], RequestParams(6, ignore_eos=True))))
        events: list = []
        while not any(isinstance(e, FinishedEvent) for e in events):
            message = process.outputs.recv()
            events += message.events if isinstance(message, Outputs) else ()
        finished = next(e for e in events if isinstance(e, FinishedEvent))
        assert list(finished.output_ids) == reference(qwen.model, [8, 9], 6, ignore_eos=True)
        process.commands.send(Shutdown())
        process.wait(10)
        assert process.exit_code() == 0
    finally:
        if process.exit_code() is None:
            process.kill()


def test_a_client_that_imported_gptqmodel_starts_its_engine_fresh_and_it_serves_a_gptq_model(family_model_dirs):
    """gptqmodel's log writer is a thread a forked child lacks (its first log line would wait forever), so a client
    that imported it (here the fixture that quantised the GPTQ families) starts a fresh interpreter, as with CUDA."""
    folder = family_model_dirs["qwen2_gptq"]
    assert "gptqmodel" in sys.modules
    settings = ModelSettings(name_or_path=str(folder), device="cpu", dtype="float32")
    process = EngineProcess(EngineConfig(settings, TokenizerSettings(), EngineSettings(compile_steps=False)))
    try:
        ready = ready_of(process)
        # Read once it is ready: between fork and exec a child's command line reads empty.
        with open(f"/proc/{process.pid}/cmdline", "rb") as cmdline:
            assert b"batching.service" in cmdline.read()
        assert ready.info.weights.startswith("4-bit GPTQ, group 64 weights")
        process.commands.send(Submit(OPTIONS, Request("g/1", [8, 9, 10], RequestParams(6, ignore_eos=True))))
        events: list = []
        while not any(isinstance(e, FinishedEvent) for e in events):
            message = process.outputs.recv()
            events += message.events if isinstance(message, Outputs) else ()
        finished = next(e for e in events if isinstance(e, FinishedEvent))
        assert list(finished.output_ids) == reference(loaded(str(folder)).model, [8, 9, 10], 6, ignore_eos=True)
        process.commands.send(Shutdown())
        process.wait(10)
    finally:
        if process.exit_code() is None:
            process.kill()


@pytest.mark.long
def test_the_engine_answers_while_its_steps_compile_then_says_they_are_compiled(tiny_model_dirs, qwen, tmp_path):
    """The default: an engine starts eager, the first decode steps start the compile in the background, requests
    are answered meanwhile, and the engine says when its steps are compiled; answers stay exact throughout."""
    config = EngineConfig(
        ModelSettings(name_or_path=str(tiny_model_dirs["qwen2"]), device="cpu", dtype="float32"),
        TokenizerSettings(),
        EngineSettings(compile_steps=True, compile_cache_dir=tmp_path / "graphs"),  # an empty cache: a real compile
    )
    compiling = EngineClient(config, LimitSettings())
    try:
        # A shape no other test compiles; kernels the compiler does not time (a compile of half the time).
        options = replace(OPTIONS, max_batch_size=5, compile_steps=True, compile_autotune=False)
        session = compiling.open_session(options)
        assert wait_for(lambda: compiling.lifecycle.stats.compile.stage == "waiting")
        # It said at its start which way its compiled steps run (as the settings leave the door to torch's internals).
        assert compiling.info.compile_route == door_state(allowed=config.engine.torch_internals).line
        stages, answered_while_compiling = set(), 0
        prompts = random_prompts(40, vocab=300, seed=11, longest=12)
        index = 0
        deadline = time.monotonic() + 600
        while compiling.lifecycle.stats.compile.stage != "compiled" and time.monotonic() < deadline:
            stages.add(compiling.lifecycle.stats.compile.stage)
            if len(session.pending) < 5 and index < len(prompts):
                session.submit(prompts[index], RequestParams(60, ignore_eos=True))
                index += 1
            for event in session.poll(timeout=0.05):
                if isinstance(event, FinishedEvent):
                    assert event.reason is FinishReason.LENGTH, event.error
                    answered_while_compiling += compiling.lifecycle.stats.compile.stage == "compiling"
        state = compiling.lifecycle.stats.compile
        assert state.stage == "compiled" and state.seconds is not None and state.seconds > 0, (state, stages)
        assert "compiling" in stages and answered_while_compiling >= 1
        drain(session)
        after = [session.submit(prompt, RequestParams(30, ignore_eos=True)) for prompt in prompts[:4]]
        done = {e.request_id: e for e in drain(session) if isinstance(e, FinishedEvent)}
        for submitted, prompt in zip(after, prompts[:4], strict=True):
            want = reference(qwen.model, prompt, 30, ignore_eos=True)
            assert list(done[submitted.request_id].output_ids) == want
    finally:
        compiling.close()


def test_the_engine_loop_holds_compiles_while_a_batcher_has_work_and_releases_them_when_idle(qwen) -> None:
    """No step shares the cores with a compile: the loop holds background compiles from the moment a request
    arrives until the last batcher is idle (see `pause_compiles`)."""
    from multiprocessing import Pipe

    from batching.engine.compiled import compiles_paused
    from batching.service.core import EngineCore
    from batching.service.process import run_loop

    commands_out, commands_in = Pipe(duplex=False)
    outputs: list[object] = []
    core = EngineCore(qwen.model, qwen.tokenizer, EngineSettings(compile_steps=False), outputs.append)
    loop = threading.Thread(target=run_loop, args=(core, commands_out, os.getppid()), daemon=True)
    loop.start()
    try:
        assert wait_for(lambda: not compiles_paused())  # idle: compiles may run
        request = Request("r1", random_prompts(1, vocab=300, seed=3, longest=8)[0], RequestParams(400, ignore_eos=True))
        commands_in.send(Submit(OPTIONS, request))
        assert wait_for(compiles_paused)  # working: held
        held_while_working = []
        while True:
            held = compiles_paused()
            # The finished event is emitted before the loop releases compiles: not out yet, the sample was taken
            # while the request ran.
            if any(isinstance(o, Outputs) and any(isinstance(e, FinishedEvent) for e in o.events) for o in outputs):
                break
            held_while_working.append(held)
            time.sleep(0.01)
        assert held_while_working and all(held_while_working)
        assert wait_for(lambda: not compiles_paused())  # idle again: released
    finally:
        commands_in.send(Shutdown())
        loop.join(10)
