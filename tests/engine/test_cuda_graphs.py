"""Compiled decode steps replayed from CUDA graphs (`cuda_graphs`): on a GPU every decode step but each bucket's
first replays its graph, token for token equal to `generate`; on a CPU no runner has graphs, so its steps run as
before. The GPU half runs where the engine tests are pointed at a GPU (scripts/gpu_check.sh); the buckets and the
check of a captured graph against its compiled call run anywhere."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from batching.engine import paged_decode
from batching.engine.batcher import Batcher, BatcherOptions
from batching.engine.cuda_graphs import DecodeGraphs, Outputs, _replay_agreement
from tests.engine.helpers import loaded, random_prompts, reference, run_with_late_arrivals

CAPS = [220, 3, 25, 180, 9, 60]  # histories from a few columns to the model's whole context (256): one bucket


def test_decode_steps_replay_cuda_graphs_on_a_gpu_and_never_on_a_cpu(family_model_dirs) -> None:
    # The families' Llama, whose logits are peaky: the tiny Llama's near-ties flipped at token 12 of 240 on an H100 in
    # float32, the graphs' replays equal to the compiled calls (a graph's padding changes the reductions' lengths).
    model = loaded(str(family_model_dirs["llama"]))
    options = BatcherOptions(
        max_batch_size=4, max_batched_tokens=24, max_seq_len=256, compile_steps=True, compile_autotune=False
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
    assert not graphs.failed and graphs.captured == 1
    assert batcher.runner.compiled_steps == graphs.replayed + graphs.captured > 180


class _CaptureRuns(DecodeGraphs):
    """What a capture asks of the engine, on any machine: `run` called as a capture calls it (once on the capture's
    stream, once while capturing), each time through the compiled graph (it raises if the graph's guards refused it)
    and answering as the step's own call did. No graph is made: later steps are compiled calls."""

    def capture(self, bucket, inputs, plans, called: Outputs, run, pools, slots) -> None:  # type: ignore[override]
        self.called, self.runs = called, [run(), run()]
        self.failed = True


@pytest.mark.long
def test_a_capture_runs_the_step_through_its_graph_each_time_over_the_same_inputs(family_model_dirs, monkeypatch):
    # A GPU's decode steps attend through additive masks, built once a step and kept on the step's mask: after a
    # compiled call the mask is stored there, and a second call over the same inputs was refused by the graph's guards
    # (they saw none stored), ran eager and was captured reading the stored mask as a constant: every replay attended
    # with the capture's mask (an H100, 2026-11-28: request 0's token 7 in the test above). The capture's runs drop it.
    monkeypatch.setattr(paged_decode, "ready", lambda: False)  # a GPU's attention: gathered blocks, additive masks
    model = loaded(str(family_model_dirs["llama"]))
    options = BatcherOptions(
        max_batch_size=4, max_batched_tokens=24, max_seq_len=256, compile_steps=True, compile_autotune=False
    )
    batcher = Batcher(model.model, model.tokenizer, options)
    runner = batcher.runner
    assert runner.compiler is not None and runner.compiler.compile_now() is not None
    graphs = runner.graphs = _CaptureRuns(4, runner.compiler.column_step, runner.compiler.columns(256))
    prompts = random_prompts(3, vocab=300, seed=7, longest=20)
    expected = [reference(model.model, p, 12, ignore_eos=True) for p in prompts]
    outputs = run_with_late_arrivals(batcher, prompts, [12] * 3, late_from=3, join_at_step=0, ignore_eos=True)
    assert [outputs[i] for i in range(3)] == expected
    assert graphs.failed and len(graphs.runs) == 2  # one capture, at the first compiled decode step
    for logits, greedy in graphs.runs:
        assert torch.equal(logits, graphs.called[0]) and torch.equal(greedy, graphs.called[1])


def test_a_bucket_holds_every_slot_and_columns_in_steps_of_256_up_to_the_runners_most() -> None:
    graphs = DecodeGraphs(rows=8, column_step=32, max_columns=608)
    assert [graphs.bucket(kv_len) for kv_len in (1, 256, 257, 600)] == [(8, 256), (8, 256), (8, 512), (8, 608)]
    assert DecodeGraphs(rows=4, column_step=384, max_columns=3072).bucket(10) == (4, 384)  # whole blocks of 384


class _Replay:
    """A captured graph's stand-in: its replay writes `logits`, `greedy` and the slots' `written` values."""

    def __init__(self, static: tuple[torch.Tensor, torch.Tensor], pool: torch.Tensor, slots: torch.Tensor, **writes):
        self.static, self.pool, self.slots, self.writes = static, pool, slots, writes

    def replay(self) -> None:
        self.static[0].copy_(self.writes["logits"])
        self.static[1].copy_(self.writes["greedy"])
        self.pool.view(2, -1, 4)[:, self.slots] = self.writes["written"]


def test_a_replay_must_give_the_calls_choices_and_its_logits_and_writes_within_a_few_roundings() -> None:
    logits, greedy = torch.randn(3, 50), torch.tensor([4, 7, 1])
    pool, slots = torch.randn(2, 5, 2, 4), torch.tensor([0, 3, 9])  # [kv heads, blocks, block size, head size]
    written = pool.view(2, -1, 4)[:, slots].clone()
    rounded = logits + 1e-4 * torch.randn(3, 50)

    def agreement(**writes: torch.Tensor) -> str | None:
        static = (torch.zeros(3, 50), torch.zeros(3, dtype=torch.long))
        replay = _Replay(static, pool, slots, **{"logits": logits, "greedy": greedy, "written": written, **writes})
        found = _replay_agreement(replay, static, (logits, greedy), [pool], slots)
        assert torch.equal(pool.view(2, -1, 4)[:, slots], written)  # the call's writes are back
        return found

    assert agreement() == "bitwise"
    assert agreement(logits=rounded) == "close"
    assert agreement(greedy=torch.tensor([4, 7, 2])) is None  # another token
    assert agreement(logits=2 * logits) is None
    assert agreement(written=torch.full_like(written, float("nan"))) is None  # a slot the graph did not write
