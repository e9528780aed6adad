"""Models in float16 and bfloat16: each row's greedy choice and its check for NaN or infinite logits are made in
float32 (a float16 sum of a real vocabulary's logits overflows), and every answer, eager or compiled, is the model's
own greedy choice at every step up to rounding.

Not token for token `generate`'s: in these dtypes `generate` itself disagrees with one forward pass over the same
tokens where two logits are a rounding apart (its cached steps round in another order), and so does any engine
that packs, pads or fuses differently. Token-exact equality with `generate` is claimed, and tested, in float32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config

from batching.engine.batcher import Batcher, BatcherOptions
from batching.engine.events import FinishedEvent
from batching.engine.params import RequestParams
from batching.engine.request import FinishReason
from batching.engine.sampling import greedy_choices
from model.loader import LoadedModel
from tests.engine.helpers import loaded, native_attention, random_prompts
from tests.tiny_models import TINY_CONFIGS, save_tiny_models

EPSILONS = 4  # how far below a step's largest logit its choice's may be, in the dtype's epsilons times that logit


def test_greedy_choices_are_made_in_float32_whatever_the_dtype_of_the_logits() -> None:
    logits = torch.full((4, 384), 200.0)  # each row sums to 76,800: past float16's largest value, 65,504
    logits[0, 7], logits[1, 300], logits[2, 5], logits[3, 9] = 201.0, 250.0, float("nan"), float("inf")
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert greedy_choices(logits.to(dtype)).tolist() == [7, 300, -1, -1], dtype


@pytest.fixture(scope="module")
def large_logits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GPT-2 whose logits are about 200 each: over its 384 tokens they sum past float16's largest value, as a
    real model's do over a vocabulary of 150,000 averaging 0.5. The final norm's bias on one dimension, read by
    every token's row of the LM head alike, adds the same 200 to each; the other dimensions, ten times the usual
    scale, spread the logits far wider than float16's rounding at 200 (0.125)."""
    config = GPT2Config(**{**TINY_CONFIGS["gpt2"].to_dict(), "tie_word_embeddings": False})
    folder = save_tiny_models(tmp_path_factory.mktemp("large-logits"), {"gpt2": config})["gpt2"]
    model = AutoModelForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        model.lm_head.weight.mul_(10.0)
        model.lm_head.weight[:, 0] = 1.0
        model.transformer.ln_f.bias[0] = 200.0
    model.save_pretrained(folder)
    return folder


def _short_of_the_top(model: LoadedModel, prompt: list[int], output: list[int]) -> float:
    """How far each chosen token's logit falls below the step's largest, in units of the dtype's epsilon times that
    largest logit, at the worst step: the model's own forward over the prompt and the answer, on its own attention."""
    with native_attention(model.model), torch.inference_mode():
        logits = model.model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1].float()
    top = logits.max(dim=-1).values
    chosen = logits[torch.arange(len(output)), torch.tensor(output)]
    unit = torch.finfo(model.dtype).eps * top.abs()
    return float(((top - chosen) / unit).max())


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.long
def test_half_precision_answers_eager_and_compiled_are_the_models_own_greedy_choices_up_to_rounding(
    dtype: str, large_logits: Path, tiny_model_dirs: dict[str, Path]
) -> None:
    # float16 on the logits that overflow its sum; bfloat16 (whose sums do not) on a Llama, which reads
    # through the block tables in float32 and gathers in bfloat16.
    model = loaded(str(large_logits if dtype == "float16" else tiny_model_dirs["llama"]), dtype)
    assert model.model.dtype == getattr(torch, dtype)
    prompts, caps = random_prompts(4, vocab=300, seed=11, longest=20), [30, 7, 24, 16]
    for compiled in (False, True):
        options = BatcherOptions(
            max_batch_size=2, max_batched_tokens=16, max_seq_len=96, compile_steps=compiled, compile_autotune=False
        )
        batcher = Batcher(model.model, model.tokenizer, options)
        if compiled:
            assert batcher.runner.compiler is not None and batcher.runner.compiler.compile_now() is not None
        requests = [batcher.add(p, RequestParams(c, ignore_eos=True)) for p, c in zip(prompts, caps, strict=True)]
        finished = [event for event in batcher.run() if isinstance(event, FinishedEvent)]
        assert [event.reason for event in finished] == [FinishReason.LENGTH] * 4, [e.error for e in finished]
        assert (batcher.runner.compiled_steps > 0) is compiled
        for request, prompt in zip(requests, prompts, strict=True):
            short = _short_of_the_top(model, prompt, request.output_ids)
            assert short <= EPSILONS, f"{'compiled' if compiled else 'eager'}: {short:.1f} epsilons below the top"
