"""Tiny random models of each architecture, with a tiny BPE tokenizer trained here: the session's fixtures
(tests/conftest.py) save them once, and a few tests save variants of their own."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

TINY_VOCAB = 384
TOKENIZER_TEXT = [
    "How do I track my order? Use the tracking link in your confirmation email.",
    "What's your return policy? Items can be returned within 30 days.",
    "Hello my name is Ada. The capital of France is Paris. Cats really like fish.",
    "Once upon a time in a land far away, a quick brown fox jumped over the lazy dog.",
    "Café, naïve, 東京, emoji 🎉 and numbers 0123456789.",
] * 20


def _tiny_tokenizer() -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(TOKENIZER_TEXT, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


# A large initializer_range makes random logits peaky, so greedy choices do not flip on float noise.
_COMMON = {"vocab_size": TINY_VOCAB, "initializer_range": 0.2, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
TINY_CONFIGS = {
    "llama": LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        **_COMMON,
    ),
    "qwen2": Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        **_COMMON,
    ),
    "gpt2": GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=512, **_COMMON),
}


def save_tiny_models(root: Path, configs: dict[str, PretrainedConfig]) -> dict[str, Path]:
    """Save a random-init model per config, each with the shared tiny tokenizer, in its own folder."""
    tokenizer = _tiny_tokenizer()
    folders = {}
    for name, config in configs.items():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config)
        folder = root / name
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        folders[name] = folder
    return folders
