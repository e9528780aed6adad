"""Turn user input into a `Request`, or a clear `ValueError` naming the bad value and what is allowed."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from batching.request import Request, SamplingParams

_ids = itertools.count(1)


class RequestBuilder:
    """Tokenises and checks prompts against the model's context and the configured limits.

    A prompt longer than `max_prompt_tokens`, or one that leaves no room for `max_new_tokens` in the context,
    is rejected rather than truncated: a silently shortened question would give a misleading answer.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, context_length: int, max_prompt_tokens: int) -> None:
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.max_prompt_tokens = min(max_prompt_tokens, context_length - 1)

    def tokenize(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ValueError("prompt is empty: type some text")
            return self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
        ids = [int(token) for token in prompt]
        if not ids:
            raise ValueError("prompt is empty: give at least one token id")
        vocab = len(self.tokenizer)
        bad = next((token for token in ids if not 0 <= token < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is not allowed: ids must be in [0, {vocab})")
        return ids

    def build(
        self,
        prompt: str | Sequence[int],
        max_new_tokens: int,
        sampling: SamplingParams | None = None,
        stop_strings: Sequence[str] = (),
        request_id: str | None = None,
        ignore_eos: bool = False,
        arrival: float | None = None,
    ) -> Request:
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens!r} is not allowed: must be a whole number >= 1")
        prompt_ids = self.tokenize(prompt)
        if len(prompt_ids) > self.max_prompt_tokens:
            raise ValueError(
                f"prompt has {len(prompt_ids)} tokens, more than the {self.max_prompt_tokens} allowed: shorten it"
            )
        room = self.context_length - len(prompt_ids)
        if max_new_tokens > room:
            raise ValueError(
                f"max_new_tokens={max_new_tokens} is too large: the prompt has {len(prompt_ids)} tokens and the "
                f"model's context is {self.context_length}, so at most {room}"
            )
        if any(not isinstance(stop, str) or not stop for stop in stop_strings):
            raise ValueError(f"stop_strings={list(stop_strings)!r} is not allowed: each must be a non-empty string")
        fields = {"arrival": arrival} if arrival is not None else {}
        return Request(
            request_id=request_id or f"r{next(_ids)}",
            prompt_ids=prompt_ids,
            max_new_tokens=max_new_tokens,
            sampling=sampling or SamplingParams(),
            stop_strings=tuple(stop_strings),
            prompt_text=prompt if isinstance(prompt, str) else None,
            ignore_eos=ignore_eos,
            **fields,
        )
