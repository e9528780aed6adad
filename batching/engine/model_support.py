"""What the engine needs to know about a transformers model before it runs it: its context length."""

from __future__ import annotations

from transformers import PreTrainedModel


def model_context_length(model: PreTrainedModel) -> int:
    """Read the context length from the config, whatever the architecture calls it."""
    config = model.config
    for key in ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return 2048
