"""The llama.cpp peer: tiny models converted to GGUF here, served by the real llama.cpp server, driven like ours.

These tests need the optional install (`requirements-llamacpp.txt`, part of `requirements-dev.txt`); without it
they skip, which CI (CI=true) counts as a failure. The outputs are checked against transformers' own greedy
`generate` with EOS suppressed (what llama.cpp's `ignore_eos` does), so a wrong conversion fails here.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from batching.arrivals import Schedule
from batching.bench.cli import main
from batching.bench.peers.gguf_convert import GGUFConversionError, convert, float_tensors
from batching.bench.peers.llamacpp_peer import NOT_INSTALLED, LlamaCppError, LlamaCppPeer, LlamaCppSettings, find_server
from batching.engine.request import FinishReason
from config.settings import ModelSettings
from model.loader import load_model

PROMPTS = [[1, 40, 41, 42, 43, 44, 45], [1, 50], [1, 60, 61, 62], [1, 70, 71, 72, 73, 74], [1, 80, 81], [1, 90]]
CAPS = [9, 3, 14, 5, 7, 4]
TEXTS = ["How do I track my order?", "Hello", "What's your return policy?", "Cats really like", "Paris", "Hi there"]


def _server() -> list[str]:
    command = find_server()
    if command is None:
        pytest.skip(NOT_INSTALLED)
    pytest.importorskip("gguf", reason=NOT_INSTALLED)
    return command


def _load(folder: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32), AutoTokenizer.from_pretrained(folder)


def _greedy_without_eos(model: PreTrainedModel, prompt: list[int], cap: int, eos: int) -> list[int]:
    ids = torch.tensor([prompt])
    # transformers types every model attribute as Module | Tensor; generate is a method of GenerationMixin
    out = model.generate(  # type: ignore[operator]
        ids, max_new_tokens=cap, do_sample=False, suppress_tokens=[eos], eos_token_id=None, pad_token_id=0
    )
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_every_request_gets_exactly_its_cap_of_the_same_greedy_tokens_as_transformers(
    family: str, tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    command = _server()
    model, tokenizer = _load(tiny_model_dirs[family])
    settings = LlamaCppSettings(
        convert(model, tokenizer, tmp_path), slots=3, context_per_slot=32, threads=1, batch_tokens=64
    )
    with LlamaCppPeer(command, settings, tokenizer, tmp_path) as peer:
        record, kv_lens = peer.run(PROMPTS, CAPS, Schedule.at_once(len(PROMPTS)), ignore_eos=True)
    assert kv_lens == [] and record.steps == []  # the server does not report its batches
    assert [event.request_id for event in record.finished] == [f"q{index}" for index in range(len(PROMPTS))]
    assert [event.output_tokens for event in record.finished] == CAPS
    assert all(event.reason is FinishReason.LENGTH and event.error is None for event in record.finished)
    expected = [
        _greedy_without_eos(model, prompt, cap, tokenizer.eos_token_id)
        for prompt, cap in zip(PROMPTS, CAPS, strict=True)
    ]
    assert [list(event.output_ids) for event in record.finished] == expected
    for event in record.finished:
        assert event.prompt_tokens == len(PROMPTS[int(event.request_id[1:])])
        assert event.arrival <= event.first_token <= event.finished <= record.end  # type: ignore[operator]
        assert event.slot in (0, 1, 2)
    assert record.wall_s > 0


def test_a_gptq_model_is_written_from_its_own_4bit_grid(family_model_dirs: dict[str, Path]) -> None:
    """The GPTQ layers unpacked to float weights: a float model holding them computes what the quantised model
    computes, up to its kernel's bfloat16 rounding (an unpacking off by a zero point, a bit order or a transpose
    is off by the weights' own size)."""
    quantised = load_model(ModelSettings(name_or_path=str(family_model_dirs["llama_gptq"])))
    weights = float_tensors(quantised.model)
    assert not any(name.endswith((".qweight", ".qzeros", ".scales", ".g_idx")) for name in weights)
    grid = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(family_model_dirs["llama_gptq"]))
    grid.load_state_dict(weights, strict=True)
    ids = torch.tensor([PROMPTS[0]])
    with torch.inference_mode():
        theirs = quantised.model(ids).logits
        ours = grid.eval()(ids).logits
    error = ((ours - theirs).norm() / theirs.norm()).item()
    assert error < 0.02, error


