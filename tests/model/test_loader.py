"""Model loading: device and dtype choice, local folders, the offline-hub and GPTQ messages."""

from __future__ import annotations

import http.server
import socket
import threading

import pytest
import torch

from batching.engine.model_support import model_context_length
from config.settings import ModelSettings, TokenizerSettings
from model import loader
from model.loader import ModelLoadError, load_model, resolve_device, resolve_dtype


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_a_tiny_model_saved_to_a_folder_loads_ready_for_inference(tiny_model_dirs, arch: str) -> None:
    loaded = load_model(ModelSettings(name_or_path=str(tiny_model_dirs[arch]), device="cpu"))
    assert loaded.device.type == "cpu"
    assert loaded.dtype == torch.float32
    assert not loaded.model.training
    assert not any(p.requires_grad for p in loaded.model.parameters())
    assert loaded.tokenizer.pad_token is not None
    assert loaded.num_parameters > 0
    assert model_context_length(loaded.model) == 512


def test_tokenizer_sides_come_from_settings(tiny_model_dirs) -> None:
    loaded = load_model(
        ModelSettings(name_or_path=str(tiny_model_dirs["llama"])),
        TokenizerSettings(padding_side="right", truncation_side="right"),
    )
    assert loaded.tokenizer.padding_side == "right"
    assert loaded.tokenizer.truncation_side == "right"


def test_a_model_without_pad_token_gets_eos_as_pad(tiny_model_dirs, tmp_path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dirs["gpt2"])
    tokenizer.pad_token = None
    folder = tmp_path / "nopad"
    tokenizer.save_pretrained(folder)
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        source = tiny_model_dirs["gpt2"] / name
        if source.exists():
            (folder / name).write_bytes(source.read_bytes())
    loaded = load_model(ModelSettings(name_or_path=str(folder)))
    assert loaded.tokenizer.pad_token == loaded.tokenizer.eos_token


def test_auto_device_picks_cpu_without_accelerators(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")


def test_auto_device_prefers_cuda_then_mps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert resolve_device("auto").type == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto").type == "mps"


def test_an_absent_device_asked_for_by_name_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ModelLoadError, match="BATCHSCOPE_MODEL__DEVICE=cuda"):
        resolve_device("cuda")


def test_auto_dtype_is_float32_on_cpu_and_mps_and_half_precision_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("auto", torch.device("mps")) == torch.float32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert resolve_dtype("auto", torch.device("cuda")) == torch.float16
    assert resolve_dtype("float16", torch.device("cpu")) == torch.float16


def test_an_unreachable_hub_id_names_the_setting_to_change(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    # The hub library reads HF_HUB_OFFLINE once at import; without it the lookup retries the network for ~45 s.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelLoadError) as caught:
        load_model(ModelSettings(name_or_path="nobody-here/no-such-model-xyz"))
    message = str(caught.value)
    assert "\n" not in message
    assert "BATCHSCOPE_MODEL__NAME_OR_PATH=nobody-here/no-such-model-xyz" in message
    assert "builtin" in message


def test_a_folder_without_a_model_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(ModelLoadError, match=r"no config\.json in that folder"):
        load_model(ModelSettings(name_or_path=str(tmp_path)))


# --- a local folder that is not a model ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (
            b'{"model_type": "llama", "hidden_size": 64',
            "is not valid JSON (Expecting ',' delimiter at line 1, column 42)",
        ),
        (b"", "is not valid JSON (Expecting value at line 1, column 1)"),
        (b'["llama"]', "holds a JSON list, not the object of a model's configuration"),
        (b'{"model_type": "caf\xe9"}', "is not UTF-8 text (byte 0xE9 at offset 19)"),
    ],
)
def test_a_folder_with_a_corrupt_config_says_what_is_wrong_with_it(tmp_path, content: bytes, problem: str) -> None:
    (tmp_path / "config.json").write_bytes(content)
    with pytest.raises(ModelLoadError) as caught:
        load_model(ModelSettings(name_or_path=str(tmp_path)))
    assert str(caught.value) == (
        f"BATCHSCOPE_MODEL__NAME_OR_PATH={tmp_path}: {tmp_path / 'config.json'} {problem}; "
        "save the model again with save_pretrained, or set BATCHSCOPE_MODEL__NAME_OR_PATH=builtin"
    )


