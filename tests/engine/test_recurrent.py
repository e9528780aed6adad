"""Hybrid models' per-request conv and SSM states: what the probe finds, and that each part of their handling is
what keeps the families matrix (test_families.py) exact: with it removed, answers differ from `generate`."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from batching.engine import recurrent
from batching.engine.batcher import Batcher
from batching.engine.compiled import StepCompiler
from batching.engine.events import Event
from batching.engine.model_support import kv_bytes_per_token, recurrent_state_bytes
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams
from batching.engine.recurrent import RecurrentStates, recurrent_layout
from tests.engine.families import FAMILIES
from tests.engine.helpers import (
    finished_by_id,
    loaded,
    one_torch_thread,
    random_prompts,
    reference,
    run_with_late_arrivals,
)
from tests.tiny_models import save_tiny_models

RECURRENT = [family.name for family in FAMILIES if family.recurrent]
CAPS = [1, 30, 3, 17, 20, 2]


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def _prompts() -> list[list[int]]:
    return random_prompts(len(CAPS), vocab=300, seed=21, longest=30)


def _differs(name: str, family_model_dirs, mode: str = "continuous", prompts: list[list[int]] | None = None) -> int:
    """How many of the requests differ from `generate` (chunked prefill under a small budget, late joins)."""
    model = loaded(str(family_model_dirs[name]))
    prompts = prompts or _prompts()
    expected = [reference(model.model, p, c, ignore_eos=True) for p, c in zip(prompts, CAPS, strict=True)]
    batcher = Batcher(model.model, model.tokenizer, BatcherOptions(max_batch_size=3, max_batched_tokens=12), mode=mode)
    outputs = run_with_late_arrivals(batcher, prompts, CAPS, late_from=4, join_at_step=3, ignore_eos=True)
    return sum(outputs[i] != want for i, want in enumerate(expected))


def test_the_probe_finds_each_layers_state_and_the_module_that_keeps_it(family_model_dirs) -> None:
    model = loaded(str(family_model_dirs["lfm2"])).model
    layout = recurrent_layout(model)
    assert layout is not None and layout.cache_kwarg == "past_key_values" and layout.continues_chunks
    [conv] = layout.layers
    assert (conv.layer, conv.conv, conv.recurrent) == (0, ((64, 3),), ())  # hidden 64, kernel 3, no SSM state
    assert layout.mixers == (model.model.layers[0].conv,)
    assert recurrent_state_bytes(model) == 64 * 3 * 4
    assert kv_bytes_per_token(model) == 1 * 2 * 2 * 16 * 4  # the one attention layer's keys and values
    mamba2 = recurrent_layout(loaded(str(family_model_dirs["mamba2"])).model)
    assert mamba2 is not None and mamba2.cache_kwarg == "cache_params" and len(mamba2.layers) == 2
    assert all(layer.recurrent == ((4, 32, 8),) for layer in mamba2.layers)  # heads, head dim, state size
    assert recurrent_layout(loaded(str(family_model_dirs["llama"])).model) is None


def test_mamba_ones_scan_cannot_start_from_a_state_so_its_later_chunks_go_token_by_token(family_model_dirs) -> None:
    continues = {name: recurrent_layout(loaded(str(family_model_dirs[name])).model) for name in RECURRENT}
    assert {name for name, layout in continues.items() if layout and not layout.continues_chunks} == {"mamba", "jamba"}


@pytest.mark.parametrize("name", RECURRENT)
def test_without_running_each_request_through_its_own_state_answers_differ(
    family_model_dirs, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The matrix's check fails with the per-request split removed: the packed sequence runs through the mixers as
    one sequence (a convolution or scan across requests), from one shared state."""
    model = loaded(str(family_model_dirs[name])).model
    layout = recurrent_layout(model)
    assert layout is not None
    assert _differs(name, family_model_dirs) == 0
    for mixer in layout.mixers:
        monkeypatch.setattr(mixer, "forward", _one_sequence(mixer, type(mixer).forward.__get__(mixer)))
    assert _differs(name, family_model_dirs) > 0, f"{name}: answers stayed exact with the mixers unsplit"


def _one_sequence(mixer: torch.nn.Module, original):
    """The model's own mixer over the whole packed step, with the states of row 0 only (no split per request)."""

    def forward(hidden_states: torch.Tensor, *args, **kwargs):
        cache = next(value for value in (*args, *kwargs.values()) if hasattr(value, "recurrent_states"))
        states: RecurrentStates = cache.recurrent_states
        rows = torch.tensor([0])
        states.select(mixer.layer_idx, rows, fresh=False)
        kwargs = {key: value for key, value in kwargs.items() if key in ("past_key_values", "cache_params")}
        output = original(hidden_states, *args[:1], **kwargs)
        states.commit(mixer.layer_idx, rows)
        return output

    return forward


