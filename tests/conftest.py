"""Shared fixtures: tiny random models of each architecture family, saved once per session to a temp folder."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
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

from tests.engine_helpers import KEEP_EAGER
from tests.vllm_helpers import RunningVllm, serving_benchmark_vllm

# Engines started by the tests (AppTest, browser, servers: subprocesses inherit this) run eager: compiling their
# decode steps in the background would take both of this machine's cores for half a minute per engine. The
# compiled path and the default's flow (eager at first, compiled when ready) have tests of their own that turn it on.
os.environ.setdefault(KEEP_EAGER, "false")
# One torch thread in the test process too, as the engine process runs a small model: on two cores shared with an
# engine process, a browser and a server, two threads per process mostly wait on each other (the eager families
# matrix took 491 s on two threads and 33 s on one, with other work on the machine). Tests of thread counts set
# their own.
torch.set_num_threads(1)

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


def _save_tiny_models(root: Path, configs: dict[str, PretrainedConfig]) -> dict[str, Path]:
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


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One folder per architecture, each holding a random-init model and the shared tiny tokenizer."""
    return _save_tiny_models(tmp_path_factory.mktemp("tiny-models"), TINY_CONFIGS)


@pytest.fixture(scope="session")
def family_model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A folder per model family of tests/families.py (its tiny config, random weights, the tiny tokenizer)."""
    from tests.families import FAMILIES

    configs = {family.name: family.config() for family in FAMILIES}
    return _save_tiny_models(tmp_path_factory.mktemp("family-models"), configs)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    """Under CI=true a skipped test is a failure: nothing may pass by being left out for a missing dependency."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI", "").lower() == "true" and report.skipped and call.when in ("setup", "call"):
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which requires every dependency: {report.longrepr}"


@pytest.fixture(scope="session")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningVllm]:
    """vLLM's real server on the embedded model, shared by the whole session: it takes about a minute to start
    (half of it compiling the model) and idles at about 2 % of a core. Skips when vLLM is not installed."""
    with serving_benchmark_vllm(tmp_path_factory.mktemp("vllm")) as server:
        yield server


# --- browser tests: the Streamlit server and chromium (helpers in tests/browser_helpers.py) -------------------------
@dataclass(frozen=True)
class AppServer:
    """A running `streamlit run` of the page: its address, and the file its log (stdout and stderr) goes to."""

    url: str
    log: Path


@pytest.fixture(scope="module")
def app_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    """`streamlit run` on a free port with the default settings (the embedded model), stopped by its PID."""
    from tests.browser_helpers import free_port, start_streamlit, stop_streamlit

    port = free_port()
    log_path = tmp_path_factory.mktemp("streamlit") / "server.log"
    with log_path.open("wb") as log:
        server = start_streamlit(port, log)
        try:
            yield AppServer(f"http://127.0.0.1:{port}", log_path)
        finally:
            stop_streamlit(server)


@pytest.fixture(scope="module")
def app_url(app_server: AppServer) -> str:
    return app_server.url


@pytest.fixture(scope="module")
def chromium() -> Iterator[object]:
    """Debian's chromium through Playwright (never `playwright install`), closed after the module."""
    from playwright.sync_api import sync_playwright

    from tests.browser_helpers import CHROMIUM, CHROMIUM_ARGS

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()
