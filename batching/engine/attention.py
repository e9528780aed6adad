"""Attention for a packed step: every row's new tokens in one sequence, each row attending to its own cache row.

Registered with transformers' `AttentionInterface`, so the model's own classes run unchanged: the linear layers
see only the real new tokens (no padding to the longest prompt chunk), and attention is split per row here.
Single-token rows (decode steps) share one batched SDPA call over a view of the cache; each prompt chunk gets
its own call over its row. Without a plan (e.g. `model.generate`) it is plain SDPA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn.functional import scaled_dot_product_attention
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTENTION_NAME = "batchscope_packed"
PLAN_KWARG = "batchscope_plan"


@dataclass
class ChunkPlan:
    """One row's prompt chunk: its tokens are `[start, end)` of the packed sequence."""

    row: int
    start: int
    end: int
    kv_len: int
    mask: torch.Tensor  # [1, 1, end - start, kv_len]


@dataclass
class PackedPlan:
    """How this step's packed tokens map onto cache rows; built once per step, read by every layer."""

    rows: int
    total_tokens: int
    single_rows: torch.Tensor | None  # rows with exactly one new token (None: every row, in order)
    single_tokens: torch.Tensor | None  # their positions in the packed sequence
    single_kv_len: int
    single_mask: torch.Tensor | None  # [rows, 1, 1, single_kv_len]
    chunks: list[ChunkPlan]


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """`query` is `[1, heads, tokens, dim]`; `key`/`value` are the whole cache `[slots, kv_heads, len, dim]`."""
    plan = kwargs.get(PLAN_KWARG)
    if plan is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    heads, dim = query.shape[1], query.shape[3]
    gqa = key.shape[1] != heads
    output = query.new_empty((1, plan.total_tokens, heads, dim))
    if plan.single_mask is not None:
        tokens = query[0].transpose(0, 1)  # [tokens, heads, dim], a view
        if plan.single_rows is None:
            single_query = tokens.unsqueeze(2)
        else:
            single_query = query.new_zeros((plan.rows, heads, 1, dim))
            single_query[plan.single_rows, :, 0] = tokens[plan.single_tokens]
        attended = scaled_dot_product_attention(
            single_query,
            key[: plan.rows, :, : plan.single_kv_len],
            value[: plan.rows, :, : plan.single_kv_len],
            attn_mask=plan.single_mask,
            scale=scaling,
            enable_gqa=gqa,
        )
        if plan.single_rows is None:
            output[0] = attended[:, :, 0]
        else:
            output[0, plan.single_tokens] = attended[plan.single_rows, :, 0]
    for chunk in plan.chunks:
        attended = scaled_dot_product_attention(
            query[:, :, chunk.start : chunk.end],
            key[chunk.row : chunk.row + 1, :, : chunk.kv_len],
            value[chunk.row : chunk.row + 1, :, : chunk.kv_len],
            attn_mask=chunk.mask,
            scale=scaling,
            enable_gqa=gqa,
        )
        output[0, chunk.start : chunk.end] = attended[0].transpose(0, 1)
    return output, None


def use_packed_attention(model: torch.nn.Module) -> None:
    """Route the model's attention through `packed_attention` (plain SDPA whenever no plan is passed)."""
    AttentionInterface.register(ATTENTION_NAME, packed_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    model.set_attn_implementation(ATTENTION_NAME)
