"""Attention classes the engine cannot split per request as they are, made to: the original Falcon's, which computes
attention itself (Falcon-H1 calls the interface already), and Llama 4's temperature-tuned layers, which compute
their positions from the cache's length.

transformers' `FalconAttention.forward` calls SDPA (or its own matmuls) inside the class, and the model passes no
keyword arguments down to it. Routed, each attention module does what Falcon's does up to the cache update (the
fused projection, the heads split, rotary), then calls the attention function the model is set to, with the step's
plan read from the cache it is given (`PagedKVCache.attention_plan`). With Falcon's own implementations ("eager",
"sdpa": what `generate` runs) the module's own forward runs unchanged. Falcon's new decoder architecture broadcasts
each key head over its query group before caching; routed, the cache holds each key head once (grouped-query
attention reads it for the group), so the pool takes a group's worth less memory. Falcon with ALiBi (`alibi=True`,
Falcon-RW) adds a bias per head and key position to the scores, which the engine's attention does not: it is
refused (`refusal`).

Llama 4's NoPE layers scale each query by a function of its position (attention temperature tuning), taking the
positions as `arange(new tokens) + the cache's length`: right for one sequence, wrong for a packed step, whose
tokens belong to many rows at their own positions. Routed, those layers read each token's position from the step's
own position ids (`PagedKVCache.position_ids`), the same numbers `generate` computes for a sequence alone; with any
other cache the layer's own forward runs.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from transformers import PreTrainedModel
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.falcon.modeling_falcon import FalconAttention, FalconFlashAttention2, apply_rotary_pos_emb
from transformers.models.llama4.modeling_llama4 import Llama4TextAttention

from batching.engine.attention import PLAN_KWARG

# The implementations Falcon's own forward computes itself: those run it unchanged.
NATIVE = frozenset({"eager", "sdpa"})

_routed: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()


def _falcon_modules(model: PreTrainedModel) -> list[FalconAttention]:
    return [
        module
        for module in model.modules()
        if isinstance(module, FalconAttention) and not isinstance(module, FalconFlashAttention2)
    ]


def refusal(model: PreTrainedModel) -> str:
    """Why a model whose attention computes itself cannot be routed ("" when it can, or has none)."""
    if _falcon_modules(model) and getattr(model.config, "alibi", False):
        return (
            "its ALiBi position biases (alibi=True) are added inside its attention class; the engine's attention "
            "adds no per-head position biases"
        )
    return ""


def route_attention(model: PreTrainedModel) -> bool:
    """Route the attention modules the engine cannot split as they are (idempotent); True when the model has attention
    classes that call no attention interface themselves and were routed through it (Falcon's: see `refusal`)."""
    tuned = [
        found
        for found in model.modules()
        if isinstance(found, Llama4TextAttention) and found.attn_temperature_tuning and not found.use_rope
    ]
    for llama in tuned:
        if llama not in _routed:
            llama.forward = _llama4_forward(llama, llama.forward)  # type: ignore[method-assign]
            _routed.add(llama)
    modules = _falcon_modules(model)
    if not modules or refusal(model):
        return False
    # transformers lets a model switch its attention implementation only when its attention classes call the
    # interface (read from their source): routed, they do.
    model._can_set_attn_implementation = lambda: True  # type: ignore[method-assign]
    for module in modules:
        if module not in _routed:
            module.forward = _falcon_forward(module, module.forward)  # type: ignore[method-assign]
            # What attention functions read to share key heads (`generate` on the routed model, with no plan).
            setattr(module, "num_key_value_groups", module.num_heads // _kv_heads(module))  # noqa: B010
            _routed.add(module)
    return True


def _falcon_forward(module: FalconAttention, original: Callable[..., Any]) -> Callable[..., Any]:
    """`FalconAttention.forward` (rotary positions, no ALiBi) with its attention through the model's attention
    function whenever that is not one Falcon computes itself."""

    def forward(  # noqa: PLR0913  (Falcon's own signature)
        hidden_states: torch.Tensor,
        alibi: torch.Tensor | None,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        layer_past: Any = None,
        use_cache: bool = False,
        output_attentions: bool = False,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        implementation = module.config._attn_implementation
        if implementation in NATIVE or alibi is not None or position_embeddings is None:
            return original(
                hidden_states,
                alibi,
                attention_mask,
                position_ids,
                layer_past,
                use_cache,
                output_attentions,
                position_embeddings,
                **kwargs,
            )
        query, key, value = _split_heads(module, module.query_key_value(hidden_states))
        batch, length = query.shape[:2]
        query, key, value = (states.transpose(1, 2) for states in (query, key, value))  # [batch, heads, length, dim]
        cos, sin = position_embeddings
        query, key = apply_rotary_pos_emb(query, key, cos, sin)
        plan = None
        if layer_past is not None:
            key, value = layer_past.update(key, value, module.layer_idx)
            plan = getattr(layer_past, "attention_plan", None)
        extra = {PLAN_KWARG: plan} if plan is not None else {}
        output, weights = ALL_ATTENTION_FUNCTIONS[implementation](
            module, query, key, value, attention_mask, dropout=0.0, scaling=module.inv_norm_factor, **extra
        )
        return module.dense(output.reshape(batch, length, -1)), weights

    return forward


def _split_heads(module: FalconAttention, fused: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries, keys and values `[batch, length, heads, dim]`, each key head once (Falcon's new decoder architecture
    broadcasts it over its query group; grouped-query attention does that here)."""
    if not module.new_decoder_architecture:
        return module._split_heads(fused)
    batch, length, _ = fused.shape
    kv_heads = _kv_heads(module)
    qkv = fused.view(batch, length, kv_heads, module.num_heads // kv_heads + 2, module.head_dim)
    query = qkv[:, :, :, :-2].flatten(2, 3)
    return query, qkv[:, :, :, -2], qkv[:, :, :, -1]


def _llama4_forward(module: Llama4TextAttention, original: Callable[..., Any]) -> Callable[..., Any]:
    """`Llama4TextAttention.forward` of a NoPE layer with temperature tuning, its query scales taken from the step's
    position ids when the engine's cache is passed."""

    def forward(
        hidden_states: torch.Tensor,
        position_embeddings: Any,
        attention_mask: torch.Tensor | None,
        past_key_values: Any = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        positions = getattr(past_key_values, "position_ids", None)
        if positions is None:
            return original(hidden_states, position_embeddings, attention_mask, past_key_values, **kwargs)
        shape = hidden_states.shape[:-1]
        query = module.q_proj(hidden_states).view(*shape, -1, module.head_dim)
        key = module.k_proj(hidden_states).view(*shape, -1, module.head_dim)
        value = module.v_proj(hidden_states).view(*shape, -1, module.head_dim).transpose(1, 2)
        if hasattr(module, "qk_norm"):
            query, key = module.qk_norm(query), module.qk_norm(key)
        # As the layer's own: log(1 + floor((position + 1) / floor_scale)) * attn_scale + 1, at each token's position.
        scales = torch.log1p(torch.floor((positions.float() + 1.0) / module.floor_scale)) * module.attn_scale + 1.0
        query = (query * scales.view(*shape, 1, 1)).to(query.dtype)
        key, value = past_key_values.update(key.transpose(1, 2), value, module.layer_idx)
        output, weights = ALL_ATTENTION_FUNCTIONS[module.config._attn_implementation](
            module, query.transpose(1, 2), key, value, attention_mask, dropout=0.0, scaling=module.scaling, **kwargs
        )
        return module.o_proj(output.reshape(*shape, -1).contiguous()), weights

    return forward


def _kv_heads(module: FalconAttention) -> int:
    """The key heads Falcon's attention computes (one for multi-query, its config's count otherwise)."""
    heads = module.num_kv_heads
    assert heads is not None, "Falcon's config sets num_kv_heads (to the query heads when it says none)"
    return heads
