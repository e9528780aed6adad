"""KV memory in blocks: continuous batching admits by free blocks and preempts the newest request when a running
one needs a block and none is left (its tokens computed again on return), reuses cached prefix blocks, and static
batching reserves each wave's longest prompt plus its largest cap per member. Every answer stays token-exact with
`generate`, and every block comes back."""

from __future__ import annotations

import pytest

from batching.engine.batcher import Batcher
from batching.engine.events import PreemptedEvent, StepEvent
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams
from tests.engine.helpers import finished_by_id, loaded, random_prompts, reference, run_with_late_arrivals, steps_of

CAPS = [40, 60, 25, 50, 35, 45, 30, 55]


def assert_every_block_came_back(batcher: Batcher) -> None:
    pool = batcher.pool
    pool.check()
    assert pool.tables == {} and pool.usage().in_use == 0, "blocks still held after the run"
    assert batcher.runner.cache.active_rows == 0


@pytest.mark.parametrize("arch", ["gpt2", "llama", "qwen2"])
def test_preemption_when_blocks_run_out_recomputes_and_stays_token_exact(tiny_model_dirs, arch: str) -> None:
    model = loaded(str(tiny_model_dirs[arch]))
    prompts = random_prompts(len(CAPS), vocab=300, seed=3, longest=30)
    expected = [reference(model.model, p, c, ignore_eos=True) for p, c in zip(prompts, CAPS, strict=True)]
    # 4 slots, 24 blocks of 4 positions: each request needs up to 90 positions, so four at once cannot all finish.
    options = BatcherOptions(max_batch_size=4, max_batched_tokens=24, block_size=4, kv_blocks=24)
    batcher = Batcher(model.model, model.tokenizer, options)
    events: list = []
    outputs = run_with_late_arrivals(
        batcher, prompts, CAPS, late_from=5, join_at_step=6, ignore_eos=True, events=events
    )
    preempted = [event for event in events if isinstance(event, PreemptedEvent)]
    assert preempted, "the pool was meant to run out"
    for index, want in enumerate(expected):
        assert outputs[index] == want, f"request {index} differs after {len(preempted)} preemptions"
    finished = finished_by_id(events)
    assert sum(event.preemptions for event in finished.values()) == len(preempted)
    for step in steps_of(events):
        assert step.memory is not None and step.memory.usage.in_use <= 24
    memory = steps_of(events)[-1].memory
    assert memory.prefix_queries == sum(len(p) for p in prompts), "a return after a preemption is a new query"
    assert_every_block_came_back(batcher)


def test_the_newest_request_is_preempted_and_returns_first(tiny_model_dirs) -> None:
    model = loaded(str(tiny_model_dirs["llama"]))
    options = BatcherOptions(max_batch_size=2, max_batched_tokens=16, block_size=4, kv_blocks=8)
    batcher = Batcher(model.model, model.tokenizer, options)
    old = batcher.add([5] * 6, RequestParams(20, ignore_eos=True))
    new = batcher.add([7] * 6, RequestParams(20, ignore_eos=True))
    events = list(batcher.run())
    preempted = [event for event in events if isinstance(event, PreemptedEvent)]
    assert preempted and preempted[0].request_id == new.request_id  # the newest gives its blocks back
    finished = finished_by_id(events)
    assert finished[old.request_id].preemptions == 0
    assert list(finished[new.request_id].output_ids) == reference(model.model, [7] * 6, 20, ignore_eos=True)
    assert_every_block_came_back(batcher)


