"""Real-size model shapes built here with random weights (`--model-shape`): their sizes, the cache, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoConfig, AutoTokenizer

from batching.bench import shapes
from batching.bench.cli import main
from batching.bench.shapes import build_shape, parse_shape
from model.loader import BUILTIN_MODEL_DIR


def test_a_shape_keeps_the_real_models_widths_with_the_layers_asked_for(tmp_path: Path) -> None:
    folder = build_shape("qwen2-0.5b:1", tmp_path / "qwen")
    config = AutoConfig.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(BUILTIN_MODEL_DIR)
    assert (config.model_type, config.hidden_size, config.intermediate_size) == ("qwen2", 896, 4864)
    assert (config.num_attention_heads, config.num_key_value_heads, config.num_hidden_layers) == (14, 2, 1)
    assert config.vocab_size == len(tokenizer) and config.tie_word_embeddings
    assert AutoTokenizer.from_pretrained(folder).encode("Where is my order?") == tokenizer.encode("Where is my order?")
    assert not (tmp_path / "qwen.partial").exists()
    written = (folder / "model.safetensors").stat().st_mtime_ns
    assert build_shape("qwen2-0.5b:1", tmp_path / "qwen") == folder  # built once, then found
    assert (folder / "model.safetensors").stat().st_mtime_ns == written


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("llama-70b", "model shape .llama-70b. is not allowed: choose one of qwen2-0.5b, lfm2-350m"),
        ("qwen2-0.5b:0", "LAYERS after ':' must be a whole number >= 1"),
        ("qwen2-0.5b:two", "LAYERS after ':' must be a whole number >= 1"),
    ],
)
def test_a_bad_shape_is_refused_in_one_line(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_shape(text)
    assert parse_shape("qwen2-0.5b:3") == ("qwen2-0.5b", 3)


def test_a_folder_holding_something_else_is_not_overwritten(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="is not empty and holds no model"):
        build_shape("qwen2-0.5b:1", tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_the_benchmark_runs_our_engine_on_a_shape_built_in_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(shapes, "shape_cache_dir", lambda: tmp_path / "cache")
    workload = tmp_path / "two.json"
    rows = [{"prompt": "Where is my order?", "max_new_tokens": 3}, {"prompt": "Hello", "max_new_tokens": 2}]
    workload.write_text(json.dumps({"name": "two", "batch_size": 2, "requests": rows}))
    out = tmp_path / "out.json"
    argv = ["--workload", str(workload), "--model-shape", "qwen2-0.5b:1", "--modes", "static,continuous"]
    argv += ["--ignore-eos", "--json", str(out), "--threads", "1", "--no-progress", "--device", "cpu"]
    assert main(["race", *argv]) == 0
    result = json.loads(out.read_text())
    assert result["modes"]["continuous"]["outputs_match_static"] is True
    assert (tmp_path / "cache" / "qwen2-0.5b-1" / "config.json").is_file()
    assert main(["race", *argv[:4], "--model", "builtin", *argv[4:]]) == 2
    assert "--model and --model-shape are not allowed together" in capsys.readouterr().err


def test_a_hybrid_shape_cut_short_keeps_its_pattern_and_an_attention_layer(tmp_path: Path) -> None:
    config = AutoConfig.from_pretrained(build_shape("lfm2-350m:3", tmp_path / "lfm2"))
    assert (config.model_type, config.hidden_size, config.num_hidden_layers) == ("lfm2", 1024, 3)
    assert config.layer_types == ["conv", "conv", "full_attention"]
    full = shapes.SHAPES["lfm2-350m"].sizes["layer_types"]
    assert isinstance(full, list) and full.count("conv") == 10 and full.count("full_attention") == 6
