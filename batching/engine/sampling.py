"""Choose each row's next token: one batched argmax for greedy rows, transformers' logits processors otherwise."""

from __future__ import annotations

import torch
from transformers import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from batching.engine.params import SamplingParams
from batching.engine.request import Request


def build_processors(params: SamplingParams) -> LogitsProcessorList:
    """The same processors, in the same order, as `model.generate` builds for these parameters."""
    processors = LogitsProcessorList()
    if params.repetition_penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
    if params.do_sample:
        if params.temperature != 1.0:
            processors.append(TemperatureLogitsWarper(params.temperature))
        if params.top_k > 0:
            processors.append(TopKLogitsWarper(params.top_k))
        if params.top_p < 1.0:
            processors.append(TopPLogitsWarper(params.top_p))
    return processors


class RequestSampler:
    """One request's processors and random generator: its draws depend on its own seed only, not on the batch."""

    def __init__(self, params: SamplingParams, device: torch.device) -> None:
        self.params = params
        self.processors = build_processors(params)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(params.seed)

    def choose(self, logits: torch.Tensor, history: list[int]) -> int:
        """Next token from one row of logits `[vocab]`, given the ids so far (prompt and output)."""
        scores = logits[None]
        if self.processors:
            ids = torch.tensor([history], device=logits.device)
            scores = self.processors(ids, scores)  # type: ignore[arg-type]  # any integer tensor works
        if not self.params.do_sample:
            return int(scores.argmax(dim=-1))
        probs = torch.softmax(scores, dim=-1)
        return int(torch.multinomial(probs, num_samples=1, generator=self.generator))


def greedy_choices(logits: torch.Tensor) -> torch.Tensor:
    """Argmax of every row at once, -1 for a row with a NaN or infinite logit (it would give a meaningless token).

    A row's sum is NaN or infinite exactly when one of its logits is (a model's finite logits do not overflow a
    float32 sum): one reduction instead of a test of every logit. In float32 whatever the model's dtype: a float16
    sum overflows (65,504) once a vocabulary's logits average 0.5 per 1,000 tokens, which a real model's do, and
    every row read as NaN. The argmax is the same in either (the cast is exact). Compiled steps run it inside their
    graph (`compiled`), where the cast is fused into the reductions.
    """
    scores = logits.float()
    return torch.where(torch.isfinite(scores.sum(dim=-1)), scores.argmax(dim=-1), -1)


def greedy_list(choices: torch.Tensor) -> list[int | None]:
    """`greedy_choices` as a list, None for a row without a meaningful token."""
    return [None if token < 0 else token for token in choices.tolist()]


def greedy_tokens(logits: torch.Tensor) -> list[int | None]:
    """Each row's greedy token, None for a row with a NaN or infinite logit (`greedy_choices`)."""
    return greedy_list(greedy_choices(logits))


def sampler_for(request: Request, device: torch.device) -> RequestSampler | None:
    """A sampler when the request needs more than argmax; None keeps it on the batched greedy path."""
    return RequestSampler(request.params.sampling, device) if request.params.sampling.needs_processing else None
