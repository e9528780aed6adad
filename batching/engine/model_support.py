"""What the engine needs to know about a transformers model before it runs it: whether it can run it exactly,
which attention features it uses, and its usable context length.

The attention features are read from the model itself: one probe forward of a single token with a recording
attention function lists what every layer passes to its attention function (window, soft-cap, sinks, head sizes),
so a config field a model happens to ignore, or a feature only its code knows, cannot mislead the engine.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface, DynamicCache, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from batching.engine.attention import Chunk, Locality, layer_chunk
from batching.engine.recurrent import RECURRENT_LAYER_TYPES, RecurrentLayout, cache_kwarg, recurrent_layout
from batching.engine.routed_attention import refusal, route_attention

PROBE_NAME = "batchscope_probe"
# Layer kinds whose state is keys and values per token, which the paged cache holds.
ATTENTION_LAYER_TYPES = frozenset({"full_attention", "sliding_attention", "chunked_attention"})
# Layer kinds that call attention and also keep a recurrent state (Falcon-H1, Zamba 2).
BOTH_LAYER_TYPES = frozenset({"hybrid", "hybrid_sliding"})
# Layer kinds that keep no state at all (Nemotron-H's feed-forward-only layers).
STATELESS_LAYER_TYPES = frozenset({"mlp", "moe"})
# Rope variants whose frequencies depend on the sequence length seen in one forward call.
LENGTH_DEPENDENT_ROPE = frozenset({"longrope"})


class UnsupportedModelError(ValueError):
    """The engine cannot run this model exactly; the message is one line naming the model type and why."""


@dataclass(frozen=True)
class LayerAttention:
    """What one layer passes to its attention function."""

    sliding_window: int | None
    softcap: float | None
    sinks: bool
    key_dim: int
    value_dim: int
    chunk: int | None = None  # chunked local attention's chunk size (Llama 4), from the layer's type and config

    @property
    def locality(self) -> Locality:
        """What the layer adds to causal attention: its sliding window, its chunk, or None."""
        return Chunk(self.chunk) if self.chunk is not None else self.sliding_window


@dataclass(frozen=True)
class LayerKV:
    """What one layer writes to the cache for each token: its key heads, each head's key and value size."""

    layer: int
    kv_heads: int
    key_dim: int
    value_dim: int

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        return self.kv_heads * (self.key_dim + self.value_dim) * dtype.itemsize


_probed: weakref.WeakKeyDictionary[torch.nn.Module, tuple[tuple[LayerAttention, ...], tuple[LayerKV, ...]]] = (
    weakref.WeakKeyDictionary()
)


def model_type(model: PreTrainedModel) -> str:
    return str(getattr(model.config, "model_type", type(model).__name__))


def check_supported(model: PreTrainedModel) -> None:
    """Raise `UnsupportedModelError` for what the engine cannot run token-exact."""
    name = model_type(model)
    if getattr(model.config, "is_encoder_decoder", False):
        raise UnsupportedModelError(f"model type {name} is not supported: encoder-decoder models are not batched here")
    known = ATTENTION_LAYER_TYPES | RECURRENT_LAYER_TYPES | STATELESS_LAYER_TYPES
    other = sorted({kind for kind in layer_types(model) if kind not in known})
    if other:
        raise UnsupportedModelError(
            f"model type {name} is not supported: it has {', '.join(other)} layers; the engine runs full and "
            "sliding-window attention, convolution, SSM and linear-attention layers"
        )
    reason = refusal(model)
    if reason:
        raise UnsupportedModelError(f"model type {name} is not supported: {reason}")
    routes = getattr(model, "_supports_attention_backend", False) or route_attention(model)
    if recurrent_layout_or_refusal(model) is None and not routes:
        raise UnsupportedModelError(
            f"model type {name} is not supported: its attention does not route through transformers' attention "
            "interface, so the engine cannot split it per request (it would need its attention class to call "
            "ALL_ATTENTION_FUNCTIONS, as Llama's does)"
        )
    layers = probe_attention(model)
    expected = attention_layer_count(model)
    if len(layers) != expected:
        raise UnsupportedModelError(
            f"model type {name} is not supported: {len(layers)} of its {expected} attention layers call the "
            "attention interface; the others compute attention themselves, which the engine cannot split per request"
        )


