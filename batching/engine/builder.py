"""Turn user input into a `Request`, or a clear `ValueError` naming the bad value and what is allowed."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from batching.engine.params import RequestParams
from batching.engine.request import Request

_ids = itertools.count(1)

# A text longer than this many times its longest possible tokenisation is refused unread: no token covers more
# characters than the vocabulary's longest entry, and a normalizer may merge characters (NFC composes a decomposed
# accent, 2 into 1), for which this leaves room.
OVERLONG_FACTOR = 4


class RequestBuilder:
    """Tokenises and checks prompts against the model's context and the configured limits.

    A prompt longer than `max_prompt_tokens`, or one that leaves no room for `max_new_tokens` in the context,
    is rejected rather than truncated: a silently shortened question would give a misleading answer.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        context_length: int,
        max_prompt_tokens: int,
        context_reason: str = "",
        kv_tokens: int | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.context_reason = context_reason  # why the context is shorter than the model's, if it is
        self.max_prompt_tokens = min(max_prompt_tokens, context_length - 1)
        self.kv_tokens = kv_tokens  # positions the KV cache holds in all (None: no limit but the context)

    @property
    def max_new_tokens(self) -> int:
        """The largest cap any prompt can have (a one-token prompt)."""
        return self.context_length - 1

    @functools.cached_property
    def longest_token_chars(self) -> int:
        """The most characters any one token of the vocabulary can stand for."""
        return max(map(len, self.tokenizer.get_vocab()), default=1)

    def check_length(self, text: str) -> None:
        """Refuse, without tokenising it, a text far too long to fit in `max_prompt_tokens` (tokenising two
        megabytes takes seconds, and its working memory stays with the process)."""
        most = self.max_prompt_tokens * self.longest_token_chars * OVERLONG_FACTOR
        if len(text) > most:
            raise ValueError(
                f"prompt has {len(text):,} characters, far more than {self.max_prompt_tokens} tokens hold (no more "
                f"than {most:,}): shorten it"
            )

    def tokenize(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ValueError("prompt is empty: type some text")
            self.check_length(prompt)
            ids: list[int] = self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
            return ids
        ids = [int(token) for token in prompt]
        if not ids:
            raise ValueError("prompt is empty: give at least one token id")
        vocab = len(self.tokenizer)
        bad = next((token for token in ids if not 0 <= token < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is not allowed: ids must be in [0, {vocab})")
        return ids

    def check(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """Raise `ValueError` naming the bad value unless a prompt of `prompt_tokens` and its cap fit the context
        and the whole KV cache."""
        if prompt_tokens > self.max_prompt_tokens:
            raise ValueError(
                f"prompt has {prompt_tokens} tokens, more than the {self.max_prompt_tokens} allowed: shorten it"
            )
        room = self.context_length - prompt_tokens
        if max_new_tokens > room:
            raise ValueError(
                f"max_new_tokens={max_new_tokens} is too large: the prompt has {prompt_tokens} tokens and "
                f"the model's context is {self.context_length}{self.context_reason}, so at most {room}"
            )
        needed = prompt_tokens + max_new_tokens
        if self.kv_tokens is not None and needed > self.kv_tokens:
            raise ValueError(
                f"max_new_tokens={max_new_tokens} is too large for the KV cache: the prompt's {prompt_tokens} "
                f"tokens and the answer need {needed} positions, the whole cache holds {self.kv_tokens}: lower it or "
                "give the cache more memory"
            )

    def build(
        self,
        prompt: str | Sequence[int],
        params: RequestParams,
        request_id: str | None = None,
        arrival: float | None = None,
    ) -> Request:
        prompt_ids = self.tokenize(prompt)
        self.check(len(prompt_ids), params.max_new_tokens)
        request = Request(request_id=request_id or f"r{next(_ids)}", prompt_ids=prompt_ids, params=params)
        if arrival is not None:
            request.times.arrival = arrival
        return request
