"""The model-family matrix: a tiny config per family (features switched on at sizes short prompts cross), and
whether the engine runs it exactly or refuses it. Read by test_families.py and families_table.py beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import AutoConfig, PretrainedConfig

from batching.engine.recurrent import RECURRENT_LAYER_TYPES
from tests.tiny_models import TINY_VOCAB

WINDOW = 8  # sliding windows this small are crossed by every test prompt
ORIGINAL_CONTEXT = 48  # Phi-3 longrope's switch from short to long factors

# A large initializer_range makes random logits peaky, so greedy choices do not flip on float noise.
_COMMON = {"vocab_size": TINY_VOCAB, "initializer_range": 0.2, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
_DECODER = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}
_MIXED = ["sliding_attention", "full_attention"]
# Small value-head counts: inductor's linear fusion compares a hybrid's compiled row count with them (Qwen3.5's
# dt_bias), so the compiled matrix's counts (2 to its 4 slots) cross both: 2 guards one count off the first graph,
# 4 equals the count the graph is traced at (see `warmup.warm_decode`).
_DELTA_NET = {
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
}
_GPTQ = {"initializer_range": 0.3}
_MAMBA2 = {"mamba_n_heads": 4, "mamba_d_head": 32, "mamba_d_state": 8, "mamba_n_groups": 1, "mamba_chunk_size": 16}


@dataclass(frozen=True)
class Family:
    """One model family: how to build its tiny config, and what the engine must do with it."""

    name: str
    model_type: str
    features: str  # what the tiny config switches on, for the table
    overrides: dict = field(default_factory=dict)
    refused: str = ""  # a part of the refusal message; empty: the family runs exactly
    decoder: bool = True  # start from the common Llama-like sizes
    gptq_bits: int = 0  # the saved random model quantised with GPTQ to this many bits (tests/conftest.py); 0: not

    @property
    def recurrent(self) -> bool:
        """Whether it keeps conv or SSM states per request (a hybrid, or a state-space model)."""
        return any(kind in RECURRENT_LAYER_TYPES for kind in getattr(self.config(), "layer_types", None) or ())

    def config(self) -> PretrainedConfig:
        base = {**_COMMON, **(_DECODER if self.decoder else {}), **self.overrides}
        return AutoConfig.for_model(self.model_type, **base)


def _phi3_factors() -> dict:
    rotary_half = 64 // 4 // 2 // 2  # head 16, partial rotary 0.5
    return {
        "rope_type": "longrope",
        "short_factor": [1.0 + 0.1 * i for i in range(rotary_half)],
        "long_factor": [2.0 + 0.5 * i for i in range(rotary_half)],
        "original_max_position_embeddings": ORIGINAL_CONTEXT,
        "partial_rotary_factor": 0.5,
    }


FAMILIES: tuple[Family, ...] = (
    Family(
        "llama",
        "llama",
        "llama3 rope scaling, tied embeddings",
        {
            "tie_word_embeddings": True,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
    ),
    Family("mistral", "mistral", f"sliding window {WINDOW}", {"sliding_window": WINDOW}),
    Family("qwen2", "qwen2", "attention biases"),
    # GPTQ-quantised weights (gptqmodel's CPU kernel), compared with `generate` on the same quantised model. The
    # kernel rounds each layer's input to bfloat16, so a float difference of 1e-7 from another chunking can move a
    # rounding: the weights are wider still (0.3), so greedy choices are not near-ties at that noise either.
    Family("llama_gptq", "llama", "GPTQ 4-bit weights, group 64", _GPTQ | {"tie_word_embeddings": True}, gptq_bits=4),
    Family("qwen2_gptq", "qwen2", "GPTQ 4-bit weights, group 64, attention biases", _GPTQ, gptq_bits=4),
    Family("qwen3", "qwen3", "q/k norms", {"head_dim": 16}),
    Family(
        "qwen3_moe",
        "qwen3_moe",
        "mixture of experts",
        {
            "head_dim": 16,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "decoder_sparse_step": 1,
        },
    ),
    Family(
        "phi3",
        "phi3",
        f"partial rotary, longrope (original context {ORIGINAL_CONTEXT})",
        {
            "original_max_position_embeddings": ORIGINAL_CONTEXT,
            "rope_parameters": _phi3_factors(),
            "num_key_value_heads": 4,
            "sliding_window": None,
        },
    ),
    # Gemma's scaled embeddings with tied random weights repeat one token forever: untied, outputs vary.
    Family("gemma", "gemma", "head_dim 16, scaled embeddings", {"head_dim": 16, "tie_word_embeddings": False}),
    # A soft-cap of 1 with unscaled queries changes most greedy outputs (Gemma 2's 50 would not, at this size).
    Family(
        "gemma2",
        "gemma2",
        f"soft-cap 1, window {WINDOW} on alternate layers",
        {
            "head_dim": 16,
            "sliding_window": WINDOW,
            "layer_types": _MIXED,
            "attn_logit_softcapping": 1.0,
            "final_logit_softcapping": 30.0,
            "query_pre_attn_scalar": 1,
            "tie_word_embeddings": False,
        },
    ),
    Family(
        "gemma3",
        "gemma3_text",
        f"local window {WINDOW} / global layers, two rope bases",
        {
            "head_dim": 16,
            "sliding_window": WINDOW,
            "layer_types": _MIXED,
            "query_pre_attn_scalar": 16,
            "tie_word_embeddings": False,
        },
    ),
    # Gemma 4's per-layer geometry: its full-attention layers have another head size and one key head shared by
    # keys and values (k = v), proportional rope on a quarter of their head; per-layer inputs; and the last two
    # layers reuse the keys and values of the last earlier layer of their kind (they write none).
    Family(
        "gemma4",
        "gemma4_text",
        f"window {WINDOW} / global layers (head 32, k = v, 1 key head, proportional rope), per-layer inputs, "
        "last 2 layers reuse KV",
        {
            "num_hidden_layers": 4,
            "head_dim": 16,
            "global_head_dim": 32,
            "num_global_key_value_heads": 1,
            "attention_k_eq_v": True,
            "sliding_window": WINDOW,
            "layer_types": _MIXED * 2,
            "num_kv_shared_layers": 2,
            "hidden_size_per_layer_input": 16,
            "vocab_size_per_layer_input": TINY_VOCAB,
            "final_logit_softcapping": 30.0,
            "tie_word_embeddings": False,
        },
    ),
    Family(
        "cohere2",
        "cohere2",
        f"window {WINDOW} on alternate layers",
        {
            "sliding_window": WINDOW,
            "layer_types": _MIXED,
        },
    ),
    Family(
        "gpt_oss",
        "gpt_oss",
        f"attention sinks, window {WINDOW}, experts",
        {
            "head_dim": 16,
            "sliding_window": WINDOW,
            "layer_types": _MIXED,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
    ),
    Family(
        "deepseek_v3",
        "deepseek_v3",
        "multi-head latent attention (key head 16 + 8 rope, value head 20)",
        {
            "num_key_value_heads": 4,
            "q_lora_rank": 32,
            "kv_lora_rank": 16,
            "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 16,
            "v_head_dim": 20,
            "n_routed_experts": 4,
            "num_experts_per_tok": 2,
            "n_group": 1,
            "topk_group": 1,
            "first_k_dense_replace": 1,
            "moe_intermediate_size": 32,
        },
    ),
    Family("starcoder2", "starcoder2", f"sliding window {WINDOW}, biases", {"sliding_window": WINDOW}),
    Family("olmo2", "olmo2", "q/k norms after projection"),
    Family("smollm3", "smollm3", "no rope on one layer", {"no_rope_layers": [1, 0]}),
    Family(
        "granite",
        "granite",
        "embedding, residual and attention multipliers",
        {
            "embedding_multiplier": 2.0,
            "residual_multiplier": 0.5,
            "attention_multiplier": 0.2,
            "logits_scaling": 2.0,
        },
    ),
    Family(
        "gpt2",
        "gpt2",
        "learned positions",
        {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 256},
        decoder=False,
    ),
    Family("gpt_neox", "gpt_neox", "partial rotary, parallel residual", {"rotary_pct": 0.5}),
    Family(
        "opt",
        "opt",
        "learned positions with offset",
        {
            "ffn_dim": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "hidden_size": 64,
            "word_embed_proj_dim": 64,
            "max_position_embeddings": 256,
        },
        decoder=False,
    ),
    # Falcon computes attention in its own class: the engine routes it through the attention interface.
    Family(
        "falcon",
        "falcon",
        "new decoder architecture, 2 key heads for 4 query heads",
        {"new_decoder_architecture": True, "num_kv_heads": 2},
    ),
    Family(
        "falcon_alibi",
        "falcon",
        "ALiBi positions (Falcon-RW)",
        {"alibi": True, "new_decoder_architecture": False, "num_kv_heads": 4},
        refused="ALiBi",
    ),
    Family("lfm2", "lfm2", "short convolution layers", {"layer_types": ["conv", "full_attention"]}),
    Family(
        "qwen3_5",
        "qwen3_5_text",
        "gated delta-net linear attention (2 value heads), gated attention",
        {"head_dim": 16, "layer_types": ["linear_attention", "full_attention"], **_DELTA_NET},
    ),
    Family(
        "qwen3_next",
        "qwen3_next",
        "gated delta-net linear attention (4 value heads), experts",
        {
            "head_dim": 16,
            "layer_types": ["linear_attention", "full_attention"],
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 32,
            **_DELTA_NET,
            "linear_num_value_heads": 4,
        },
    ),
    Family(
        "granitemoehybrid",
        "granitemoehybrid",
        "Mamba-2 layers beside attention, experts (Granite 4)",
        {
            "layer_types": ["mamba", "attention"],
            **_MAMBA2,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "shared_intermediate_size": 64,
        },
    ),
    Family(
        "mamba2",
        "mamba2",
        "Mamba-2 state-space layers only",
        {
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_heads": 4,
            "head_dim": 32,
            "state_size": 8,
            "n_groups": 1,
            "chunk_size": 16,
            "expand": 2,
        },
        decoder=False,
    ),
    Family("bamba", "bamba", "Mamba-2 layers beside attention", {"attn_layer_indices": [1], **_MAMBA2}),
    Family(
        "falcon_h1",
        "falcon_h1",
        "Mamba-2 and attention side by side in every layer",
        {
            "head_dim": 16,
            "mamba_n_heads": 4,
            "mamba_d_head": 32,
            "mamba_d_ssm": 128,
            "mamba_d_state": 8,
            "mamba_n_groups": 1,
            "mamba_chunk_size": 16,
        },
    ),
    Family(
        "nemotron_h",
        "nemotron_h",
        "Mamba-2 layers beside attention",
        {
            "layers_block_type": ["mamba", "attention"],
            "head_dim": 16,
            "mamba_num_heads": 4,
            "mamba_head_dim": 32,
            "ssm_state_size": 8,
            "n_groups": 1,
            "chunk_size": 16,
        },
    ),
    Family(
        "jamba",
        "jamba",
        "Mamba layers beside attention, experts",
        {
            "attn_layer_period": 2,
            "attn_layer_offset": 1,
            "expert_layer_period": 2,
            "expert_layer_offset": 1,
            "num_experts": 2,
            "mamba_d_state": 8,
            "mamba_dt_rank": 8,
        },
    ),
    Family(
        "zamba2",
        "zamba2",
        "Mamba-2 layers, a shared attention block",
        {
            "layers_block_type": ["mamba", "hybrid"],
            "mamba_headdim": 32,
            "mamba_d_state": 8,
            "n_mamba_heads": 4,
            "mamba_ngroups": 1,
            "chunk_size": 16,
            "attention_head_dim": 16,
            "num_mem_blocks": 1,
            "use_mem_rope": True,
        },
    ),
    Family(
        "llama4",
        "llama4_text",
        f"chunked attention {WINDOW}, a NoPE layer with attention temperature from position {WINDOW - 1}, experts",
        {
            "head_dim": 16,
            "attention_chunk_size": WINDOW,
            "no_rope_layers": [1, 0],
            "floor_scale": WINDOW,
            "num_local_experts": 2,
            "intermediate_size_mlp": 128,
        },
    ),
    Family(
        "mamba",
        "mamba",
        "selective state-space layers",
        {
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "state_size": 8,
            "expand": 2,
        },
        decoder=False,
    ),
)


def family(name: str) -> Family:
    return next(f for f in FAMILIES if f.name == name)
