"""A race waits for its compiled graphs before its first step, so a first race times the same steps as a later one
(eager and compiled steps read different speed-ups: a compiled step's time grows with its rows, an eager one's
hardly does). Compiles a tiny model's decode graph for real: one of the background modules (tests/conftest.py)."""

from __future__ import annotations

import time

import pytest

from batching.arrivals import Schedule
from batching.engine.batcher import MODES
from batching.engine.events import FinishedEvent
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams
from batching.engine.request import FinishReason
from batching.race import LaneStep
from batching.runs import RunRecord
from batching.service import EngineClient, EngineConfig, RaceHandle
from batching.service.messages import RaceEnded
from config.settings import EngineSettings, LimitSettings, ModelSettings, TokenizerSettings

# A shape no other test compiles; kernels the compiler does not time; no graph of prompt steps (half the compile).
OPTIONS = BatcherOptions(
    max_batch_size=3,
    max_batched_tokens=64,
    compile_steps=True,
    compile_autotune=False,
    compile_prompt_steps=False,
)
CAPS = (12, 4, 9, 3)
RACE_TIMEOUT_S = 900.0


def _race(client: EngineClient, prefix: str) -> RaceHandle:
    items = [
        (f"Question {index}: why wait?", RequestParams(cap, ignore_eos=True), f"{prefix}{index}")
        for index, cap in enumerate(CAPS)
    ]
    return client.private.start_race(OPTIONS, items, Schedule.at_once(len(items)))


def _to_the_end(race: RaceHandle) -> tuple[dict[str, RunRecord], RaceEnded]:
    records = {mode: RunRecord(mode, 0.0) for mode in MODES}
    deadline = time.monotonic() + RACE_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            for message in race.poll(timeout=0.2):
                if isinstance(message, LaneStep):
                    records[message.mode].extend(message.events)
                elif isinstance(message, RaceEnded):
                    return records, message
    finally:
        race.close()
    raise AssertionError(f"the race did not end within {RACE_TIMEOUT_S:.0f} s")


@pytest.mark.long
def test_a_race_waits_for_its_graphs_so_every_decode_step_of_both_lanes_runs_compiled(tiny_model_dirs, tmp_path):
    config = EngineConfig(
        ModelSettings(name_or_path=str(tiny_model_dirs["qwen2"]), device="cpu", dtype="float32"),
        TokenizerSettings(),
        EngineSettings(compile_steps=True, compile_cache_dir=tmp_path / "graphs"),  # an empty cache: a real compile
    )
    client = EngineClient(config, LimitSettings())
    try:
        # Stopped while it waits: it ends at once, on neither lane did a request run.
        stopped = _race(client, "s/")
        stopped.stop()
        records, ended = _to_the_end(stopped)
        assert ended.error is None
        for record in records.values():
            assert all(event.reason is FinishReason.CANCELLED for event in record.finished)
            assert not any(event.decode_tokens for event in record.steps)
        assert client.lifecycle.stats.compile.stage == "compiling"

        records, ended = _to_the_end(_race(client, "r/"))
        assert ended.error is None
        for record in records.values():
            decode = [event for event in record.steps if event.decode_tokens and not event.prefill_tokens]
            assert decode and all(event.compiled for event in decode), [event.compiled for event in decode]
            finished = {event.request_id: event for event in record.finished if isinstance(event, FinishedEvent)}
            assert [finished[f"r/{index}"].output_tokens for index in range(len(CAPS))] == list(CAPS)
    finally:
        client.close()