def test_a_cached_prefix_is_not_computed_again_and_the_answer_is_unchanged(tiny_model_dirs) -> None:
    model = loaded(str(tiny_model_dirs["qwen2"]))
    system = random_prompts(1, vocab=300, seed=11, longest=2)[0] + list(range(40, 75))  # a shared 35+ token prefix
    prompts = [system + tail for tail in ([9, 10, 11], [12, 13], [14, 15, 16, 17], [18])]
    caps = [12, 20, 8, 16]
    options = BatcherOptions(max_batch_size=4, max_batched_tokens=64, block_size=8)
    batcher = Batcher(model.model, model.tokenizer, options)
    first = batcher.add(prompts[0], RequestParams(caps[0]))
    events = list(batcher.run())  # the first alone: its full prompt blocks are cached when it ends
    later = [batcher.add(p, RequestParams(c)) for p, c in zip(prompts[1:], caps[1:], strict=True)]
    events += list(batcher.run())
    finished = finished_by_id(events)
    assert finished[first.request_id].cached_tokens == 0
    hit = len(system) // 8 * 8
    for request, prompt, cap in zip(later, prompts[1:], caps[1:], strict=True):
        assert finished[request.request_id].cached_tokens == hit
        assert list(finished[request.request_id].output_ids) == reference(model.model, prompt, cap)
    prefilled = sum(step.prefill_tokens for step in steps_of(events))
    assert prefilled == sum(len(p) for p in prompts) - 3 * hit  # the hits' tokens were never computed
    for step in steps_of(events):  # a shared block's tokens are counted once: never more than the blocks reserved
        assert step.memory is not None and step.memory.tokens <= step.memory.reserved
    memory = steps_of(events)[-1].memory
    assert memory is not None and memory.prefix_hits == 3 * hit
    assert_every_block_came_back(batcher)
    assert batcher.pool.usage().cached > 0  # kept for later hits


def test_requests_sharing_a_prefix_being_computed_wait_a_step_and_find_it_cached(tiny_model_dirs) -> None:
    model = loaded(str(tiny_model_dirs["qwen2"]))
    system = random_prompts(1, vocab=300, seed=12, longest=2)[0] + list(range(40, 75))  # a shared 35+ token prefix
    shared = [system + tail for tail in ([9, 10, 11], [12, 13], [14, 15, 16, 17])]
    other = random_prompts(1, vocab=300, seed=13, longest=30)[0] + [8] * 20  # nothing in common with them
    prompts = [shared[0], other, *shared[1:]]
    caps = [12, 10, 20, 8]
    options = BatcherOptions(max_batch_size=4, max_batched_tokens=256, block_size=8)
    batcher = Batcher(model.model, model.tokenizer, options)
    requests = [batcher.add(p, RequestParams(c, ignore_eos=True)) for p, c in zip(prompts, caps, strict=True)]
    events = list(batcher.run())
    steps = steps_of(events)
    # The first step computes the shared prefix once: the first sharer and the unrelated request (which the waiting
    # sharers let through); the other sharers join the next step, their shared blocks cached by then.
    assert steps[0].prefill_tokens == len(shared[0]) + len(other)
    assert {rid for rid in steps[0].slots if rid} == {requests[0].request_id, requests[1].request_id}
    assert {rid for rid in steps[1].slots if rid} == {request.request_id for request in requests}
    hit = len(system) // 8 * 8
    finished = finished_by_id(events)
    assert [finished[r.request_id].cached_tokens for r in requests] == [0, 0, hit, hit]
    assert sum(step.prefill_tokens for step in steps) == sum(len(p) for p in prompts) - 2 * hit
    for request, prompt, cap in zip(requests, prompts, caps, strict=True):
        assert list(finished[request.request_id].output_ids) == reference(model.model, prompt, cap, ignore_eos=True)
    assert_every_block_came_back(batcher)


def test_without_prefix_caching_requests_sharing_a_prefix_join_together(tiny_model_dirs) -> None:
    model = loaded(str(tiny_model_dirs["qwen2"]))
    system = list(range(40, 80))
    prompts = [[*system, 9], [*system, 10, 11]]
    options = BatcherOptions(max_batch_size=4, block_size=8, prefix_caching=False)
    batcher = Batcher(model.model, model.tokenizer, options)
    for prompt in prompts:
        batcher.add(prompt, RequestParams(5, ignore_eos=True))
    steps = steps_of(list(batcher.run()))
    assert steps[0].prefill_tokens == sum(len(p) for p in prompts)  # nothing to wait for: both computed at once