def test_q4_0_stores_the_layers_linear_weights_in_4_bits_and_serves_every_cap(
    family_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    command = _server()
    import gguf

    quantised = load_model(ModelSettings(name_or_path=str(family_model_dirs["llama_gptq"])))
    path = convert(quantised.model, quantised.tokenizer, tmp_path, weights="q4_0")
    assert path.name.endswith(".q4_0.gguf")
    kinds = {tensor.name: tensor.tensor_type.name for tensor in gguf.GGUFReader(path).tensors}
    linear = [name for name in kinds if name.endswith(("attn_q.weight", "attn_output.weight", "ffn_down.weight"))]
    assert len(linear) == 6 and all(kinds[name] == "Q4_0" for name in linear)
    assert kinds["token_embd.weight"] == "F32" and kinds["output_norm.weight"] == "F32"
    settings = LlamaCppSettings(path, slots=3, context_per_slot=32, threads=1, batch_tokens=64)
    with LlamaCppPeer(command, settings, quantised.tokenizer, tmp_path) as peer:
        record, _ = peer.run(PROMPTS, CAPS, Schedule.at_once(len(PROMPTS)), ignore_eos=True)
    assert [event.output_tokens for event in record.finished] == CAPS
    with pytest.raises(GGUFConversionError, match="weights='q8' is not a GGUF format here: one of f32, q4_0"):
        convert(quantised.model, quantised.tokenizer, tmp_path, weights="q8")


def test_a_request_due_at_a_later_step_is_sent_after_the_server_has_taken_that_many_steps(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    command = _server()
    model, tokenizer = _load(tiny_model_dirs["llama"])
    settings = LlamaCppSettings(
        convert(model, tokenizer, tmp_path), slots=2, context_per_slot=48, threads=1, batch_tokens=64
    )
    with LlamaCppPeer(command, settings, tokenizer, tmp_path) as peer:
        before = peer.decode_calls()
        record, _ = peer.run(PROMPTS[:3], [30, 30, 4], Schedule.per_step([0, 0, 20]), ignore_eos=True)
        assert peer.decode_calls() - before >= 30
    first, _, late = record.finished
    assert late.arrival > first.first_token  # type: ignore[operator]
    assert late.output_tokens == 4


def test_the_server_is_stopped_even_when_the_run_fails(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    command = _server()
    model, tokenizer = _load(tiny_model_dirs["llama"])
    settings = LlamaCppSettings(
        convert(model, tokenizer, tmp_path), slots=1, context_per_slot=16, threads=1, batch_tokens=16
    )
    peer = LlamaCppPeer(command, settings, tokenizer, tmp_path)
    with pytest.raises(RuntimeError, match="boom"), peer:
        url = peer.url
        assert peer.outside_cpu_s() >= 0
        raise RuntimeError("boom")
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{url}/health", timeout=5)


def test_extra_flags_come_after_ours_and_win(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    command = _server()
    model, tokenizer = _load(tiny_model_dirs["llama"])
    settings = LlamaCppSettings(convert(model, tokenizer, tmp_path), 2, 16, 1, 16, extra=("-kvu",))
    args = settings.args()
    assert args[-1] == "-kvu" and "-no-kvu" in args and args[args.index("-fa") + 1] == "on"  # the measured best
    with LlamaCppPeer(command, settings, tokenizer, tmp_path):
        pass
    assert "kv_unified = 'true'" in (tmp_path / "llama-server.log").read_text()


def test_a_model_converted_twice_is_taken_from_the_cache(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    pytest.importorskip("gguf", reason=NOT_INSTALLED)
    model, tokenizer = _load(tiny_model_dirs["llama"])
    first = convert(model, tokenizer, tmp_path)
    stamp = first.stat().st_mtime_ns
    assert convert(model, tokenizer, tmp_path) == first and first.stat().st_mtime_ns == stamp
    with torch.no_grad():
        model.model.norm.weight.add_(1.0)  # another model: another file
    assert convert(model, tokenizer, tmp_path) != first
    assert sorted(path.suffix for path in tmp_path.iterdir()) == [".gguf", ".gguf"]  # no partial file left


def test_a_model_of_another_family_is_refused_naming_its_type(
    family_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    model, tokenizer = _load(family_model_dirs["mistral"])
    with pytest.raises(GGUFConversionError, match=r"'mistral'.*llama, qwen2, gpt2"):
        convert(model, tokenizer, tmp_path)


def _workload(folder: Path) -> Path:
    path = folder / "small.json"
    rows = [{"prompt": text, "max_new_tokens": cap} for text, cap in zip(TEXTS, CAPS, strict=True)]
    path.write_text(json.dumps({"name": "small", "batch_size": 3, "requests": rows}))
    return path


def _bench(argv: list[str]) -> int:
    return main(["race", *argv, "--device", "cpu", "--dtype", "float32", "--threads", "1", "--no-progress"])


def test_the_benchmark_reports_a_llamacpp_row_like_the_other_modes(
    tiny_model_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    _server()
    monkeypatch.setenv("BATCHSCOPE_GGUF_CACHE", str(tmp_path / "gguf"))
    out = tmp_path / "out.json"
    argv = ["--workload", str(_workload(tmp_path)), "--modes", "static,llamacpp", "--ignore-eos", "--repeat", "2"]
    assert _bench([*argv, "--model", str(tiny_model_dirs["llama"]), "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert any(line.split()[0] == "llamacpp" for line in table.splitlines() if line.strip())
    figures = json.loads(out.read_text())["modes"]["llamacpp"]
    assert figures["output_tokens"] == sum(CAPS) and figures["requests_finished"] == len(CAPS)
    assert [request["output_tokens"] for request in figures["requests"]] == CAPS
    assert all(request["finish_reason"] == "length" for request in figures["requests"])
    assert figures["tokens_per_s"] > 0 and figures["speedup_vs_static"] > 0 and len(figures["wall_s_runs"]) == 2
    assert figures["cpu_s"] > 0 and figures["policy"] == "fifo" and figures["steps"] is None
    assert figures["ttft_s"]["p50"] <= figures["ttft_s"]["p99"]
    assert list((tmp_path / "gguf").glob("*.gguf"))  # the conversion went to the cache asked for


def test_without_llamacpp_the_benchmark_says_not_installed_and_runs_the_other_modes(
    tiny_model_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no llama-server binary on PATH
    monkeypatch.setitem(sys.modules, "xllamacpp", None)  # and the wheel cannot be imported
    out = tmp_path / "out.json"
    argv = ["--workload", str(_workload(tmp_path)), "--modes", "continuous,llamacpp", "--json", str(out)]
    assert _bench([*argv, "--model", str(tiny_model_dirs["llama"])]) == 0
    captured = capsys.readouterr()
    assert "llamacpp: not installed (pip install -r requirements-llamacpp.txt)" in captured.err
    assert set(json.loads(out.read_text())["modes"]) == {"continuous"}
    assert _bench(["--workload", str(_workload(tmp_path)), "--modes", "llamacpp"]) == 2
    assert "no mode left" in capsys.readouterr().err


def test_a_llama_server_path_that_does_not_exist_is_one_line_and_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    argv = ["--workload", str(_workload(tmp_path)), "--modes", "continuous,llamacpp"]
    assert _bench([*argv, "--llama-server", "/nonexistent/llama-server"]) == 2
    err = capsys.readouterr().err
    assert err == "bench race: error: --llama-server /nonexistent/llama-server: no such executable\n"


def test_a_model_family_the_converter_does_not_know_is_one_line_and_exit_code_2(
    family_model_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    _server()
    argv = ["--workload", str(_workload(tmp_path)), "--modes", "continuous,llamacpp"]
    assert _bench([*argv, "--model", str(family_model_dirs["mistral"])]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench race: error: llamacpp: model type 'mistral'") and err.count("\n") == 1


def test_a_server_that_cannot_load_its_model_is_reported_with_its_log(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    command = _server()
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF not really")
    settings = LlamaCppSettings(broken, slots=1, context_per_slot=16, threads=1, batch_tokens=16)
    _, tokenizer = _load(tiny_model_dirs["llama"])
    with pytest.raises(LlamaCppError, match="exited with code"), LlamaCppPeer(command, settings, tokenizer, tmp_path):
        pass
