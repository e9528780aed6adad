"""The KV pool's geometry: the facts about a model that size a batcher's block pool and bound its requests.

Read from the model once (`PoolGeometry.of`) and used by everyone who sizes a pool or checks a request against
one: the batcher itself, the engine process's admission (from the geometry its `EngineInfo` carries), the page and
the benchmark. One recipe, so a request any of them accepts fits the pool the batcher builds.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from batching.engine.builder import RequestBuilder
from batching.engine.model_support import (
    context_reason,
    kv_bytes_per_token,
    model_context_length,
    recurrent_state_bytes,
)
from batching.engine.options import BatcherOptions


@dataclass(frozen=True)
class PoolGeometry:
    """A model's context, the bytes one token's keys and values take, and the bytes of recurrent state one running
    request holds beside its blocks (a hybrid's conv and SSM states; 0 for attention-only models)."""

    context_length: int
    context_reason: str = ""  # why the context is shorter than the model's config says, if it is
    kv_bytes_per_token: int = 0
    state_bytes_per_request: int = 0

    @classmethod
    def of(cls, model: PreTrainedModel) -> PoolGeometry:
        return cls(
            context_length=model_context_length(model),
            context_reason=context_reason(model),
            kv_bytes_per_token=kv_bytes_per_token(model),
            state_bytes_per_request=recurrent_state_bytes(model),
        )

    def context(self, options: BatcherOptions) -> int:
        """A batcher's context: the model's, or `max_seq_len` if shorter."""
        return min(self.context_length, options.max_seq_len)

    def pool_blocks(self, options: BatcherOptions) -> int:
        """The pool's blocks: as set (tokens and MiB rounded down to whole blocks), else every slot's whole context.

        A MiB budget holds every slot's recurrent states first (a hybrid's), then keys and values.
        """
        if options.kv_blocks is not None:
            return options.kv_blocks
        if options.kv_cache_tokens is not None:
            return options.kv_cache_tokens // options.block_size
        if options.kv_cache_mb is not None:
            states = self.state_bytes_per_request * options.max_batch_size
            block_bytes = max(self.kv_bytes_per_token, 1) * options.block_size
            blocks = int((options.kv_cache_mb * 2**20 - states) // block_bytes)
            if blocks < 1:
                held = f" after {states / 2**20:.3f} MiB of recurrent states" if states else ""
                raise ValueError(
                    f"kv_cache_mb={options.kv_cache_mb} is not allowed: one block of {options.block_size} tokens of "
                    f"this model takes {block_bytes / 2**20:.3f} MiB{held}"
                )
            return blocks
        return options.max_batch_size * -(-self.context(options) // options.block_size)

    def kv_tokens(self, options: BatcherOptions) -> int:
        """Positions the pool holds in all (whole blocks)."""
        return self.pool_blocks(options) * options.block_size

    def full_contexts(self, options: BatcherOptions) -> int:
        """How many requests of the whole context the pool holds at once."""
        return self.pool_blocks(options) // -(-self.context(options) // options.block_size)

    def pool_mb(self, tokens: int, requests: int) -> float:
        """The MiB budget (`kv_cache_mb`) of a pool of `tokens` positions beside `requests` running requests' states."""
        return (tokens * self.kv_bytes_per_token + requests * self.state_bytes_per_request) / 2**20

    def request_builder(self, tokenizer: PreTrainedTokenizerBase, options: BatcherOptions) -> RequestBuilder:
        """What a batcher with these options accepts: a prompt and cap that fit the context and the whole pool."""
        context = self.context(options)
        reason = self.context_reason if context == self.context_length else ""
        return RequestBuilder(tokenizer, context, options.max_prompt_tokens, reason, self.kv_tokens(options))