def test_static_waves_reserve_longest_prompt_plus_largest_cap_and_shrink_on_a_tight_pool(tiny_model_dirs) -> None:
    model = loaded(str(tiny_model_dirs["llama"]))
    prompts = random_prompts(6, vocab=300, seed=5, longest=20)
    caps = [30, 10, 20, 30, 5, 25]
    longest, largest = max(len(p) for p in prompts), max(caps)
    per_member = -(-(longest + largest) // 4)
    # Room for two members' reservations out of four slots.
    options = BatcherOptions(max_batch_size=4, block_size=4, kv_blocks=2 * per_member + 1)
    batcher = Batcher(model.model, model.tokenizer, options, mode="static")
    ids = [batcher.add(p, RequestParams(c, ignore_eos=True)).request_id for p, c in zip(prompts, caps, strict=True)]
    events = list(batcher.run())
    steps = [event for event in events if isinstance(event, StepEvent)]
    assert max(sum(rid is not None for rid in step.slots) for step in steps) <= 2  # waves of two, not four
    assert not any(isinstance(event, PreemptedEvent) for event in events)
    first = steps[0]
    wave = -(-(max(len(p) for p in prompts[:2]) + max(caps[:2])) // 4)
    assert first.memory is not None and first.memory.usage.in_use == 2 * wave  # reserved up front for the wave
    assert first.memory.tokens == len(prompts[0]) + len(prompts[1])  # its left padding holds no token
    finished = finished_by_id(events)
    for request_id, prompt, cap in zip(ids, prompts, caps, strict=True):
        assert list(finished[request_id].output_ids) == reference(model.model, prompt, cap, ignore_eos=True)
    assert_every_block_came_back(batcher)


def test_continuous_batching_runs_more_requests_at_once_than_full_length_slots_fit(tiny_model_dirs) -> None:
    model = loaded(str(tiny_model_dirs["llama"]))
    context = Batcher(model.model, model.tokenizer, BatcherOptions()).builder.context_length
    two_full_slots = 2 * -(-context // 16)
    options = BatcherOptions(max_batch_size=8, kv_blocks=two_full_slots)
    batcher = Batcher(model.model, model.tokenizer, options)
    for prompt in random_prompts(8, vocab=300, seed=9, longest=20):
        batcher.add(prompt, RequestParams(20, ignore_eos=True))
    events = list(batcher.run())
    busiest = max(step.active for step in steps_of(events))
    assert busiest == 8  # the memory of two full-length slots holds eight short requests
    assert not any(isinstance(event, PreemptedEvent) for event in events)
    assert_every_block_came_back(batcher)


def test_a_request_larger_than_the_whole_pool_is_refused_in_one_line(tiny_model_dirs) -> None:
    model = loaded(str(tiny_model_dirs["llama"]))
    batcher = Batcher(model.model, model.tokenizer, BatcherOptions(block_size=4, kv_blocks=10))
    with pytest.raises(ValueError, match=r"max_new_tokens=40 is too large for the KV cache") as error:
        batcher.add([5] * 5, RequestParams(40))
    assert "\n" not in str(error.value) and "holds 40" in str(error.value)
    batcher.add([5] * 5, RequestParams(35))  # exactly the pool: accepted


def test_cancelled_and_failed_requests_give_their_blocks_back(tiny_model_dirs, monkeypatch) -> None:
    model = loaded(str(tiny_model_dirs["llama"]))
    options = BatcherOptions(max_batch_size=3, block_size=4, kv_blocks=40)
    batcher = Batcher(model.model, model.tokenizer, options)
    requests = [batcher.add(p, RequestParams(30)) for p in random_prompts(5, vocab=300, seed=2, longest=20)]
    for _ in range(3):
        batcher.step()
    batcher.cancel(requests[0].request_id)  # running
    batcher.cancel(requests[4].request_id)  # waiting
    batcher.step()
    assert requests[0].request_id not in batcher.pool.tables
    # An engine fault in a forward pass fails every running request: their blocks come back too.
    real_forward = batcher.runner.forward

    def explode(*args, **kwargs):
        raise RuntimeError("the device fell over")

    monkeypatch.setattr(batcher.runner, "forward", explode)
    batcher.step()
    monkeypatch.setattr(batcher.runner, "forward", real_forward)
    list(batcher.run())
    assert_every_block_came_back(batcher)


def test_bad_pool_settings_are_refused_naming_the_value() -> None:
    with pytest.raises(ValueError, match="block_size=12 is not allowed"):
        BatcherOptions(block_size=12)
    with pytest.raises(ValueError, match="kv_blocks=0 is not allowed"):
        BatcherOptions(kv_blocks=0)
