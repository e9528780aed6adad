"""Engine behaviour: scheduling, the KV cache, events, cancellation, faults, bad input, no leaks."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from batching.engine.batcher import Batcher
from batching.engine.builder import OVERLONG_FACTOR
from batching.engine.detokenizer import IncrementalDetokenizer
from batching.engine.events import FinishedEvent, StepEvent, TokenEvent
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams, SamplingParams
from batching.engine.request import FinishReason
from tests.engine.helpers import finished_by_id, loaded, random_prompts, reference, steps_of


@pytest.fixture(scope="module")
def llama(tiny_model_dirs):
    return loaded(str(tiny_model_dirs["llama"]))


def assert_nothing_held(batcher) -> None:
    assert batcher.runner.cache.active_rows == 0
    assert batcher.runner.cache.held_requests == ()
    assert batcher.running == {}
    assert all(slot is None for slot in batcher.slots)
    assert batcher._detokenizers == {} and batcher._samplers == {}
    assert len(batcher.scheduler.waiting) == 0


def test_a_finished_request_frees_its_slot_for_a_waiting_one_on_the_very_next_step(llama) -> None:
    batcher = Batcher(llama.model, llama.tokenizer, BatcherOptions(max_batch_size=2))
    short, long_, waiting = (batcher.add([5, 6, 7], RequestParams(cap, ignore_eos=True)) for cap in (2, 10, 4))
    events = list(batcher.run())
    steps = steps_of(events)
    finished_step = next(s.index for s in steps if short.request_id in s.slots and s.index == 1)
    after = steps[finished_step + 1]
    assert after.slots[short.slot] == waiting.request_id
    assert waiting.slot == short.slot
    assert long_.request_id in after.slots


def test_static_waves_wait_for_their_longest_member_holding_idle_slots(llama) -> None:
    batcher = Batcher(llama.model, llama.tokenizer, BatcherOptions(max_batch_size=2), mode="static")
    a, b, c = (batcher.add([5, 6, 7], RequestParams(cap, ignore_eos=True)) for cap in (2, 6, 3))
    steps = steps_of(list(batcher.run()))
    assert len(steps) == 6 + 3  # wave 1 runs until its longest (6), then wave 2 (3)
    assert all(s.slots == (a.request_id, b.request_id) for s in steps[:6])
    assert steps[3].idle_held == (a.request_id,)
    assert steps[3].active == 1
    assert all(s.slots == (c.request_id, None) for s in steps[6:])
    assert_nothing_held(batcher)


@pytest.mark.parametrize(
    ("policy", "order"), [("fcfs", [40, 5, 20]), ("shortest-first", [5, 20, 40]), ("longest-first", [40, 20, 5])]
)
def test_the_policy_decides_who_gets_a_slot_first(llama, policy: str, order: list[int]) -> None:
    batcher = Batcher(llama.model, llama.tokenizer, BatcherOptions(max_batch_size=1, policy=policy))
    requests = {cap: batcher.add([5, 6, 7], RequestParams(cap, ignore_eos=True)) for cap in (40, 5, 20)}
    list(batcher.run())
    admitted = sorted(requests, key=lambda cap: requests[cap].times.admitted)
    assert admitted == order


def test_long_prompts_are_prefilled_in_chunks_fused_with_other_rows_decode(llama) -> None:
    batcher = Batcher(llama.model, llama.tokenizer, BatcherOptions(max_batch_size=3, max_batched_tokens=16))
    decoding = batcher.add([5, 6], RequestParams(30, ignore_eos=True))
    batcher.step()
    long_prompt = random_prompts(1, vocab=300, seed=3, longest=2)[0] * 1 + list(range(10, 60))
    joiner = batcher.add(long_prompt, RequestParams(5, ignore_eos=True))
    events = list(batcher.run())
    steps = steps_of(events)
    assert all(s.prefill_tokens + s.decode_tokens <= 16 for s in steps)
    fused = [s for s in steps if s.prefill_tokens > 0 and s.decode_tokens > 0]
    assert len(fused) >= 3  # 52 prompt tokens at <= 15 a step, each step also decoding the other request
    finished = finished_by_id(events)
    assert list(finished[joiner.request_id].output_ids) == reference(llama.model, long_prompt, 5, ignore_eos=True)
    assert list(finished[decoding.request_id].output_ids) == reference(llama.model, [5, 6], 30, ignore_eos=True)


def test_the_cache_is_allocated_once_and_stays_put_through_256_requests(llama) -> None:
    batcher = Batcher(llama.model, llama.tokenizer, BatcherOptions(max_batch_size=8))
    batcher.add([5, 6, 7], RequestParams(1))
    list(batcher.run())
    pointers = batcher.runner.cache.storage_pointers()
    assert len(pointers) == 2 * llama.model.config.num_hidden_layers
    prompts = random_prompts(256, vocab=300, seed=11, longest=12)
    for i, prompt in enumerate(prompts):
        batcher.add(prompt, RequestParams(1 + i % 7, ignore_eos=True))
    events = list(batcher.run())
    assert len(finished_by_id(events)) == 256
    assert batcher.runner.cache.storage_pointers() == pointers
    assert all(layer.keys.is_inference() for layer in batcher.runner.cache.layers)
    assert_nothing_held(batcher)


def test_admitting_or_finishing_a_request_leaves_every_other_requests_cache_untouched(llama) -> None:
    batcher = Batcher(llama.model, llama.tokenizer, BatcherOptions(max_batch_size=4))
    cache = batcher.runner.cache
    staying = [
        batcher.add([5, 6, 7, 8], RequestParams(50, ignore_eos=True)),
        batcher.add([9, 10], RequestParams(50, ignore_eos=True)),
    ]
    leaving = batcher.add([11, 12, 13], RequestParams(3, ignore_eos=True))
    batcher.step()
    batcher.step()

    def snapshot() -> dict[str, list[torch.Tensor]]:
        return {
            r.request_id: [
                t.clone() for layer in range(len(cache.layers)) for t in cache.request_view(r.request_id, layer)
            ]
            for r in staying
        }

    before = snapshot()
    # This step finishes `leaving` (its row is reused: the last row moves into it) and admits a newcomer.
    batcher.step()
    assert leaving.is_finished
    batcher.add([14, 15, 16, 17, 18], RequestParams(4, ignore_eos=True))
    batcher.step()
    after = snapshot()
    for request_id, tensors in before.items():
        for old, new in zip(tensors, after[request_id], strict=True):
            assert torch.equal(new[:, : old.shape[1]], old), f"{request_id}'s cached keys/values changed"


def test_cancelling_waiting_and_running_requests_frees_everything(llama) -> None:
    batcher = Batcher(llama.model, llama.tokenizer, BatcherOptions(max_batch_size=2))
    running = batcher.add([5, 6, 7], RequestParams(100, ignore_eos=True))
    other = batcher.add([8, 9], RequestParams(6, ignore_eos=True))
    waiting = batcher.add([10, 11], RequestParams(100, ignore_eos=True))
    batcher.step()
    batcher.cancel(running.request_id)
    batcher.cancel(waiting.request_id)
    batcher.cancel("no-such-request")
    finished = finished_by_id(list(batcher.run()))
    assert finished[running.request_id].reason is FinishReason.CANCELLED
    assert finished[waiting.request_id].reason is FinishReason.CANCELLED
    assert finished[waiting.request_id].slot is None
    assert finished[other.request_id].reason is FinishReason.LENGTH
    assert list(finished[other.request_id].output_ids) == reference(llama.model, [8, 9], 6, ignore_eos=True)
    assert_nothing_held(batcher)


def test_cancelling_a_static_wave_member_keeps_the_rest_of_the_wave_going(llama) -> None:
    batcher = Batcher(llama.model, llama.tokenizer, BatcherOptions(max_batch_size=2), mode="static")
    cancelled = batcher.add([5, 6, 7], RequestParams(50, ignore_eos=True))
    kept = batcher.add([8, 9], RequestParams(8, ignore_eos=True))
    batcher.cancel(cancelled.request_id)
    finished = finished_by_id(list(batcher.run()))
    assert finished[cancelled.request_id].reason is FinishReason.CANCELLED
    assert list(finished[kept.request_id].output_ids) == reference(llama.model, [8, 9], 8, ignore_eos=True)
    assert_nothing_held(batcher)


def test_a_request_stops_at_eos_and_the_eos_token_ends_its_output(llama) -> None:
    batcher = Batcher(llama.model, llama.tokenizer, BatcherOptions(max_batch_size=2))
    expected = reference(llama.model, [5, 6, 7], 60, ignore_eos=True)
    eos_at = expected[3]
    batcher.eos_ids = frozenset({eos_at})  # pretend the 4th greedy token is the model's EOS
    request = batcher.add([5, 6, 7], RequestParams(60))
    ignoring = batcher.add([5, 6, 7], RequestParams(10, ignore_eos=True))
    finished = finished_by_id(list(batcher.run()))
    first = expected.index(eos_at)
    assert finished[request.request_id].reason is FinishReason.EOS
    assert list(finished[request.request_id].output_ids) == expected[: first + 1]
    assert finished[ignoring.request_id].reason is FinishReason.LENGTH
    assert finished[ignoring.request_id].output_tokens == 10


def test_a_stop_string_ends_the_request(llama) -> None:
    batcher = Batcher(llama.model, llama.tokenizer, BatcherOptions(max_batch_size=2))
    probe = batcher.add("Hello my name is", RequestParams(40, ignore_eos=True))
    full_text = finished_by_id(list(batcher.run()))[probe.request_id].text
    stop = full_text[5:8]
    assert stop.strip(), "need a visible stop string"
    request = batcher.add("Hello my name is", RequestParams(40, stop_strings=tuple([stop]), ignore_eos=True))
    finished = finished_by_id(list(batcher.run()))[request.request_id]
    assert finished.reason is FinishReason.STOP
    assert stop in finished.text
    assert len(finished.text) < len(full_text)


def test_a_request_that_raises_inside_sampling_fails_alone(llama, monkeypatch: pytest.MonkeyPatch) -> None:
    batcher = Batcher(llama.model, llama.tokenizer, BatcherOptions(max_batch_size=3))
    healthy = batcher.add([5, 6, 7], RequestParams(12, ignore_eos=True))
    broken = batcher.add([8, 9], RequestParams(12, sampling=SamplingParams(do_sample=True, seed=1), ignore_eos=True))
    also_healthy = batcher.add([10, 11], RequestParams(12, ignore_eos=True))
    batcher.step()
    sampler = batcher._samplers[broken.request_id]

    def explode(*args: object) -> int:
        raise RuntimeError("probability tensor contains either inf, nan or element < 0")

    monkeypatch.setattr(sampler, "choose", explode)
    finished = finished_by_id(list(batcher.run()))
    assert finished[broken.request_id].reason is FinishReason.ERROR
    assert "probability tensor" in finished[broken.request_id].error
    for request in (healthy, also_healthy):
        assert list(finished[request.request_id].output_ids) == reference(
            llama.model, request.prompt_ids, 12, ignore_eos=True
        )
    assert_nothing_held(batcher)


def test_nan_logits_fail_only_the_affected_row(llama, monkeypatch: pytest.MonkeyPatch) -> None:
    batcher = Batcher(llama.model, llama.tokenizer, BatcherOptions(max_batch_size=2))
    first = batcher.add([5, 6, 7], RequestParams(6, ignore_eos=True))
    second = batcher.add([8, 9], RequestParams(6, ignore_eos=True))
    forward = batcher.runner.forward

    def poisoned(*args, **kwargs):
        logits = forward(*args, **kwargs).clone()  # a normal tensor, so the test may write into it
        row = batcher.runner.cache.row_of(second.request_id) if second.request_id in batcher.running else None
        if row is not None and len(second.output_ids) == 2:
            logits[row] = float("nan")
        return logits

    monkeypatch.setattr(batcher.runner, "forward", poisoned)
    finished = finished_by_id(list(batcher.run()))
    assert finished[second.request_id].reason is FinishReason.ERROR
    assert "NaN" in finished[second.request_id].error
    assert finished[first.request_id].reason is FinishReason.LENGTH
    assert_nothing_held(batcher)


def test_sampling_with_a_seed_is_reproducible_and_independent_of_batch_companions(llama) -> None:
    params = SamplingParams(do_sample=True, temperature=0.9, top_k=50, top_p=0.9, repetition_penalty=1.2, seed=42)

    def sample(companions: int) -> list[int]:
        batcher = Batcher(llama.model, llama.tokenizer, BatcherOptions(max_batch_size=4))
        for i in range(companions):
            batcher.add(
                [20 + i, 21, 22], RequestParams(15, sampling=SamplingParams(do_sample=True, seed=i), ignore_eos=True)
            )
        request = batcher.add([5, 6, 7], RequestParams(25, sampling=params, ignore_eos=True))
        return list(finished_by_id(list(batcher.run()))[request.request_id].output_ids)

    alone = sample(0)
    assert sample(0) == alone
    assert sample(3) == alone
    other_seed = Batcher(llama.model, llama.tokenizer)
    changed = other_seed.add(
        [5, 6, 7], RequestParams(25, sampling=SamplingParams(do_sample=True, seed=43), ignore_eos=True)
    )
    assert list(finished_by_id(list(other_seed.run()))[changed.request_id].output_ids) != alone


@pytest.mark.parametrize(
    ("prompt", "cap", "options", "message"),
    [
        ("", 5, {}, "prompt is empty"),
        ("   ", 5, {}, "prompt is empty"),
        ([], 5, {}, "prompt is empty"),
        ([5, 99999], 5, {}, "prompt token id 99999 is not allowed"),
        ("hello", 0, {}, "max_new_tokens=0 is not allowed"),
        ("hello", -2, {}, "max_new_tokens=-2 is not allowed"),
        ("hello", 2.5, {}, "max_new_tokens=2.5 is not allowed"),
        ("hello", 100000, {}, "max_new_tokens=100000 is too large"),
        ("hello " * 400, 5, {}, "more than the"),
        ("hello", 5, {"stop_strings": [""]}, "stop_strings"),
    ],
)
def test_bad_input_is_a_clear_value_error(llama, prompt, cap, options, message: str) -> None:
    batcher = Batcher(llama.model, llama.tokenizer, BatcherOptions(max_prompt_tokens=256))
    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as caught:
        batcher.add(prompt, RequestParams(cap, **options))
    assert "\n" not in str(caught.value)
    assert not batcher.has_work


def test_a_text_longer_than_any_prompt_of_the_tokens_allowed_is_refused_unread_and_one_that_fits_is_not(llama) -> None:
    """The bound is what the vocabulary's longest token could cover, with room for a normalizer merging
    characters: a prompt of the longest token that just fits in tokens passes it and is tokenised."""
    builder = Batcher(llama.model, llama.tokenizer, BatcherOptions(max_prompt_tokens=256)).builder
    longest = max(llama.tokenizer.get_vocab(), key=len)
    word = llama.tokenizer.convert_tokens_to_string([longest])
    fits = word * (200 // len(builder.tokenize(word)))
    assert len(builder.tokenize(fits)) <= builder.max_prompt_tokens
    far = "x" * (builder.max_prompt_tokens * builder.longest_token_chars * OVERLONG_FACTOR + 1)
    with pytest.raises(ValueError, match=r"prompt has [\d,]+ characters, far more than 256 tokens hold"):
        builder.tokenize(far)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("temperature", 0.0, "temperature=0.0"),
        ("temperature", float("nan"), "temperature=nan"),
        ("top_k", -1, "top_k=-1"),
        ("top_p", 0.0, "top_p=0.0"),
        ("top_p", 1.5, "top_p=1.5"),
        ("repetition_penalty", 0.0, "repetition_penalty=0.0"),
        ("seed", -1, "seed=-1"),
        ("seed", 2**63, "seed=9223372036854775808"),  # torch would take it, but no int64 client could send it back
        ("seed", 2**64, "seed=18446744073709551616"),  # torch.Generator.manual_seed raises on it, inside a step
    ],
)
def test_invalid_sampling_values_are_rejected(field: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(do_sample=True, **{field: value})


def test_bad_engine_shapes_are_rejected(llama) -> None:
    with pytest.raises(ValueError, match="max_batch_size=0"):
        Batcher(llama.model, llama.tokenizer, BatcherOptions(max_batch_size=0))
    with pytest.raises(ValueError, match="max_batched_tokens=8"):
        Batcher(llama.model, llama.tokenizer, BatcherOptions(max_batch_size=8, max_batched_tokens=8))
    with pytest.raises(ValueError, match="policy='random'"):
        Batcher(llama.model, llama.tokenizer, BatcherOptions(policy="random"))


def test_events_carry_text_deltas_and_metrics_consistent_with_each_other(llama) -> None:
    batcher = Batcher(llama.model, llama.tokenizer, BatcherOptions(max_batch_size=2))
    requests = [batcher.add("Hello my name is", RequestParams(9)), batcher.add("Cats really like", RequestParams(5))]
    events = list(batcher.run())
    finished = finished_by_id(events)
    for request in requests:
        tokens = [e for e in events if isinstance(e, TokenEvent) and e.request_id == request.request_id]
        done = finished[request.request_id]
        assert [t.token_id for t in tokens] == list(done.output_ids)
        # Random weights emit stray byte tokens: the stream holds back an incomplete character at the end.
        assert done.text.startswith("".join(t.text for t in tokens))
        assert done.text == llama.tokenizer.decode(done.output_ids, skip_special_tokens=True)
        assert done.arrival <= done.admitted <= done.first_token <= done.finished
        assert done.first_token == tokens[0].time
    steps = steps_of(events)
    assert [s.index for s in steps] == list(range(len(steps)))
    assert all(s.start <= s.end for s in steps)
    assert sum(s.decode_tokens for s in steps) + len(requests) == sum(f.output_tokens for f in finished.values())


def test_incremental_detokenisation_is_right_across_multibyte_characters(llama) -> None:
    tokenizer = llama.tokenizer
    text = "Café 東京 🎉 naïve — ok"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids=[])
    pieces = [detokenizer.push(token) for token in ids]
    assert "".join(pieces) == text
    assert any(piece == "" for piece in pieces), "an emoji split over byte tokens yields nothing until complete"


def test_no_module_of_the_engine_imports_streamlit() -> None:
    for path in Path("batching").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(name.split(".")[0] == "streamlit" for name in names), f"{path} imports streamlit"


def test_a_step_event_lists_each_slot_and_never_more_active_than_slots(llama) -> None:
    batcher = Batcher(llama.model, llama.tokenizer, BatcherOptions(max_batch_size=3))
    for cap in (3, 9, 1, 4, 7):
        batcher.add([5, 6, 7], RequestParams(cap, ignore_eos=True))
    steps = [e for e in batcher.run() if isinstance(e, StepEvent)]
    assert all(len(s.slots) == 3 and 0 < s.active <= 3 for s in steps)


def test_finished_event_reports_the_slot_it_used(llama) -> None:
    batcher = Batcher(llama.model, llama.tokenizer, BatcherOptions(max_batch_size=2))
    request = batcher.add([5, 6, 7], RequestParams(3, ignore_eos=True))
    done = next(e for e in batcher.run() if isinstance(e, FinishedEvent))
    assert done.slot == request.slot == 0
