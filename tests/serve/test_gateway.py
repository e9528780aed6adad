"""The API's gateway to a real engine process (a tiny model): a request is prepared off the event loop, and one
whose client leaves while it is prepared is cancelled."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from batching.engine.events import FinishedEvent
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams
from batching.engine.request import FinishReason
from batching.serve.gateway import Gateway
from batching.service import EngineClient, EngineConfig
from config.settings import EngineSettings, ModelSettings, TokenizerSettings

OPTIONS = BatcherOptions(max_batch_size=4, max_batched_tokens=64)
WAIT_S = 30.0  # a wait that only a broken feature exhausts


@pytest.fixture(scope="module")
def gateway(tiny_model_dirs) -> Iterator[Gateway]:
    config = EngineConfig(
        ModelSettings(name_or_path=str(tiny_model_dirs["qwen2"]), device="cpu", dtype="float32"),
        TokenizerSettings(),
        EngineSettings(compile_steps=False),
    )
    service = EngineClient(config)
    made = Gateway(service, OPTIONS, 16)
    yield made
    made.close()
    service.close()


async def _until(condition, seconds: float = WAIT_S) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return condition()


def test_a_request_is_prepared_while_the_event_loop_goes_on(gateway: Gateway) -> None:
    """The prepare step waits for a signal only the event loop can send: were it run on the loop, it never comes."""
    started, signalled = threading.Event(), threading.Event()

    def prepare() -> tuple[list[int], RequestParams]:
        started.set()
        assert signalled.wait(WAIT_S), "the event loop stood still while a request was prepared"
        return [5, 6, 7], RequestParams(4, ignore_eos=True)

    async def run() -> FinishedEvent:
        submitted = asyncio.create_task(gateway.submit(prepare))
        assert await _until(started.is_set)
        signalled.set()  # from the event loop, while `prepare` waits in its thread
        stream = await submitted
        while not isinstance(event := await stream.events.get(), FinishedEvent):
            pass
        gateway.forget(stream.request.request_id)
        return event

    finished = asyncio.run(run())
    assert finished.reason is FinishReason.LENGTH and finished.output_tokens == 4


def test_a_request_whose_client_leaves_while_it_is_prepared_is_cancelled(gateway: Gateway) -> None:
    release = threading.Event()
    aborted = gateway.metrics.success.labels(finished_reason="abort")
    before = aborted._value.get()

    def prepare() -> tuple[list[int], RequestParams]:
        release.wait(WAIT_S)
        return [5, 6, 7], RequestParams(200, ignore_eos=True)

    async def run() -> None:
        submitted = asyncio.create_task(gateway.submit(prepare))
        await asyncio.sleep(0.05)
        submitted.cancel()
        with pytest.raises(asyncio.CancelledError):
            await submitted
        release.set()
        assert await _until(lambda: aborted._value.get() == before + 1)

    asyncio.run(run())
    assert gateway.service.router.in_flight() == 0