def layer_types(model: PreTrainedModel) -> list[str]:
    """Each layer's kind as the config names it (all "full_attention" for a config that does not say)."""
    config = model.config.get_text_config()
    kinds = getattr(config, "layer_types", None)
    return list(kinds) if kinds else ["full_attention"] * config.num_hidden_layers


def attention_layer_count(model: PreTrainedModel) -> int:
    """How many layers call attention (and hold keys and values): every layer but the recurrent and stateless."""
    return sum(kind in ATTENTION_LAYER_TYPES or kind in BOTH_LAYER_TYPES for kind in layer_types(model))


def recurrent_layout_or_refusal(model: PreTrainedModel) -> RecurrentLayout | None:
    """The model's per-request states (None without recurrent layers), or a one-line refusal when its recurrent
    layers do not keep their state through transformers' cache."""
    try:
        return recurrent_layout(model)
    except Exception as exc:  # a layer kind the probe cannot follow: refuse it rather than answer wrongly
        first_line = (str(exc).strip().splitlines() or [""])[0]
        raise UnsupportedModelError(
            f"model type {model_type(model)} is not supported: its recurrent layers' state could not be followed "
            f"through the cache ({type(exc).__name__}: {first_line})"
        ) from exc


def recurrent_state_bytes(model: PreTrainedModel) -> int:
    """Bytes of conv and SSM state one running request holds (0 for attention-only models)."""
    layout = recurrent_layout_or_refusal(model)
    return layout.bytes_per_request() if layout is not None else 0


def probe_attention(model: PreTrainedModel) -> tuple[LayerAttention, ...]:
    """What each attention call of one forward pass passes (memoised per model)."""
    return _probe(model)[0]


def kv_layers(model: PreTrainedModel) -> tuple[LayerKV, ...]:
    """The layers that write keys and values to the cache, in layer order, with what each writes per token (from the
    same probe forward as `probe_attention`, through transformers' own cache; memoised).

    Not from the config: head sizes and key-head counts may differ per layer (Gemma 4's full-attention layers, read
    through `config.per_layer_config[i]`), MLA writes a latent and a rotary key rather than heads, and a layer that
    reuses an earlier layer's keys and values (Gemma 4's last layers) writes none, so it holds no memory of its own
    in the pool. Recurrent and feed-forward-only layers write none either.
    """
    return _probe(model)[1]


class _KVRecordingCache(DynamicCache):
    """transformers' cache, noting the shapes each layer writes (its first `update`)."""

    def __init__(self, config: Any) -> None:
        super().__init__(config=config)
        self.written: dict[int, LayerKV] = {}

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        heads, key_dim, value_dim = key_states.shape[1], key_states.shape[-1], value_states.shape[-1]
        self.written.setdefault(layer_idx, LayerKV(layer_idx, heads, key_dim, value_dim))
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


