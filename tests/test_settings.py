"""Settings come from the environment and `.env`; every bad value fails with one line naming the variable."""

from __future__ import annotations

import pytest

from config.settings import Settings, SettingsError, load_settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    for name in list(__import__("os").environ):
        if name.startswith("BATCHSCOPE_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def test_defaults_use_the_embedded_model_and_eight_slots() -> None:
    settings = load_settings()
    assert settings.model.name_or_path == "builtin"
    assert settings.batching.max_batch_size == 8
    assert settings.batching.policy == "fcfs"
    assert "{prompt}" in settings.prompt.template


def test_nested_values_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHSCOPE_BATCHING__MAX_BATCH_SIZE", "3")
    monkeypatch.setenv("BATCHSCOPE_MODEL__NAME_OR_PATH", "Qwen/Qwen2.5-0.5B")
    monkeypatch.setenv("BATCHSCOPE_GENERATION__DO_SAMPLE", "true")
    settings = load_settings()
    assert settings.batching.max_batch_size == 3
    assert settings.model.name_or_path == "Qwen/Qwen2.5-0.5B"
    assert settings.generation.do_sample is True


def test_values_are_read_from_a_dotenv_file(tmp_path) -> None:
    (tmp_path / ".env").write_text("BATCHSCOPE_BATCHING__POLICY=longest-first\nBATCHSCOPE_MODEL__DTYPE=float16\n")
    settings = load_settings()
    assert settings.batching.policy == "longest-first"
    assert settings.model.dtype == "float16"


def test_environment_wins_over_dotenv(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    (tmp_path / ".env").write_text("BATCHSCOPE_BATCHING__MAX_BATCH_SIZE=4\n")
    monkeypatch.setenv("BATCHSCOPE_BATCHING__MAX_BATCH_SIZE", "5")
    assert load_settings().batching.max_batch_size == 5


@pytest.mark.parametrize(
    ("variable", "value", "allowed"),
    [
        ("BATCHSCOPE_BATCHING__MAX_BATCH_SIZE", "0", "greater than or equal to 1"),
        ("BATCHSCOPE_BATCHING__MAX_BATCH_SIZE", "many", "valid integer"),
        ("BATCHSCOPE_BATCHING__MAX_BATCHED_TOKENS", "4", "greater than or equal to 16"),
        ("BATCHSCOPE_BATCHING__POLICY", "random", "'fcfs', 'shortest-first' or 'longest-first'"),
        ("BATCHSCOPE_MODEL__DEVICE", "tpu", "'auto', 'cpu', 'cuda' or 'mps'"),
        ("BATCHSCOPE_MODEL__DTYPE", "int8", "'auto', 'float32', 'float16' or 'bfloat16'"),
        ("BATCHSCOPE_MODEL__GPTQ_BITS", "5", "2, 3, 4 or 8"),
        ("BATCHSCOPE_MODEL__NAME_OR_PATH", "", "at least 1 character"),
        ("BATCHSCOPE_MODEL__TRUST_REMOTE_CODE", "maybe", "valid boolean"),
        ("BATCHSCOPE_TOKENIZER__PADDING_SIDE", "middle", "'left' or 'right'"),
        ("BATCHSCOPE_TOKENIZER__TRUNCATION_SIDE", "up", "'left' or 'right'"),
        ("BATCHSCOPE_TOKENIZER__MAX_PROMPT_TOKENS", "0", "greater than or equal to 1"),
        ("BATCHSCOPE_GENERATION__MAX_NEW_TOKENS", "0", "greater than or equal to 1"),
        ("BATCHSCOPE_GENERATION__TEMPERATURE", "0", "greater than 0"),
        ("BATCHSCOPE_GENERATION__TOP_K", "-1", "greater than or equal to 0"),
        ("BATCHSCOPE_GENERATION__TOP_P", "1.5", "less than or equal to 1"),
        ("BATCHSCOPE_GENERATION__REPETITION_PENALTY", "0", "greater than 0"),
        ("BATCHSCOPE_GENERATION__SEED", "-3", "greater than or equal to 0"),
        ("BATCHSCOPE_LIMITS__MAX_QUEUE_PER_SESSION", "0", "greater than or equal to 1"),
        ("BATCHSCOPE_LIMITS__MAX_QUEUE_TOTAL", "0", "greater than or equal to 1"),
        ("BATCHSCOPE_PROMPT__TEMPLATE", "Q: {question}", "must contain {prompt}"),
        ("BATCHSCOPE_PROMPT__TEMPLATE", "{prompt} {other}", "may only use the fields"),
    ],
)
def test_an_invalid_value_fails_with_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, allowed: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{variable}={value}:")
    assert allowed in message


def test_settings_tree_has_every_group() -> None:
    assert set(Settings.model_fields) >= {"model", "tokenizer", "generation", "batching", "limits", "prompt"}


def test_a_token_budget_not_above_the_slot_count_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHSCOPE_BATCHING__MAX_BATCH_SIZE", "32")
    monkeypatch.setenv("BATCHSCOPE_BATCHING__MAX_BATCHED_TOKENS", "32")
    expected = r"^BATCHSCOPE_BATCHING__MAX_BATCHED_TOKENS=32: .*must exceed max_batch_size=32"
    with pytest.raises(SettingsError, match=expected):
        load_settings()
