"""Compiled decode steps replayed from CUDA graphs (`cuda_graphs`): on a GPU every decode step but each bucket's
first replays its graph, token for token equal to `generate`; on a CPU no runner has graphs, so its steps run as
before. The GPU half runs where the engine tests are pointed at a GPU (scripts/gpu_check.sh)."""

from __future__ import annotations

from dataclasses import replace

from batching.engine.batcher import Batcher, BatcherOptions
from tests.engine.helpers import loaded, random_prompts, reference, run_with_late_arrivals

# Histories from a few columns to past 256: two buckets of columns.
CAPS = [240, 3, 25, 200, 9, 60]


def test_decode_steps_replay_cuda_graphs_on_a_gpu_and_never_on_a_cpu(tiny_model_dirs) -> None:
    model = loaded(str(tiny_model_dirs["llama"]))
    options = BatcherOptions(
        max_batch_size=4, max_batched_tokens=24, max_seq_len=300, compile_steps=True, compile_autotune=False
    )
    batcher = Batcher(model.model, model.tokenizer, options)
    graphs, compiler = batcher.runner.graphs, batcher.runner.compiler
    if model.model.device.type != "cuda":
        assert graphs is None
        return
    assert graphs is not None and compiler is not None
    assert Batcher(model.model, model.tokenizer, replace(options, cuda_graphs=False)).runner.graphs is None
    assert compiler.compile_now() is not None
    prompts = random_prompts(len(CAPS), vocab=300, seed=5, longest=30)
    expected = [reference(model.model, p, c, ignore_eos=True) for p, c in zip(prompts, CAPS, strict=True)]
    outputs = run_with_late_arrivals(batcher, prompts, CAPS, late_from=4, join_at_step=3, ignore_eos=True)
    for i, want in enumerate(expected):
        assert outputs[i] == want, f"request {i} (prompt {len(prompts[i])}, cap {CAPS[i]}) differs"
    # Each bucket's first step captured its graph (checked against the compiled call); every later one replayed it.
    assert not graphs.failed and graphs.captured == 2
    assert batcher.runner.compiled_steps == graphs.replayed + graphs.captured > 200
