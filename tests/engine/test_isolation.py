"""No request can hurt another: one whose parameters cannot be honoured finishes alone with an error, one that could
never fit the pool is refused at every entry, and, property-tested over a real batcher (random prompts, caps,
sampling parameters, cancels, tight pools, both schedules), every request finishes exactly once, greedy answers
stay those of `generate`, and every block comes back."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batching.engine.batcher import MODES, Batcher
from batching.engine.events import FinishedEvent, RowKind, StepEvent
from batching.engine.geometry import PoolGeometry
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams, SamplingParams
from batching.engine.request import FinishReason
from tests.engine.helpers import finished_by_id, loaded, random_prompts, reference


def _unhonourable_sampling() -> SamplingParams:
    """Sampling whose generator cannot be seeded (torch takes seeds below 2**64): a value that slipped past the
    checks where parameters are parsed must still end its own request alone."""
    params = SamplingParams(do_sample=True, temperature=0.7, seed=1)
    object.__setattr__(params, "seed", 2**64)
    return params


def _assert_idle(batcher: Batcher) -> None:
    pool = batcher.pool
    pool.check()
    assert pool.tables == {} and pool.usage().in_use == 0, "blocks still held after the run"
    assert (
        batcher.runner.cache.active_rows == 0
        and not batcher.running
        and batcher.slots.count(None) == len(batcher.slots)
    )


@pytest.mark.parametrize("mode", MODES)
def test_a_request_whose_sampler_cannot_be_made_fails_alone_and_the_others_finish_exact(
    tiny_model_dirs, mode: str
) -> None:
    model = loaded(str(tiny_model_dirs["llama"]))
    prompts = random_prompts(4, vocab=300, seed=31, longest=20)
    caps = [12, 9, 15, 7]
    batcher = Batcher(model.model, model.tokenizer, BatcherOptions(max_batch_size=4), mode=mode)
    good = [batcher.add(p, RequestParams(c, ignore_eos=True)) for p, c in zip(prompts[:2], caps[:2], strict=True)]
    bad = batcher.add(prompts[2], RequestParams(caps[2], sampling=_unhonourable_sampling()))
    later = batcher.add(prompts[3], RequestParams(caps[3], ignore_eos=True))  # admitted behind it, in the same step
    events = list(batcher.run())
    finished = [event for event in events if isinstance(event, FinishedEvent)]
    assert Counter(event.request_id for event in finished) == Counter(r.request_id for r in (*good, bad, later)), (
        "every request gets exactly one finish"
    )
    by_id = finished_by_id(events)
    assert by_id[bad.request_id].reason is FinishReason.ERROR
    assert by_id[bad.request_id].error and not by_id[bad.request_id].output_ids
    for request, prompt, cap in zip((*good, later), (*prompts[:2], prompts[3]), (*caps[:2], caps[3]), strict=True):
        assert by_id[request.request_id].reason is FinishReason.LENGTH
        assert list(by_id[request.request_id].output_ids) == reference(model.model, prompt, cap, ignore_eos=True)
    _assert_idle(batcher)


def test_a_hybrids_mib_budget_refuses_a_request_its_pool_can_never_hold(family_model_dirs) -> None:
    model = loaded(str(family_model_dirs["falcon_h1"]))
    geometry = PoolGeometry.of(model.model)
    assert geometry.state_bytes_per_request > 0
    # Room for 4 slots' states and 3 blocks of 16 positions: 48 positions in all.
    states = 4 * geometry.state_bytes_per_request
    mib = (states + 3.5 * 16 * geometry.kv_bytes_per_token) / 2**20
    options = BatcherOptions(max_batch_size=4, kv_cache_mb=mib, block_size=16)
    batcher = Batcher(model.model, model.tokenizer, options)
    assert batcher.pool.num_blocks == geometry.pool_blocks(options) == 3
    assert batcher.builder.kv_tokens == 48
    with pytest.raises(ValueError, match=r"^max_new_tokens=40 is too large for the KV cache: .* holds 48: "):
        batcher.make_request([5] * 10, RequestParams(40))
    ok = batcher.add([5] * 10, RequestParams(38, ignore_eos=True))  # exactly the whole pool
    [finish] = [event for event in batcher.run() if isinstance(event, FinishedEvent)]
    assert finish.request_id == ok.request_id and len(finish.output_ids) == 38
    _assert_idle(batcher)


@pytest.mark.parametrize("mode", MODES)
def test_submit_refuses_a_request_built_for_a_larger_pool(tiny_model_dirs, mode: str) -> None:
    model = loaded(str(tiny_model_dirs["llama"]))
    roomy = Batcher(model.model, model.tokenizer, BatcherOptions(max_batch_size=2))
    tight = Batcher(model.model, model.tokenizer, BatcherOptions(max_batch_size=2, kv_blocks=2), mode=mode)
    request = roomy.make_request([5] * 20, RequestParams(30))  # 50 positions; the tight pool holds 32
    with pytest.raises(ValueError, match=r"^max_new_tokens=30 is too large for the KV cache: .* holds 32: "):
        tight.submit(request)
    assert not tight.has_work


def _assert_everyone_runs_or_has_a_reason(step_events: list, live: set[str]) -> None:
    """In a step, each request still in the batcher (not cancelled as the step began) either computes in a row or is
    listed as waiting with a reason, never both: the reasons sum to the waiting count."""
    steps = [event for event in step_events if isinstance(event, StepEvent)]
    if not steps:
        return
    [step] = steps
    cancelled = {
        e.request_id for e in step_events if isinstance(e, FinishedEvent) and e.reason is FinishReason.CANCELLED
    }
    computing = {row.request_id for row in step.rows if row.kind in (RowKind.PREFILL, RowKind.DECODE)}
    waiting = [entry.request_id for entry in step.waiting]
    assert len(waiting) == len(set(waiting)) and not computing & set(waiting)
    # An admitted row the token budget left without a chunk computes nothing: it waits, with its reason.
    assert {row.request_id for row in step.rows if row.kind is RowKind.WAITING} <= set(waiting)
    assert computing | set(waiting) == live - cancelled


# --- property: no request can hurt another ------------------------------------------------------------------
_request = st.fixed_dictionaries(
    {
        "prompt": st.lists(st.integers(3, 299), min_size=1, max_size=24),
        "cap": st.integers(1, 14),
        "sampled": st.booleans(),
        "temperature": st.sampled_from([1e-4, 0.5, 1.0, 50.0]),
        "top_k": st.sampled_from([0, 1, 5]),
        "top_p": st.sampled_from([1e-6, 0.5, 1.0]),
        "penalty": st.sampled_from([1.0, 1.0, 1e-3, 1.3, 1e3]),
        "seed": st.sampled_from([0, 7, 2**63 - 1]),
        "cancel_at": st.one_of(st.none(), st.integers(0, 12)),
    }
)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    mode=st.sampled_from(MODES),
    requests=st.lists(_request, min_size=1, max_size=7),
    kv_blocks=st.integers(3, 12),
    block_size=st.sampled_from([4, 8]),
    slots=st.integers(1, 4),
)
def test_every_request_finishes_once_greedy_answers_stay_exact_and_the_pool_empties(
    tiny_model_dirs, mode: str, requests: list[dict], kv_blocks: int, block_size: int, slots: int
) -> None:
    model = loaded(str(tiny_model_dirs["llama"]))
    options = BatcherOptions(
        max_batch_size=slots, max_batched_tokens=max(slots + 1, 12), block_size=block_size, kv_blocks=kv_blocks
    )
    batcher = Batcher(model.model, model.tokenizer, options, mode=mode)
    submitted, refused = [], 0
    for spec in requests:
        sampling = SamplingParams(
            do_sample=spec["sampled"],
            temperature=spec["temperature"],
            top_k=spec["top_k"],
            top_p=spec["top_p"],
            repetition_penalty=spec["penalty"],
            seed=spec["seed"],
        )
        try:
            request = batcher.add(spec["prompt"], RequestParams(spec["cap"], sampling=sampling, ignore_eos=True))
        except ValueError:  # too long for this tight pool: refused at once, never queued
            refused += 1
            continue
        submitted.append((request, spec))
    events: list = []
    live = {request.request_id for request, _ in submitted}
    while batcher.has_work:
        for request, spec in submitted:
            if spec["cancel_at"] == batcher.step_index:
                batcher.cancel(request.request_id)
        step_events = batcher.step()
        _assert_everyone_runs_or_has_a_reason(step_events, live)
        live -= {event.request_id for event in step_events if isinstance(event, FinishedEvent)}
        events += step_events
    finishes = Counter(event.request_id for event in events if isinstance(event, FinishedEvent))
    assert finishes == Counter(request.request_id for request, _ in submitted), "each request finishes exactly once"
    by_id = finished_by_id(events)
    for request, spec in submitted:
        finish = by_id[request.request_id]
        assert finish.reason in (FinishReason.LENGTH, FinishReason.CANCELLED), finish.error
        sampling = request.params.sampling
        if not sampling.needs_processing:  # greedy: generate's answer (cancelled: the part it got of it)
            want = reference(model.model, spec["prompt"], spec["cap"], ignore_eos=True)
            assert list(finish.output_ids) == want[: len(finish.output_ids)]
            assert finish.reason is FinishReason.CANCELLED or len(finish.output_ids) == spec["cap"]
    if mode == "continuous":  # each admitted request's prefix lookup counted once, preempted or not
        admitted = [spec for request, spec in submitted if by_id[request.request_id].admitted is not None]
        assert batcher.pool.prefix_queries == sum(len(spec["prompt"]) for spec in admitted)
    _assert_idle(batcher)
