"""Model loading: device and dtype choice, local folders, the offline-hub and GPTQ messages."""

from __future__ import annotations

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


def test_gptq_without_its_backend_says_what_to_install(tiny_model_dirs, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader, "is_gptqmodel_available", lambda: False)
    with pytest.raises(ModelLoadError) as caught:
        load_model(ModelSettings(name_or_path=str(tiny_model_dirs["llama"]), use_gptq=True))
    assert "gptqmodel" in str(caught.value)
    assert "requirements-gptq.txt" in str(caught.value)


def test_gptq_without_a_gpu_says_so(tiny_model_dirs, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader, "is_gptqmodel_available", lambda: True)
    monkeypatch.setattr(loader, "is_optimum_available", lambda: True)
    with pytest.raises(ModelLoadError, match="needs a CUDA GPU"):
        load_model(ModelSettings(name_or_path=str(tiny_model_dirs["llama"]), device="cpu", use_gptq=True))