def _probe(model: PreTrainedModel) -> tuple[tuple[LayerAttention, ...], tuple[LayerKV, ...]]:
    """One forward of a single token with a recording attention function and a recording cache, with the engine's
    routing in place (`routed_attention`): what every attention call passes, and what every layer writes."""
    known = _probed.get(model)
    if known is not None:
        return known
    route_attention(model)
    calls: list[LayerAttention] = []

    def record(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        window, softcap, chunk = kwargs.get("sliding_window"), kwargs.get("softcap"), layer_chunk(module)
        calls.append(
            LayerAttention(
                sliding_window=int(window) if window is not None else None,
                softcap=float(softcap) if softcap is not None else None,
                sinks=kwargs.get("s_aux") is not None,
                key_dim=key.shape[-1],
                value_dim=value.shape[-1],
                chunk=chunk.size if chunk is not None else None,
            )
        )
        return query.new_zeros((query.shape[0], query.shape[2], query.shape[1], value.shape[-1])), None

    AttentionInterface.register(PROBE_NAME, record)
    AttentionMaskInterface.register(PROBE_NAME, sdpa_mask)
    previous = model.config._attn_implementation
    model.set_attn_implementation(PROBE_NAME)
    cache = _KVRecordingCache(model.config)
    try:
        with torch.inference_mode():
            ids = torch.ones((1, 1), dtype=torch.long, device=model.device)
            model(input_ids=ids, use_cache=True, **{cache_kwarg(model): cache})
    finally:
        model.set_attn_implementation(previous)
    probed = (tuple(calls), tuple(layer for _, layer in sorted(cache.written.items())))
    _probed[model] = probed
    return probed


def attention_features(model: PreTrainedModel) -> str:
    """The attention features a model uses, in words (e.g. "sliding window 512 on 5 of 6 layers, soft-cap 50");
    empty for plain full attention."""
    layers = probe_attention(model)
    parts = []
    windows = sorted({layer.sliding_window for layer in layers if layer.sliding_window is not None})
    if windows:
        windowed = sum(layer.sliding_window is not None for layer in layers)
        sizes = "/".join(str(window) for window in windows)
        parts.append(f"sliding window {sizes} on {windowed} of {len(layers)} layers")
    chunks = sorted({layer.chunk for layer in layers if layer.chunk is not None})
    if chunks:
        chunked = sum(layer.chunk is not None for layer in layers)
        sizes = "/".join(str(chunk) for chunk in chunks)
        parts.append(f"chunked attention {sizes} on {chunked} of {len(layers)} layers")
    softcaps = sorted({layer.softcap for layer in layers if layer.softcap is not None})
    if softcaps:
        parts.append("soft-cap " + "/".join(f"{value:g}" for value in softcaps))
    if any(layer.sinks for layer in layers):
        parts.append("attention sinks")
    if any(layer.key_dim != layer.value_dim for layer in layers):
        first = next(layer for layer in layers if layer.key_dim != layer.value_dim)
        parts.append(f"key head {first.key_dim}, value head {first.value_dim}")
    head_sizes = sorted({layer.key_dim for layer in layers})
    if len(head_sizes) > 1:
        parts.append("head sizes " + "/".join(str(size) for size in head_sizes))
    reusing = len(layers) - len(kv_layers(model))
    if reusing > 0:
        parts.append(f"{reusing} of {len(layers)} layers reuse earlier layers' keys and values")
    limit = rope_length_limit(model)
    if limit is not None:
        parts.append(f"longrope, context capped at its original {limit}")
    layout = recurrent_layout_or_refusal(model)
    if layout is not None:
        kinds = "conv and recurrent" if any(layer.recurrent for layer in layout.layers) else "conv"
        parts.append(
            f"{kinds} state on {len(layout.layers)} of {len(layer_types(model))} layers, "
            f"{layout.bytes_per_request() / 2**10:,.1f} KiB a request, no prefix caching"
        )
    return ", ".join(parts)


def rope_length_limit(model: PreTrainedModel) -> int | None:
    """Where a length-dependent rope switches factors, if it has one: the engine's context stops there.

    transformers picks longrope's short or long factors from the longest position of each forward call, and
    Phi-3's `generate` drops its cache and recomputes the whole sequence with the long factors at the step that
    crosses the original context. A packed step would mix factors across rows and cannot recompute a row, so the
    usable context ends at the switch; below it every call uses the short factors, exactly as `generate` does.
    """
    config = model.config.get_text_config()
    parameters = getattr(config, "rope_parameters", None) or {}
    # Per-layer-type rope (e.g. Gemma 3) nests one dict per layer type.
    groups = [parameters] if "rope_type" in parameters else [p for p in parameters.values() if isinstance(p, dict)]
    limits = []
    for group in groups:
        if group.get("rope_type") in LENGTH_DEPENDENT_ROPE:
            original = group.get("original_max_position_embeddings") or getattr(
                config, "original_max_position_embeddings", None
            )
            if original:
                limits.append(int(original))
    return min(limits) if limits else None


def context_reason(model: PreTrainedModel) -> str:
    """Why the engine's context is shorter than the model's, for messages ("" when it is not)."""
    limit = rope_length_limit(model)
    return " (capped where its longrope switches to the long factors)" if limit == model_context_length(model) else ""


def model_context_length(model: PreTrainedModel) -> int:
    """Read the context length from the config, whatever the architecture calls it (capped by `rope_length_limit`)."""
    config = model.config
    limit = rope_length_limit(model)
    for key in ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return min(value, limit) if limit else value
    return min(2048, limit) if limit else 2048


def kv_bytes_per_token(model: PreTrainedModel) -> int:
    """Bytes of keys and values one token takes in the cache, every layer that writes them together (`kv_layers`):
    heads times head size, keys and values apart (their sizes may differ; MLA's are its latent and rotary key)."""
    return sum(layer.bytes_per_token(model.dtype) for layer in kv_layers(model))
