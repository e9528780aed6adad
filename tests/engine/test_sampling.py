"""One request's sampler on hand-made logits: extreme parameters the API accepts choose a token instead of failing,
and ordinary ones draw exactly what softmax and the request's own generator give."""

from __future__ import annotations

import torch

from batching.engine.params import SamplingParams
from batching.engine.sampling import RequestSampler


def test_a_tiny_repetition_penalty_samples_a_token_it_pushed_to_infinity_instead_of_failing() -> None:
    """score / 5e-324 is +inf for a positive logit of a token already seen; softmax alone would give NaN and
    `torch.multinomial` would raise inside the step."""
    logits = torch.tensor([1.0, 2.0, -1.0, 0.5])
    params = SamplingParams(do_sample=True, repetition_penalty=5e-324, seed=3)
    for history in ([0], [1, 3], [0, 1, 3]):
        token = RequestSampler(params, torch.device("cpu")).choose(logits, history)
        assert token in history  # the +inf tokens take all the probability


def test_finite_scores_are_drawn_as_softmax_and_the_seed_say() -> None:
    logits = torch.tensor([0.3, 1.2, -0.4, 0.9, 0.0])
    params = SamplingParams(do_sample=True, temperature=0.7, seed=11)
    sampler = RequestSampler(params, torch.device("cpu"))
    drawn = [sampler.choose(logits, [2]) for _ in range(20)]
    generator = torch.Generator().manual_seed(11)
    probs = torch.softmax(logits[None] / 0.7, dim=-1)
    expected = [int(torch.multinomial(probs, 1, generator=generator)) for _ in range(20)]
    assert drawn == expected