def test_a_folder_whose_config_transformers_refuses_names_the_folder_not_the_hub(tmp_path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "llama", "hidden_size": "lots"}')
    with pytest.raises(ModelLoadError) as caught:
        load_model(ModelSettings(name_or_path=str(tmp_path)))
    message = str(caught.value)
    assert message.startswith(f"BATCHSCOPE_MODEL__NAME_OR_PATH={tmp_path}: the folder {tmp_path} does not hold a model")
    assert "hidden_size" in message and "\n" not in message and "hub" not in message


# --- the hub, offline or unreachable ----------------------------------------------------------------------------------
def closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens there once the probe socket is closed


@pytest.fixture
def fresh_hub_memory(monkeypatch: pytest.MonkeyPatch) -> dict:
    memory: dict = {}
    monkeypatch.setattr(loader, "_hub_failures", memory)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return memory


def test_with_hf_hub_offline_a_hub_id_not_in_the_cache_fails_at_once_and_is_remembered(
    monkeypatch: pytest.MonkeyPatch, fresh_hub_memory: dict
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", closed_port_url())
    settings = ModelSettings(name_or_path="nobody-here/offline-model-xyz")
    with pytest.raises(ModelLoadError) as first:
        load_model(settings)
    assert str(first.value) == (
        "could not load BATCHSCOPE_MODEL__NAME_OR_PATH=nobody-here/offline-model-xyz: HF_HUB_OFFLINE is set, and the "
        "model is not in the local hub cache; set BATCHSCOPE_MODEL__NAME_OR_PATH=builtin or to a local folder "
        "(or connect, and restart the app)"
    )
    with pytest.raises(ModelLoadError) as again:
        load_model(settings)
    assert again.value is first.value  # remembered: no second attempt
    with pytest.raises(ModelLoadError) as changed:
        load_model(settings.model_copy(update={"revision": "v2"}))
    assert changed.value is not first.value and len(fresh_hub_memory) == 2  # new settings, a new attempt


def test_an_unreachable_hub_fails_fast_naming_it_and_is_remembered_until_settings_change(
    monkeypatch: pytest.MonkeyPatch, fresh_hub_memory: dict
) -> None:
    endpoint = closed_port_url()
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    settings = ModelSettings(name_or_path="nobody-here/unreachable-model-xyz")
    with pytest.raises(ModelLoadError) as first:
        load_model(settings)
    message = str(first.value)
    assert message.startswith(
        "could not load BATCHSCOPE_MODEL__NAME_OR_PATH=nobody-here/unreachable-model-xyz: "
        f"the model hub ({endpoint}) cannot be reached ("
    )
    assert "not in the local hub cache" in message and "\n" not in message
    with pytest.raises(ModelLoadError) as again:
        load_model(settings)
    assert again.value is first.value
    monkeypatch.setenv("HF_ENDPOINT", closed_port_url())  # another hub address is another attempt
    with pytest.raises(ModelLoadError) as other:
        load_model(settings)
    assert other.value is not first.value


class _Answering(http.server.BaseHTTPRequestHandler):
    def do_HEAD(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_the_hub_probe_passes_when_the_hub_answers_and_fails_when_nothing_listens() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answering)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert loader.hub_unreachable(f"http://127.0.0.1:{server.server_address[1]}", timeout_s=2) is None
    finally:
        server.shutdown()
        server.server_close()
    url = closed_port_url()
    assert loader.hub_unreachable(url, timeout_s=2).startswith(f"the model hub ({url}) cannot be reached (")