def test_a_row_not_zeroed_at_admission_leaks_the_last_requests_state(
    family_model_dirs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first chunk starts from zero whatever the row holds; a one-token prompt runs with the decode rows, from
    its row's state: the late ones here take rows finished requests left."""
    prompts = [*_prompts()[:4], [7], [9]]
    assert _differs("qwen3_next", family_model_dirs, prompts=prompts) == 0
    monkeypatch.setattr(RecurrentStates, "zero_row", lambda self, row: None)
    assert _differs("qwen3_next", family_model_dirs, prompts=prompts) > 0


def test_states_that_stay_behind_when_rows_move_answer_for_the_wrong_request(
    family_model_dirs, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _differs("bamba", family_model_dirs) == 0
    monkeypatch.setattr(RecurrentStates, "move_row", lambda self, source, target: None)
    assert _differs("bamba", family_model_dirs) > 0


def test_a_later_chunk_that_restarts_from_zero_answers_differently(
    family_model_dirs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunked prefill carries the state from one chunk to the next: treating every chunk as a request's first
    loses the prompt before it."""
    assert _differs("granitemoehybrid", family_model_dirs) == 0
    plan = recurrent.StatePlan

    def every_chunk_fresh(groups=None):
        for group in groups or ():
            group.fresh = group.fresh or group.chunk
        return plan(groups)

    monkeypatch.setattr("batching.engine.step_builder.StatePlan", every_chunk_fresh)
    assert _differs("granitemoehybrid", family_model_dirs) > 0


def test_a_mib_budget_holds_every_slots_states_before_its_blocks(family_model_dirs) -> None:
    model = loaded(str(family_model_dirs["falcon_h1"]))
    per_request, per_token = recurrent_state_bytes(model.model), kv_bytes_per_token(model.model)
    options = BatcherOptions(max_batch_size=4, kv_cache_mb=1.0, block_size=16)
    batcher = Batcher(model.model, model.tokenizer, options)
    assert batcher.pool.num_blocks == (2**20 - 4 * per_request) // (16 * per_token)
    assert not batcher.pool.prefix_caching  # a state cannot be cut at a block boundary
    tight = BatcherOptions(max_batch_size=4, kv_cache_mb=4 * per_request / 2**20, block_size=16)
    with pytest.raises(ValueError, match=r"^kv_cache_mb=.* is not allowed: .* MiB after .* MiB of recurrent states$"):
        Batcher(model.model, model.tokenizer, tight)


def test_each_step_reports_the_states_its_running_requests_hold(family_model_dirs) -> None:
    model = loaded(str(family_model_dirs["lfm2"]))
    batcher = Batcher(model.model, model.tokenizer, BatcherOptions(max_batch_size=3))
    for prompt in _prompts()[:2]:
        batcher.add(prompt, RequestParams(4, ignore_eos=True))
    views = [event.memory for event in batcher.run() if getattr(event, "memory", None) is not None]
    per_request = recurrent_state_bytes(model.model)
    assert views[0].state_bytes_per_request == per_request and views[0].state_bytes == 2 * per_request
    assert views[-1].state_bytes == 0  # every request gone, its row and its states with it


# Compiled steps on two slots (the compiled tests' fallback options). Kept here, after the compiled and direct-call
# tests in file order: a process that ran this test no longer makes direct calls for later batchers (not understood
# yet; see the closing note of 2026-11-27).
FALLBACK = BatcherOptions(
    max_batch_size=2, max_batched_tokens=16, max_seq_len=96, compile_steps=True, compile_autotune=False
)


@contextmanager
def failing_after_the_graph_ran(compiler: StepCompiler) -> Iterator[None]:
    """The next compiled call runs the real graph, which writes every row's keys, values and states, then raises: a
    failure after the graph's writes, as a kernel's error or a lost device would leave it."""
    forward = compiler.forward

    def failing(*args: object, **kwargs: object) -> object:
        forward(*args, **kwargs)
        raise RuntimeError("a fault after the graph wrote the step's states")

    compiler.forward = failing
    try:
        yield
    finally:
        compiler.forward = forward


@pytest.mark.long
def test_a_hybrids_compiled_step_that_fails_after_writing_states_reruns_eager_from_the_states_before_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # LFM2: a short convolution per request, whose window a second run of the step would shift twice.
    family = next(family for family in FAMILIES if family.name == "lfm2")
    model = loaded(str(save_tiny_models(tmp_path, {family.name: family.config()})[family.name]))
    batcher = Batcher(model.model, model.tokenizer, FALLBACK)
    compiler = batcher.runner.compiler
    assert compiler is not None and compiler.compile_now() is not None
    prompts, cap = [[5, 6, 7, 8], [9, 10, 11]], 24
    requests = [batcher.add(prompt, RequestParams(cap, ignore_eos=True)) for prompt in prompts]
    events: list[Event] = []
    while batcher.runner.compiled_steps < 3:
        events += batcher.step()
    with caplog.at_level(logging.WARNING, logger="batching.engine.compiled"), failing_after_the_graph_ran(compiler):
        while batcher.has_work:
            events += batcher.step()
    finished = finished_by_id(events)
    for request, prompt in zip(requests, prompts, strict=True):
        assert list(finished[request.request_id].output_ids) == reference(model.model, prompt, cap, ignore_eos=True)
    assert batcher.runner.compiled_steps == 3 and compiler.failed
    (line,) = [r.getMessage() for r in caplog.records if "steps stay eager" in r.getMessage()]
    assert line.endswith("steps stay eager: RuntimeError: a fault after the graph wrote the step's states")
