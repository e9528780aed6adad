"""GPTQ on a CPU: a quantised folder loads as itself or not at all, quantising on load and by command, the
calibration texts that need no hub. The engine's exactness on GPTQ weights is the families matrix's
(tests/engine/families.py: llama_gptq, qwen2_gptq)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from config.settings import ModelSettings
from model import gptq
from model.errors import ModelLoadError
from model.loader import check_load_report, load_model
from model.quantize import main as quantize_main
from tests.engine.helpers import reference
from training.calibration import calibration_lines

PROMPT = [5, 17, 33, 8, 91, 4]


def _copy(folder: Path, to: Path) -> Path:
    shutil.copytree(folder, to)
    return to


def test_a_gptq_folder_loads_as_itself_with_its_quantised_layers(family_model_dirs) -> None:
    loaded = load_model(ModelSettings(name_or_path=str(family_model_dirs["llama_gptq"]), device="cpu"))
    layer = loaded.model.model.layers[0].self_attn.q_proj
    assert not isinstance(layer, torch.nn.Linear) and hasattr(layer, "qweight")  # gptqmodel's kernel, packed int4
    assert loaded.weights.quantized and loaded.weights.precision == "4-bit GPTQ, group 64"
    plain = load_model(ModelSettings(name_or_path=str(family_model_dirs["llama"]), device="cpu"))
    assert plain.weights.precision == "float32" and not plain.weights.quantized
    assert loaded.weights.bytes < plain.weights.bytes / 1.5  # embeddings stay float32 at this size
    assert "4-bit GPTQ, group 64 weights" in loaded.weights.line()


def test_loading_a_gptq_folder_without_its_quantization_config_is_refused(family_model_dirs) -> None:
    """What transformers does when told `quantization_config=None`: plain linears with random weights, the packed
    ones left over. The load report says so, and the loader turns it into an error, never a served model."""
    folder = family_model_dirs["llama_gptq"]
    _, report = AutoModelForCausalLM.from_pretrained(folder, quantization_config=None, output_loading_info=True)
    with pytest.raises(ModelLoadError, match=r"not every weight loaded \(\d+ weights missing from its files"):
        check_load_report(str(folder), report)


def test_a_gptq_folder_stripped_of_its_config_is_refused_by_the_loader(family_model_dirs, tmp_path) -> None:
    folder = _copy(family_model_dirs["llama_gptq"], tmp_path / "stripped")
    config = json.loads((folder / "config.json").read_text())
    del config["quantization_config"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError) as caught:
        load_model(ModelSettings(name_or_path=str(folder)))
    message = str(caught.value)
    assert "weights missing from its files" in message and "weights in its files but not in the model" in message
    assert "qweight" in message and "\n" not in message


def test_a_plain_folder_with_a_weight_missing_is_refused(tiny_model_dirs, tmp_path) -> None:
    folder = _copy(tiny_model_dirs["qwen2"], tmp_path / "short")
    weights = load_file(folder / "model.safetensors")
    del weights["model.layers.1.mlp.down_proj.weight"]
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"1 weights missing from its files .*: model\.layers\.1\.mlp\.down_proj"):
        load_model(ModelSettings(name_or_path=str(folder)))


def test_a_folder_quantised_with_a_method_we_do_not_run_is_refused_naming_it(tiny_model_dirs, tmp_path) -> None:
    folder = _copy(tiny_model_dirs["llama"], tmp_path / "awq")
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": 4}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"is quantised with 'awq', which Batchscope does not run"):
        load_model(ModelSettings(name_or_path=str(folder)))


def test_gptq_without_its_backend_says_what_to_install(
    family_model_dirs, tiny_model_dirs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gptq, "is_gptqmodel_available", lambda: False)
    for settings in (
        ModelSettings(name_or_path=str(tiny_model_dirs["llama"]), use_gptq=True),
        ModelSettings(name_or_path=str(family_model_dirs["qwen2_gptq"])),  # a GPTQ folder needs it too
    ):
        with pytest.raises(ModelLoadError, match=r"needs the GPTQ backend \(gptqmodel not installed\)") as caught:
            load_model(settings)
        assert "requirements-gptq.txt" in str(caught.value) and "GPU" not in str(caught.value)


def test_quantising_on_load_makes_a_copy_once_that_answers_as_itself(
    tiny_model_dirs, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a CPU, no hub: the embedded corpus calibrates; the second load finds the copy in the cache; the answers
    are the quantised model's own `generate`, which differ from the float model's (random weights amplify it)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    settings = ModelSettings(name_or_path=str(tiny_model_dirs["qwen2"]), device="cpu", use_gptq=True, gptq_bits=4)
    first = load_model(settings)
    copies = list((tmp_path / "cache" / "batchscope" / "gptq").iterdir())
    assert len(copies) == 1 and first.weights.quantized
    made = copies[0].stat().st_mtime_ns
    second = load_model(settings)
    assert list((tmp_path / "cache" / "batchscope" / "gptq").iterdir()) == copies
    assert copies[0].stat().st_mtime_ns == made
    assert reference(second.model, PROMPT, 12) == reference(first.model, PROMPT, 12)


def test_a_text_file_calibrates_and_a_bad_one_is_refused(tmp_path) -> None:
    texts = tmp_path / "texts.txt"
    texts.write_text("first text\n\n  second text  \n", encoding="utf-8")
    assert gptq.calibration_texts(str(texts)) == ["first text", "second text"]
    (tmp_path / "empty.txt").write_text("\n \n", encoding="utf-8")
    with pytest.raises(ModelLoadError, match="holds no text"):
        gptq.calibration_texts(str(tmp_path / "empty.txt"))
    with pytest.raises(ModelLoadError, match=r"GPTQ_DATASET=.*nowhere\.txt: cannot read it"):
        gptq.calibration_texts(str(tmp_path / "nowhere.txt"))


def test_the_shipped_calibration_texts_are_what_the_corpus_writes() -> None:
    stale = "model/calibration.txt is stale: run python -m training.calibration"
    assert gptq.calibration_texts() == calibration_lines(), stale


def test_the_group_size_is_the_largest_that_divides_every_width(tiny_model_dirs) -> None:
    from transformers import LlamaConfig

    assert gptq.group_size(LlamaConfig(hidden_size=256, intermediate_size=512, num_attention_heads=8)) == 128
    assert gptq.group_size(LlamaConfig(hidden_size=896, intermediate_size=4864, num_attention_heads=14)) == 128
    assert gptq.group_size(LlamaConfig(hidden_size=320, intermediate_size=640, num_attention_heads=5)) == 64
    with pytest.raises(ModelLoadError, match=r"multiple of 32; this model's are \[40, 80\]"):
        gptq.group_size(LlamaConfig(hidden_size=40, intermediate_size=80, num_attention_heads=4))


def test_the_command_quantises_a_folder_offline_keeping_its_generation_defaults(
    tiny_model_dirs, tmp_path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # gptqmodel's log folder must not land here either
    out = tmp_path / "out"
    assert quantize_main([str(tiny_model_dirs["llama"]), str(out), "--bits", "8"]) == 0
    printed = capsys.readouterr().out
    assert "to 8 bits (GPTQ, group size 64) in " in printed and f"written to {out}" in printed
    assert " MiB -> " in printed
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["bits"] == 8 and config["quantization_config"]["quant_method"] == "gptq"
    source_defaults = json.loads((tiny_model_dirs["llama"] / "generation_config.json").read_text())
    assert json.loads((out / "generation_config.json").read_text()) == source_defaults
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out"]  # no log folder, no half-made copy
    assert load_model(ModelSettings(name_or_path=str(out))).weights.precision == "8-bit GPTQ, group 64"


def test_the_command_says_what_is_wrong_in_one_line(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    assert quantize_main([str(tmp_path / "nothing-here"), str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and error.count("\n") == 1
    assert not (tmp_path / "out").exists()
