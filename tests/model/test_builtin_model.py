"""The embedded model shipped in model/builtin: loads offline, is small, answers and stops."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from model.loader import BUILTIN_MODEL_DIR
from model.prompting import extract_answer, format_prompt

UNICODE_SAMPLES = (
    "emoji 🎉🚀 and a family 👩‍👩‍👧‍👦",
    "accents: café, naïve, Ångström, São Paulo, façade",
    "CJK: 東京都 北京 서울 こんにちは",
    "mixed: Größe 42 – ¿Dónde está? 😀 中文 Ελληνικά русский\tTab\n\nnew lines  double  spaces ",
    "",
)


@pytest.fixture(scope="module")
def builtin() -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The shipped model and tokenizer, loaded from the folder with the hub switched off."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    tokenizer = AutoTokenizer.from_pretrained(BUILTIN_MODEL_DIR)
    model = AutoModelForCausalLM.from_pretrained(BUILTIN_MODEL_DIR, dtype=torch.float32).eval()
    return model, tokenizer


def test_builtin_model_loads_offline_and_is_small(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tokenizer = AutoTokenizer.from_pretrained(BUILTIN_MODEL_DIR)
    model = AutoModelForCausalLM.from_pretrained(BUILTIN_MODEL_DIR)
    assert model.config.eos_token_id == tokenizer.eos_token_id
    assert model.config.max_position_embeddings >= 1024
    assert (BUILTIN_MODEL_DIR / "model.safetensors").stat().st_size <= 20_000_000


@pytest.mark.parametrize("question", ["What's your return policy?", "Do you offer gift wrapping?"])
def test_builtin_model_answers_and_stops_at_eos(
    builtin: tuple[PreTrainedModel, PreTrainedTokenizerBase], question: str
) -> None:
    model, tokenizer = builtin
    inputs = tokenizer(format_prompt(question), return_tensors="pt")
    with torch.inference_mode():
        output = model.generate(**inputs, do_sample=False, max_new_tokens=128)
    new_tokens = output[0, inputs["input_ids"].shape[1] :].tolist()
    assert new_tokens[-1] == tokenizer.eos_token_id
    answer = extract_answer(tokenizer.decode(new_tokens, skip_special_tokens=True))
    assert answer
    assert "Q:" not in answer
    assert answer[0].isupper()


def test_tokenizer_has_distinct_special_tokens_and_adds_none(
    builtin: tuple[PreTrainedModel, PreTrainedTokenizerBase],
) -> None:
    _, tokenizer = builtin
    ids = {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id}
    assert len(ids) == 3
    encoded = tokenizer("Hello")["input_ids"]
    assert not ids & set(encoded)


@pytest.mark.parametrize("text", UNICODE_SAMPLES)
def test_tokenizer_round_trips_any_unicode_losslessly(
    builtin: tuple[PreTrainedModel, PreTrainedTokenizerBase], text: str
) -> None:
    _, tokenizer = builtin
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert tokenizer.unk_token_id not in ids or tokenizer.unk_token_id is None


def test_builtin_loads_through_the_app_loader_by_name() -> None:
    from batching.engine.model_support import model_context_length
    from config.settings import ModelSettings
    from model.loader import load_model

    loaded = load_model(ModelSettings(name_or_path="builtin", device="cpu"))
    assert loaded.dtype == torch.float32
    assert model_context_length(loaded.model) >= 1024
    assert loaded.model.generation_config.eos_token_id == loaded.tokenizer.eos_token_id
    assert loaded.tokenizer.pad_token_id != loaded.tokenizer.eos_token_id
