"""Settings come from the environment and `.env`; every bad value fails with one line naming the variable."""

from __future__ import annotations

import pytest

from config.settings import Settings, SettingsError, load_settings, setting_names, setting_warnings


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
        ("BATCHSCOPE_ENGINE__MAX_SHARED_BATCHERS", "0", "greater than or equal to 1"),
        ("BATCHSCOPE_ENGINE__IDLE_SHARED_BATCHER_TIMEOUT_S", "0", "greater than 0"),
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


# --- a .env that is not UTF-8 --------------------------------------------------------------------------------------
def test_a_dotenv_that_is_not_utf8_fails_with_one_line_naming_the_file_the_byte_and_the_encoding(tmp_path) -> None:
    (tmp_path / ".env").write_bytes(b"BATCHSCOPE_BATCHING__POLICY=fcfs\nBATCHSCOPE_PROMPT__SYSTEM_PROMPT=caf\xe9\n")
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert str(caught.value) == (
        f"{(tmp_path / '.env').resolve()}: byte 0xE9 at offset 69 (line 2) is not utf-8; save the file as UTF-8"
    )


# --- misspelt settings -----------------------------------------------------------------------------------------------
def test_every_setting_name_is_one_the_settings_read(monkeypatch: pytest.MonkeyPatch) -> None:
    names = setting_names()
    groups = {name: info.annotation.model_fields for name, info in Settings.model_fields.items()}
    assert len(names) == len(groups) + sum(len(fields) for fields in groups.values())
    monkeypatch.setenv("BATCHSCOPE_LIMITS__MAX_QUEUE_TOTAL", "7")
    assert "BATCHSCOPE_LIMITS__MAX_QUEUE_TOTAL" in names and load_settings().limits.max_queue_total == 7


def test_a_misspelt_variable_is_warned_about_with_the_closest_setting() -> None:
    environ = {
        "BATCHSCOPE_BATCHING__MAX_BATCH_SIZ": "3",
        "BATCHSCOPE_GENERATION_SEED": "4",  # one underscore where two belong
        "BATCHSCOPE_BATCHING__MAX_BATCH_SIZE": "5",  # fine
        "batchscope_model__name_or_path": "builtin",  # fine: names are case-insensitive
        "BATCHSCOPE_MODEL": '{"dtype": "float32"}',  # fine: a whole group as JSON
        "BATCHSCOPE_XYZZY": "1",
        "PATH": "/usr/bin",  # not ours
    }
    assert setting_warnings(environ) == [
        "BATCHSCOPE_BATCHING__MAX_BATCH_SIZ (environment variable) is not a setting and is ignored; "
        "did you mean BATCHSCOPE_BATCHING__MAX_BATCH_SIZE?",
        "BATCHSCOPE_GENERATION_SEED (environment variable) is not a setting and is ignored; "
        "did you mean BATCHSCOPE_GENERATION__SEED?",
        "BATCHSCOPE_XYZZY (environment variable) is not a setting and is ignored; "
        "settings are named BATCHSCOPE_<GROUP>__<FIELD>",
    ]


def test_a_misspelt_variable_really_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    """Why the warning matters: the value does not reach the settings."""
    monkeypatch.setenv("BATCHSCOPE_BATCHING__MAX_BATCH_SIZ", "3")
    assert load_settings().batching.max_batch_size == 8
    assert any("did you mean BATCHSCOPE_BATCHING__MAX_BATCH_SIZE" in line for line in setting_warnings())


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("BATCHSCOPE_ENGINE__MAX_ENGINES", "BATCHSCOPE_ENGINE__MAX_SHARED_BATCHERS", "max_shared_batchers"),
        (
            "BATCHSCOPE_ENGINE__IDLE_ENGINE_TIMEOUT_S",
            "BATCHSCOPE_ENGINE__IDLE_SHARED_BATCHER_TIMEOUT_S",
            "idle_shared_batcher_timeout_s",
        ),
    ],
)
def test_a_renamed_setting_still_works_under_its_old_name_and_the_warning_names_the_new_one(
    monkeypatch: pytest.MonkeyPatch, old: str, new: str, field: str
) -> None:
    monkeypatch.setenv(old, "7")
    assert getattr(load_settings().engine, field) == 7
    assert setting_warnings() == [
        f"{old} (environment variable) was renamed {new}: it still works, but use the new name"
    ]
    monkeypatch.setenv(new, "9")  # both given: the new name wins
    assert getattr(load_settings().engine, field) == 9


def test_dotenv_keys_that_are_not_settings_are_warned_about(tmp_path) -> None:
    (tmp_path / ".env").write_text(
        "BATCHSCOPE_BATCHING__POLICY=longest-first\nBATCHSCOPE_BATCHING__POLCY=fcfs\nMODEL__NAME_OR_PATH=x\n"
    )
    where = f"key in {(tmp_path / '.env').resolve()}"
    assert setting_warnings({}) == [
        f"BATCHSCOPE_BATCHING__POLCY ({where}) is not a setting and is ignored; "
        "did you mean BATCHSCOPE_BATCHING__POLICY?",
        f"MODEL__NAME_OR_PATH ({where}) is not a setting and is ignored; did you mean BATCHSCOPE_MODEL__NAME_OR_PATH?",
    ]


def test_a_correct_environment_and_dotenv_give_no_warning(tmp_path) -> None:
    (tmp_path / ".env").write_text("BATCHSCOPE_BATCHING__POLICY=fcfs\n")
    assert setting_warnings({"BATCHSCOPE_MODEL__DEVICE": "cpu", "HOME": "/root"}) == []


def test_the_benchmark_cli_warns_about_misspelt_settings_before_anything_else(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from batching.bench.cli import main

    monkeypatch.setenv("BATCHSCOPE_BATCHING__MAX_BATCH_SIZ", "3")
    assert main(["race", "--workload", "no-such-workload"]) == 2  # bad input, found before a model is loaded
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        "bench race: warning: BATCHSCOPE_BATCHING__MAX_BATCH_SIZ (environment variable) is not a setting and is "
        "ignored; did you mean BATCHSCOPE_BATCHING__MAX_BATCH_SIZE?"
    )
    assert err[1].startswith("bench race: error: ")
