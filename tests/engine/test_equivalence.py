"""Greedy outputs of both batchers equal `model.generate` on each prompt alone, token for token."""

from __future__ import annotations

import random

import pytest

from batching.engine.batcher import MODES, Batcher
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams
from tests.engine.helpers import finished_by_id, loaded, random_prompts, reference, run_with_late_arrivals

CAPS = [1, 200, 3, 17, 64, 2, 120, 9, 33, 5, 80, 1]


@pytest.mark.parametrize("arch", ["gpt2", "llama", "qwen2"])
@pytest.mark.parametrize(
    ("mode", "policy"),
    [("continuous", "fcfs"), ("continuous", "shortest-first"), ("continuous", "longest-first"), ("static", "fcfs")],
)
def test_greedy_output_equals_generate_on_each_prompt_alone(tiny_model_dirs, arch: str, mode: str, policy: str) -> None:
    model = loaded(str(tiny_model_dirs[arch]))
    prompts = random_prompts(len(CAPS), vocab=300, seed=len(arch))
    expected = [reference(model.model, p, c) for p, c in zip(prompts, CAPS, strict=True)]
    # A small token budget forces chunked prefill of the longer prompts alongside other rows' decode steps.
    options = BatcherOptions(max_batch_size=4, max_batched_tokens=24, policy=policy)
    batcher = Batcher(model.model, model.tokenizer, options, mode=mode)
    outputs = run_with_late_arrivals(batcher, prompts, CAPS, late_from=7, join_at_step=5)
    for i, want in enumerate(expected):
        assert outputs[i] == want, f"request {i} (prompt {len(prompts[i])} tokens, cap {CAPS[i]}) differs"
    assert batcher.runner.cache.active_rows == 0


def test_continuous_and_static_give_the_same_text_for_text_prompts(tiny_model_dirs) -> None:
    model = loaded(str(tiny_model_dirs["llama"]))
    prompts = ["Hello my name is", "The capital of France is", "Cats really like fish and"]
    caps = [12, 30, 7]
    texts = {}
    for mode in MODES:
        batcher = Batcher(model.model, model.tokenizer, BatcherOptions(max_batch_size=2), mode=mode)
        ids = [batcher.add(p, RequestParams(c)).request_id for p, c in zip(prompts, caps, strict=True)]
        finished = finished_by_id(list(batcher.run()))
        texts[mode] = [finished[i].text for i in ids]
        for i, (p, c) in zip(ids, zip(prompts, caps, strict=True), strict=True):
            prompt_ids = model.tokenizer(p)["input_ids"]
            assert list(finished[i].output_ids) == reference(model.model, prompt_ids, c)
    assert texts["continuous"] == texts["static"]


def test_requests_added_from_another_thread_while_running_are_served_correctly(tiny_model_dirs) -> None:
    import threading

    model = loaded(str(tiny_model_dirs["qwen2"]))
    prompts = random_prompts(10, vocab=300, seed=7)
    caps = [random.Random(i).randrange(1, 40) for i in range(10)]
    batcher = Batcher(model.model, model.tokenizer, BatcherOptions(max_batch_size=3))
    first = [batcher.add(p, RequestParams(c)).request_id for p, c in zip(prompts[:3], caps[:3], strict=True)]
    late: list[str] = []
    adder = threading.Thread(
        target=lambda: late.extend(
            batcher.add(p, RequestParams(c)).request_id for p, c in zip(prompts[3:], caps[3:], strict=True)
        )
    )
    events = batcher.step()
    adder.start()
    adder.join()
    events += list(batcher.run())
    finished = finished_by_id(events)
    for request_id, p, c in zip(first + late, prompts, caps, strict=True):
        assert list(finished[request_id].output_ids) == reference(model.model, p, c)


@pytest.mark.parametrize("mode", ["continuous", "static"])
def test_the_embedded_model_gives_generate_output_for_the_customer_support_queue(mode: str) -> None:
    from batching.bench.workloads import load_workload
    from model.loader import BUILTIN_MODEL_DIR
    from model.prompting import format_prompt

    model = loaded(str(BUILTIN_MODEL_DIR))
    questions = [r.prompt for r in load_workload("customer-support").requests]
    prompts = [model.tokenizer(format_prompt(q))["input_ids"] for q in questions]
    caps = [40, 1, 120, 8, 64, 33, 2, 90, 16, 50, 25]
    batcher = Batcher(model.model, model.tokenizer, BatcherOptions(max_batch_size=4, max_batched_tokens=48), mode=mode)
    outputs = run_with_late_arrivals(batcher, prompts, caps, late_from=8, join_at_step=3)
    for i, (prompt, cap) in enumerate(zip(prompts, caps, strict=True)):
        assert outputs[i] == reference(model.model, prompt, cap), f"{questions[i]!r} differs"
