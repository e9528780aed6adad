"""Why each request waits: every request in a batcher that computes nothing in a step is listed in that step's event
with the reason the scheduler left it out, each reason provoked here by a run built for it; and the admission policy
that reserves a request's prompt and cap never preempts, admits fewer rows at once, and answers alike."""

from __future__ import annotations

import pytest

from batching.engine.batcher import Batcher, BatcherOptions
from batching.engine.events import PreemptedEvent, RowKind, StepEvent, WaitReason
from batching.engine.params import RequestParams
from tests.engine.helpers import finished_by_id, loaded, random_prompts, reference, steps_of


def _reasons(step: StepEvent) -> dict[str, WaitReason]:
    return {waiting.request_id: waiting.reason for waiting in step.waiting}


def _params(cap: int) -> RequestParams:
    return RequestParams(cap, ignore_eos=True)


def test_requests_beyond_the_slots_wait_for_a_slot_and_the_rest_of_a_static_wave_for_the_wave(tiny_model_dirs) -> None:
    model = loaded(str(tiny_model_dirs["llama"]))
    for mode in ("continuous", "static"):
        batcher = Batcher(model.model, model.tokenizer, BatcherOptions(max_batch_size=2), mode=mode)
        ids = [batcher.add([5, 6, 7], _params(cap)).request_id for cap in (3, 6, 2)]
        steps = steps_of(list(batcher.run()))
        assert _reasons(steps[0]) == {ids[2]: WaitReason.NO_SLOT}, mode
        later = _reasons(steps[1])
        assert later == {ids[2]: WaitReason.NO_SLOT if mode == "continuous" else WaitReason.WAVE}, mode
        assert steps[-1].waiting == ()


def test_an_admitted_prompt_whose_chunk_the_budget_left_out_waits_for_the_token_budget(tiny_model_dirs) -> None:
    model = loaded(str(tiny_model_dirs["llama"]))
    options = BatcherOptions(max_batch_size=2, max_batched_tokens=8)
    batcher = Batcher(model.model, model.tokenizer, options)
    first, second = (batcher.add(list(range(10, 20)), _params(3)) for _ in range(2))
    steps = steps_of(list(batcher.run()))
    assert _reasons(steps[0]) == {second.request_id: WaitReason.TOKEN_BUDGET}
    rows = {row.request_id: row.kind for row in steps[0].rows}
    assert rows == {first.request_id: RowKind.PREFILL, second.request_id: RowKind.WAITING}


def test_a_request_whose_first_blocks_are_not_free_waits_for_blocks_and_so_do_those_behind_it(tiny_model_dirs) -> None:
    model = loaded(str(tiny_model_dirs["llama"]))
    options = BatcherOptions(max_batch_size=3, max_batched_tokens=64, block_size=4, kv_blocks=6)
    batcher = Batcher(model.model, model.tokenizer, options)
    # Three different 16-token prompts (4 blocks each) on a pool of 6 blocks: the second's first chunk does not fit.
    ids = [batcher.add(list(range(start, start + 16)), _params(4)).request_id for start in (10, 30, 50)]
    steps = steps_of(list(batcher.run()))
    assert _reasons(steps[0]) == {ids[1]: WaitReason.NO_BLOCKS, ids[2]: WaitReason.NO_BLOCKS}


def test_a_request_sharing_a_prefix_being_computed_waits_for_it(tiny_model_dirs) -> None:
    model = loaded(str(tiny_model_dirs["qwen2"]))
    system = list(range(40, 80))
    options = BatcherOptions(max_batch_size=4, max_batched_tokens=256, block_size=8)
    batcher = Batcher(model.model, model.tokenizer, options)
    _, second = (batcher.add([*system, tail], _params(4)) for tail in (9, 10))
    steps = steps_of(list(batcher.run()))
    assert _reasons(steps[0]) == {second.request_id: WaitReason.PREFIX_PENDING}
    assert second.request_id in {row.request_id for row in steps[1].rows}


def test_a_preempted_request_waits_as_preempted_with_the_tokens_it_will_compute_again(tiny_model_dirs) -> None:
    model = loaded(str(tiny_model_dirs["llama"]))
    options = BatcherOptions(max_batch_size=2, max_batched_tokens=16, block_size=4, kv_blocks=8)
    batcher = Batcher(model.model, model.tokenizer, options)
    batcher.add([5] * 6, _params(20))
    batcher.add([7] * 6, _params(20))
    events = list(batcher.run())
    [preempted, *_] = [event for event in events if isinstance(event, PreemptedEvent)]
    after = next(e for e in events[events.index(preempted) :] if isinstance(e, StepEvent))
    [waiting] = after.waiting
    assert (waiting.request_id, waiting.reason) == (preempted.request_id, WaitReason.PREEMPTED)
    assert waiting.recompute == preempted.recompute > 6


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_reserving_prompt_and_cap_never_preempts_admits_fewer_rows_and_answers_alike(tiny_model_dirs, arch) -> None:
    model = loaded(str(tiny_model_dirs[arch]))
    prompts = random_prompts(8, vocab=300, seed=3, longest=30)
    caps = [40, 60, 25, 50, 35, 45, 30, 55]
    runs = {}
    for admission in ("preempt", "reserve"):
        options = BatcherOptions(
            max_batch_size=4, max_batched_tokens=24, block_size=4, kv_blocks=24, admission=admission
        )
        batcher = Batcher(model.model, model.tokenizer, options)
        requests = [batcher.add(p, _params(c)) for p, c in zip(prompts, caps, strict=True)]
        events = list(batcher.run())
        finished = finished_by_id(events)
        for request, prompt, cap in zip(requests, prompts, caps, strict=True):
            assert list(finished[request.request_id].output_ids) == reference(model.model, prompt, cap, True)
        steps = steps_of(events)
        runs[admission] = (
            sum(isinstance(event, PreemptedEvent) for event in events),
            sum(step.active for step in steps) / len(steps),
        )
        assert batcher.pool.tables == {}
    (preemptions, rows), (reserved_preemptions, reserved_rows) = runs["preempt"], runs["reserve"]
    assert preemptions > 0 and reserved_preemptions == 0
    assert reserved_rows < rows


def test_an_unknown_admission_policy_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match=r"^admission='lazy' is not allowed: choose one of preempt, reserve$"):
        BatcherOptions(admission="lazy")
