"""Helpers for the engine tests, which the tests of the layers above it use too: load a tiny model once, random
prompts, reference outputs, a run with late arrivals."""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator
from functools import cache

import torch

from batching.engine.batcher import Batcher
from batching.engine.events import Event, FinishedEvent, StepEvent
from batching.engine.params import RequestParams
from batching.engine.torch_gate import door_state
from config.settings import ModelSettings
from model.loader import LoadedModel, load_model


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """One torch thread, as the engine process runs a small model: on shared cores two threads mostly wait on each
    other (with other work on this machine, the eager matrix took 491 s on two threads and 33 s on one, and a
    compiled step 53 ms instead of 0.6). Compiled graphs are guarded on the count: keep it the same across tests."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def door_open() -> bool:
    """Whether compiled steps go through torch's internals here (the checked torch, the setting on): the door's own
    pieces (direct calls, frozen graphs kept on disk) are tested only then; the rest on either route."""
    return door_state().open


# How a ready graph's compiled steps run: called directly through the door; through `torch.compile`'s entry without.
def ready_path() -> str:
    return "direct" if door_open() else "compiled"


# The device and dtype the engine tests load their models on: the CPU in float32, as CI runs them, unless a GPU check
# asks for another (scripts/gpu_check.sh: BATCHSCOPE_TEST_DEVICE=cuda BATCHSCOPE_TEST_DTYPE=bfloat16). `generate`,
# the reference, runs on the same device and dtype.
TEST_DEVICE = os.environ.get("BATCHSCOPE_TEST_DEVICE", "cpu")
TEST_DTYPE = os.environ.get("BATCHSCOPE_TEST_DTYPE", "float32")

# The attention implementation each model was loaded with: references run on it, not on the engine's.
_NATIVE_ATTENTION: dict[int, str] = {}


@cache
def loaded(folder: str, dtype: str | None = None) -> LoadedModel:
    model = load_model(ModelSettings(name_or_path=folder, device=TEST_DEVICE, dtype=dtype or TEST_DTYPE))
    _NATIVE_ATTENTION[id(model.model)] = model.model.config._attn_implementation
    return model


def reference(model, prompt_ids: list[int], max_new_tokens: int, ignore_eos: bool = False) -> list[int]:
    """What `model.generate` gives for one prompt alone, greedy (memoised: several tests ask the same)."""
    return list(_reference(model, tuple(prompt_ids), max_new_tokens, ignore_eos))


@cache
def _reference(model, prompt_ids: tuple[int, ...], max_new_tokens: int, ignore_eos: bool) -> tuple[int, ...]:
    # generate() fills unset values from the model's own generation config, so EOS is switched off there.
    eos = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = None if ignore_eos else eos
    try:
        with native_attention(model), torch.inference_mode():
            output = model.generate(
                torch.tensor([prompt_ids], device=model.device),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                attention_mask=None,
            )
    finally:
        model.generation_config.eos_token_id = eos
    return tuple(output[0, len(prompt_ids) :].tolist())


@contextlib.contextmanager
def native_attention(model) -> Iterator[None]:
    """The model on the attention it was loaded with (`loaded`), not the engine's, for a reference run."""
    engine_attention = model.config._attn_implementation
    model.set_attn_implementation(_NATIVE_ATTENTION.get(id(model), engine_attention))
    try:
        yield
    finally:
        model.set_attn_implementation(engine_attention)


def random_prompts(count: int, vocab: int, seed: int, longest: int = 40) -> list[list[int]]:
    rng = random.Random(seed)
    # Ids from 3 up: 0-2 are the tiny tokenizer's pad/bos/eos.
    return [[rng.randrange(3, vocab) for _ in range(rng.randrange(1, longest))] for _ in range(count)]


def finished_by_id(events: list[Event]) -> dict[str, FinishedEvent]:
    return {event.request_id: event for event in events if isinstance(event, FinishedEvent)}


def steps_of(events: list[Event]) -> list[StepEvent]:
    return [event for event in events if isinstance(event, StepEvent)]


def run_with_late_arrivals(
    batcher: Batcher,
    prompts: list,
    caps: list[int],
    late_from: int,
    join_at_step: int,
    ignore_eos: bool = False,
    events: list[Event] | None = None,
) -> dict[int, list[int]]:
    """Submit the first requests at once and the rest while the batch is already running; outputs by index.
    `events`, when given, receives every event of the run."""

    def add(prompt: list, cap: int) -> str:
        return batcher.add(prompt, RequestParams(cap, ignore_eos=ignore_eos)).request_id

    ids = [add(p, c) for p, c in zip(prompts[:late_from], caps[:late_from], strict=True)]
    events = [] if events is None else events
    while batcher.has_work or len(ids) < len(prompts):
        if batcher.step_index == join_at_step and len(ids) < len(prompts):
            ids += [add(p, c) for p, c in zip(prompts[late_from:], caps[late_from:], strict=True)]
        events += batcher.step()
    finished = finished_by_id(events)
    return {i: list(finished[request_id].output_ids) for i, request_id in enumerate(ids)}
