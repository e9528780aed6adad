"""The race (`python -m batching.bench race`), run in-process on tiny models: its JSON, its arithmetic, its errors,
the transformers peer."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from batching.bench import race
from batching.bench.cli import main
from batching.bench.floor import floor_step
from batching.bench.peers import contenders
from batching.bench.plan import ModeRun
from batching.bench.plot import bench_chart
from batching.bench.report import speedup_figures, step_time_stats
from batching.engine.events import FinishedEvent, StepEvent
from batching.engine.request import FinishReason
from batching.engine.threads import ThreadChoice
from batching.runs import RunRecord
from tests.engine.helpers import loaded
from utils.metrics.run import percentile

CAPS = [6, 2, 9, 3, 5, 4]
PROMPTS = ["How do I track my order?", "Hello", "What's your return policy?", "Cats really like", "Paris", "Hi there"]
SUMMARY_KEYS = {"wall_s", "output_tokens", "tokens_per_s", "steps", "mean_occupancy", "ttft_s", "tpot_s", "e2e_s"}
REQUEST_KEYS = {"prompt_ids", "output_ids", "finish_reason", "ttft_s", "e2e_s"}


def _json_workload(folder: Path, batch_size: int = 3) -> Path:
    path = folder / "small.json"
    rows = [{"prompt": p, "max_new_tokens": c} for p, c in zip(PROMPTS, CAPS, strict=True)]
    path.write_text(json.dumps({"name": "small", "batch_size": batch_size, "requests": rows}))
    return path


def _run(argv: list[str]) -> int:
    # One thread: on a shared machine a second OpenMP thread can make a tiny forward pass 100x slower.
    return main(["race", *argv, "--device", "cpu", "--dtype", "float32", "--threads", "1", "--no-progress"])


@pytest.fixture(scope="module")
def bench_result(tiny_model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict:
    folder = tmp_path_factory.mktemp("bench")
    out, png = folder / "out.json", folder / "out.png"
    argv = ["--workload", str(_json_workload(folder)), "--modes", "static,continuous", "--model"]
    argv += [str(tiny_model_dirs["llama"]), "--ignore-eos", "--repeat", "2", "--json", str(out), "--plot", str(png)]
    assert _run(argv) == 0
    return {"json": json.loads(out.read_text()), "png": png}


def test_the_json_has_every_field_for_every_mode(bench_result: dict) -> None:
    result = bench_result["json"]
    assert {"workload", "model", "device", "dtype", "batch_size", "policy", "modes"} <= set(result)
    assert (result["workload"], result["device"], result["dtype"]) == ("small", "cpu", "float32")
    assert (result["batch_size"], result["policy"]) == (3, "fcfs")
    assert set(result["modes"]) == {"static", "continuous"}
    for figures in result["modes"].values():
        assert set(figures) >= SUMMARY_KEYS
        for key in ("ttft_s", "tpot_s", "e2e_s"):
            assert figures[key]["p50"] <= figures[key]["p99"]
        assert figures["output_tokens"] == sum(CAPS)
        assert len(figures["wall_s_runs"]) == 2
        assert figures["step_time"]["decode_steps"] > 0
        assert len(figures["requests"]) == len(CAPS)
        for request, cap in zip(figures["requests"], CAPS, strict=True):
            assert set(request) >= REQUEST_KEYS
            assert request["finish_reason"] == "length"
            assert len(request["output_ids"]) == cap
    continuous = result["modes"]["continuous"]
    for key in ("speedup_vs_static", "ideal_speedup", "efficiency", "speedup_cpu_vs_static", "efficiency_cpu"):
        assert continuous[key] > 0


def test_requests_keep_the_workload_order(bench_result: dict) -> None:
    requests = bench_result["json"]["modes"]["continuous"]["requests"]
    assert [request["request_id"] for request in requests] == [f"q{i}" for i in range(len(CAPS))]
    assert [request["max_new_tokens"] for request in requests] == CAPS


def test_static_and_continuous_give_the_same_greedy_tokens(bench_result: dict) -> None:
    modes = bench_result["json"]["modes"]
    static, continuous = modes["static"]["requests"], modes["continuous"]["requests"]
    assert [r["output_ids"] for r in static] == [r["output_ids"] for r in continuous]
    assert [r["prompt_ids"] for r in static] == [r["prompt_ids"] for r in continuous]
    assert modes["continuous"]["outputs_match_static"] is True


def test_continuous_needs_fewer_steps_than_static_waves(bench_result: dict) -> None:
    modes = bench_result["json"]["modes"]
    # Waves of 3 in order: caps (6, 2, 9) then (3, 5, 4) -> 9 + 5 steps; continuous packs them tighter.
    assert modes["static"]["steps"] == 14
    assert modes["continuous"]["steps"] < 14
    assert modes["continuous"]["ideal_speedup"] == pytest.approx(14 / modes["continuous"]["steps"])


def test_without_kv_flags_every_slot_gets_its_whole_context_and_static_reserves_more_than_it_uses(
    bench_result: dict,
) -> None:
    modes = bench_result["json"]["modes"]
    assert modes["static"]["memory"]["pool_blocks"] == modes["continuous"]["memory"]["pool_blocks"]
    for figures in modes.values():
        memory = figures["memory"]
        assert memory["block_size"] == 16 and memory["preemptions"] == 0
        assert memory["pool_positions"] % 3 == 0  # three slots of the same length
        assert 0 < memory["peak_tokens"] <= memory["peak_reserved"] <= memory["pool_positions"]
    # A wave reserves its longest prompt plus its largest cap for every member; continuous takes blocks as it goes,
    # never more than that for the same slots (on this small, even workload the two come out alike).
    assert modes["static"]["memory"]["peak_reserved"] >= modes["continuous"]["memory"]["peak_reserved"]
    assert modes["static"]["memory"]["used_over_reserved"] < 1
    assert modes["static"]["memory"]["prefix_queries"] == 0  # static waves never reuse a prefix
    assert modes["continuous"]["memory"]["prefix_hits"] > 0  # the prompts share the template's system prompt


def test_a_tight_pool_preempts_continuous_and_shrinks_static_waves_with_the_same_tokens(
    tiny_model_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "tight.json"
    argv = ["--workload", str(_json_workload(tmp_path)), "--modes", "static,continuous", "--model"]
    argv += [str(tiny_model_dirs["llama"]), "--ignore-eos", "--kv-cache-tokens", "96", "--block-size", "4"]
    # Prompts of 80-87 tokens in chunks of 16, sharing the template's system prompt (the first computes it, the
    # others join on its cached blocks), in 96 positions (one request fits, three at once do not): they run out.
    assert _run([*argv, "--max-batched-tokens", "16", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["kv"] == {"block_size": 4, "kv_cache_tokens": 96, "kv_cache_mb": None, "prefix_caching": True}
    modes = result["modes"]
    assert modes["continuous"]["outputs_match_static"] is True
    for figures in modes.values():
        assert figures["memory"]["pool_blocks"] == 96 // 4
        assert figures["memory"]["peak_blocks"] <= 96 // 4
    assert modes["continuous"]["memory"]["preemptions"] > 0
    assert 0 < modes["continuous"]["memory"]["prefix_hits"] < modes["continuous"]["memory"]["prefix_queries"]
    assert modes["static"]["memory"]["peak_running"] < 3  # a wave of three would not fit
    printed = capsys.readouterr().out
    assert "KV memory" in printed and "preemptions" in printed


def test_no_prefix_caching_computes_every_prompt(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "off.json"
    argv = ["--workload", str(_json_workload(tmp_path)), "--modes", "continuous", "--model"]
    assert _run([*argv, str(tiny_model_dirs["llama"]), "--no-prefix-caching", "--json", str(out)]) == 0
    memory = json.loads(out.read_text())["modes"]["continuous"]["memory"]
    assert memory["prefix_hits"] == memory["prefix_queries"] == 0


def test_the_plot_is_a_png(bench_result: dict) -> None:
    assert bench_result["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_percentiles_match_hand_computed_values() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(values, 99) == pytest.approx(3.97)  # rank 3 * 0.99 = 2.97: 3 + 0.97 * (4 - 3)
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile([10.0, 20.0, 30.0, 40.0, 50.0], 90) == pytest.approx(46.0)  # rank 3.6: 40 + 0.6 * 10
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))


def test_ideal_speedup_and_efficiency_arithmetic() -> None:
    speedup, ideal, efficiency = speedup_figures(static_wall=10.0, static_steps=400, wall=4.0, steps=130)
    assert speedup == pytest.approx(2.5)
    assert ideal == pytest.approx(400 / 130)
    assert efficiency == pytest.approx(2.5 / (400 / 130))  # 0.8125
    assert math.isnan(speedup_figures(10.0, 400, 5.0, None)[1])


def test_step_times_split_prompt_steps_from_decode_steps_compared_over_history() -> None:
    record = RunRecord(mode="continuous", start=0.0)
    kv_lens = []
    for index in range(8):
        prefill = 5 if index == 0 else 0
        slots = ("a", "b") if index < 6 else ("a", None)
        record.add(StepEvent(index, index, index + (index + 1) / 1000, slots, prefill, 2 - slots.count(None)))
        kv_lens.append(10 + index)
    record.end = 8.0
    stats = step_time_stats(ModeRun(record, kv_lens))
    assert stats["in_steps_s"] == pytest.approx(0.036)  # 1 + 2 + ... + 8 ms
    assert stats["outside_steps_s"] == pytest.approx(8.0 - 0.036)
    assert (stats["prefill_steps"], stats["prefill_mean_ms"]) == (1, pytest.approx(1.0))
    assert stats["prefill_share"] == pytest.approx(1 / 36)
    assert stats["decode_steps"] == 7  # the prefill step is left out
    assert stats["first_quarter_ms"] == pytest.approx(2.0)  # one step of 7 // 4: the 2 ms step
    assert stats["last_quarter_ms"] == pytest.approx(8.0)
    assert stats["full_batch"]["rows"] == 2
    assert stats["full_batch"]["last_quarter_ms"] == pytest.approx(6.0)
    assert sum(bucket["steps"] for bucket in stats["by_kv_len"]) == 7


def test_a_csv_workload_with_arrival_times_runs(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    path = tmp_path / "timed.csv"
    path.write_text("prompt,max_new_tokens,arrival_s\nHello,3,0\nHi there,2,0.05\nParis,4,0.1\n")
    out = tmp_path / "timed.json"
    argv = ["--workload", str(path), "--model", str(tiny_model_dirs["qwen2"]), "--ignore-eos", "--json", str(out)]
    assert _run(argv) == 0
    result = json.loads(out.read_text())
    requests = result["modes"]["continuous"]["requests"]
    assert [len(r["output_ids"]) for r in requests] == [3, 2, 4]
    assert [r["arrival_s"] for r in requests] == pytest.approx([0.0, 0.05, 0.1])
    assert result["modes"]["continuous"]["outputs_match_static"] is True


def test_poisson_arrivals_are_the_same_for_the_same_seed(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    arrivals = []
    for name in ("a", "b"):
        out = tmp_path / f"{name}.json"
        argv = ["--workload", "random", "--random-requests", "4", "--random-max-new-tokens", "2:3", "--modes"]
        argv += ["continuous", "--rate", "50", "--seed", "5", "--model", str(tiny_model_dirs["gpt2"]), "--json"]
        assert _run([*argv, str(out), "--raw-prompts", "--ignore-eos"]) == 0
        requests = json.loads(out.read_text())["modes"]["continuous"]["requests"]
        arrivals.append([r["arrival_s"] for r in requests])
    assert arrivals[0] == pytest.approx(arrivals[1], abs=1e-6)  # arrival = scheduled time, to the clock's precision
    assert arrivals[0][0] == pytest.approx(0.0, abs=1e-6)
    assert arrivals[0][-1] > 0


def test_a_workload_of_raw_prompts_is_sent_untemplated_as_raw_prompts_sends_any(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    rows = [{"prompt": "Hello there", "max_new_tokens": 2}, {"prompt": "Track my parcel", "max_new_tokens": 2}]
    prompt_ids = []
    for name, raw, flags in (("raw", True, []), ("templated", False, ["--raw-prompts"])):
        path, out = tmp_path / f"{name}.json", tmp_path / f"{name}-out.json"
        path.write_text(json.dumps({"raw_prompts": raw, "requests": rows}))
        argv = ["--workload", str(path), "--modes", "continuous", "--model", str(tiny_model_dirs["llama"])]
        assert _run([*argv, *flags, "--ignore-eos", "--json", str(out)]) == 0
        prompt_ids.append([r["prompt_ids"] for r in json.loads(out.read_text())["modes"]["continuous"]["requests"]])
    assert prompt_ids[0] == prompt_ids[1]


def test_uncapped_requests_get_the_default_cap(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    path = tmp_path / "uncapped.json"
    path.write_text(json.dumps([{"prompt": "How do I track my order?"}, {"prompt": "Hello", "max_new_tokens": 2}]))
    out = tmp_path / "out.json"
    argv = ["--workload", str(path), "--modes", "continuous", "--model", str(tiny_model_dirs["llama"])]
    assert _run([*argv, "--ignore-eos", "--max-new-tokens", "5", "--json", str(out)]) == 0
    requests = json.loads(out.read_text())["modes"]["continuous"]["requests"]
    assert [r["max_new_tokens"] for r in requests] == [5, 2]


def test_the_hf_peer_runs_and_matches_static(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "hf.json"
    argv = ["--workload", str(_json_workload(tmp_path, batch_size=2)), "--modes", "static,hf", "--model"]
    assert _run([*argv, str(tiny_model_dirs["llama"]), "--ignore-eos", "--json", str(out)]) == 0
    hf = json.loads(out.read_text())["modes"]["hf"]
    assert set(hf) >= SUMMARY_KEYS
    assert [len(r["output_ids"]) for r in hf["requests"]] == CAPS
    assert all(r["ttft_s"] is not None and r["ttft_s"] <= r["e2e_s"] for r in hf["requests"])
    assert hf["steps"] > 0
    assert hf["outputs_match_static"] is True


def test_threads_is_the_most_a_contender_may_use_ours_runs_on_what_its_probe_chose(
    tiny_model_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--threads 2`: the peers get 2; ours the count its probe chose (fed here: one, two measured slower)."""
    seen: dict[str, list[int]] = {"ours": [], "hf": []}
    asked: list[tuple[int, bool]] = []

    def probe(model, tokenizer, most: int, compiled: bool) -> ThreadChoice:
        asked.append((most, compiled))
        return ThreadChoice(1, most, {1: 0.010, 2: 0.047})

    def run_batcher(*args, **kwargs):
        seen["ours"].append(torch.get_num_threads())
        return real_run_batcher(*args, **kwargs)

    def start_hf(*args, **kwargs):
        seen["hf"].append(torch.get_num_threads())
        return real_start_hf(*args, **kwargs)

    real_run_batcher, real_start_hf = race.run_batcher, contenders.start_hf
    monkeypatch.setattr(race, "pick_threads", probe)
    monkeypatch.setattr(race, "run_batcher", run_batcher)
    monkeypatch.setattr(contenders, "start_hf", start_hf)
    out = tmp_path / "threads.json"
    argv = ["--workload", str(_json_workload(tmp_path, batch_size=2)), "--modes", "continuous,hf", "--model"]
    argv += [str(tiny_model_dirs["llama"]), "--ignore-eos", "--json", str(out), "--device", "cpu", "--no-progress"]
    assert main(["race", *argv, "--threads", "2"]) == 0
    assert asked == [(2, False)]  # no compiled mode among ours
    assert seen["ours"] and set(seen["ours"]) == {1}
    assert seen["hf"] == [2]
    assert json.loads(out.read_text())["threads"]["ours"] == 1
    assert json.loads(out.read_text())["threads"]["most"] == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workload", "no-such-workload"], "no-such-workload"),
        (["--workload", "seed-lab", "--modes", "static,fast"], "--modes"),
        (["--workload", "seed-lab", "--repeat", "0"], "--repeat"),
        (["--workload", "seed-lab", "--batch-size", "two"], "--batch-size"),
        (["--workload", "seed-lab", "--rate", "-1"], "rate"),
        (["--workload", "random", "--random-max-new-tokens", "9:3"], "length range"),
        (["--workload", "seed-lab", "--json", "/no/such/folder/out.json"], "does not exist"),
        (["--modes", "static"], "--workload"),
        (["--workload", "seed-lab", "--model", "/no/such/model"], "config.json"),
        (["--workload", "seed-lab", "--model", "TINY", "--max-batched-tokens", "8"], "max_batched_tokens=8"),
        (["--workload", "seed-lab", "--kv-cache-tokens", "0"], "--kv-cache-tokens=0"),
        (["--workload", "seed-lab", "--model", "TINY", "--block-size", "3"], "block_size=3"),
        (["--workload", "seed-lab", "--model", "TINY", "--kv-cache-tokens", "64", "--kv-cache-mb", "1"], "both set"),
        (["--workload", "seed-lab", "--model", "TINY", "--kv-cache-mb", "0.00001"], "kv_cache_mb=1e-05"),
        (["--workload", "seed-lab", "--model", "TINY", "--kv-cache-tokens", "16"], "request 0"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture, tiny_model_dirs: dict[str, Path]
) -> None:
    assert _run([str(tiny_model_dirs["llama"]) if arg == "TINY" else arg for arg in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith("bench race: error:")
    assert message in err


def test_a_malformed_workload_file_is_one_line_and_exit_code_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"requests": [{"prompt": "hi", "max_new_tokens": "lots"}]}')
    assert _run(["--workload", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "max_new_tokens='lots'" in err[0]


def test_a_prompt_too_long_for_the_model_is_reported_before_running(
    tiny_model_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "long.json"
    path.write_text(json.dumps([{"prompt": "word " * 2000, "max_new_tokens": 3}]))
    assert _run(["--workload", str(path), "--model", str(tiny_model_dirs["llama"])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "request 0" in err[0]


def test_the_chart_has_one_row_per_mode_under_the_workload_title() -> None:
    runs = {}
    for mode in ("static", "continuous"):
        run = RunRecord(mode=mode, start=0.0, end=0.2)
        run.add(StepEvent(0, 0.0, 0.1, ("q0", None), 3, 0))
        run.add(FinishedEvent("q0", FinishReason.LENGTH, (7,), "", 3, 0.0, 0.0, 0.05, 0.1, 0))
        runs[mode] = run
    spec = bench_chart(runs, slots=2, title="Batchscope benchmark: tiny").to_dict()
    assert spec["title"] == "Batchscope benchmark: tiny"
    assert len(spec["vconcat"]) == 2


def test_a_run_in_which_requests_fail_exits_1_and_prints_the_first_error(
    tiny_model_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = tiny_model_dirs["llama"]
    broken = AutoModelForCausalLM.from_pretrained(source)
    with torch.no_grad():
        broken.lm_head.weight[5] = float("nan")  # every logits row holds a NaN: every request ends with an error
    broken.save_pretrained(tmp_path / "nan")
    AutoTokenizer.from_pretrained(source).save_pretrained(tmp_path / "nan")
    argv = ["--workload", str(_json_workload(tmp_path)), "--modes", "continuous", "--model", str(tmp_path / "nan")]
    assert _run(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("bench race: error: continuous run 1: request q0 failed: FloatingPointError")
    assert "NaN" in err[-1]


def test_a_model_the_engine_cannot_run_exactly_is_refused_with_exit_code_2(
    family_model_dirs: dict[str, Path], capsys: pytest.CaptureFixture
) -> None:
    assert _run(["--workload", "seed-lab", "--model", str(family_model_dirs["falcon_alibi"])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("bench race: error: model type falcon is not supported: its ALiBi position biases")


@pytest.mark.long
def test_the_compiled_mode_and_the_floor_are_reported_with_compile_time_apart(
    tiny_model_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "out.json"
    argv = ["--workload", str(_json_workload(tmp_path)), "--modes", "continuous,compiled", "--model"]
    argv += [str(tiny_model_dirs["llama"]), "--ignore-eos", "--floor", "--json", str(out)]
    assert _run(argv) == 0
    result = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert result["compile_s"] > 0 and f"took {result['compile_s']:.1f} s, outside the run times" in printed
    continuous, compiled = result["modes"]["continuous"], result["modes"]["compiled"]
    assert [r["output_ids"] for r in compiled["requests"]] == [r["output_ids"] for r in continuous["requests"]]
    assert compiled["output_tokens"] == sum(CAPS)
    floor = result["floor"]
    assert floor["rows"] == 8 and floor["floor_ms"] > 0
    assert floor["eager_over_floor"] == pytest.approx(floor["eager_ms"] / floor["floor_ms"])
    assert floor["compiled_over_floor"] == pytest.approx(floor["compiled_ms"] / floor["floor_ms"])
    assert floor["stream_ms"] > 0 and floor["compiled_over_stream"] == pytest.approx(
        floor["compiled_ms"] / floor["stream_ms"]
    )
    assert any(line.startswith("floor: a 8-row decode step over 100 cached tokens") for line in printed.splitlines())


def test_the_floor_reads_every_linear_weight_once(tiny_model_dirs: dict[str, Path]) -> None:
    model = loaded(str(tiny_model_dirs["llama"])).model
    step = floor_step(model, rows=8)
    outputs = step()
    linear = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert sum(out.shape[1] for out in outputs) == sum(m.out_features for m in linear)
    assert all(out.shape[0] == 8 for out in outputs)
    assert len(outputs) == len({m.in_features for m in linear})  # one raw matmul per input width


def test_the_hf_peer_held_between_runs_stops_its_thread_and_answers_the_same_after(
    tiny_model_dirs: dict[str, Path],
) -> None:
    """Its generation thread, alive in our process, slowed our two-thread steps 3.7x: it is stopped while other
    contenders run and started again for its own runs, with the same answers."""
    from batching.arrivals import Schedule
    from batching.bench.peers.hf_peer import HFPeer
    from config.settings import ModelSettings
    from model.loader import load_model

    # Its own model, as the race gives it (`contenders.start_hf`): the engine's tests switch a shared one's attention.
    model = load_model(ModelSettings(name_or_path=str(tiny_model_dirs["llama"]), device="cpu", dtype="float32"))
    prompts = [model.tokenizer(text)["input_ids"] for text in ("Where is my order?", "Hello there")]
    caps = [5, 7]
    peer = HFPeer(model.model, model.tokenizer, batch_size=2, max_batched_tokens=64, max_len=32)

    def answers() -> list[list[int]]:
        record, _ = peer.run(prompts, caps, Schedule.at_once(2), ignore_eos=True)
        return [event.output_ids for event in sorted(record.finished, key=lambda event: event.request_id)]

    with peer:
        before = answers()
        peer.hold(paused=True)
        assert not peer.manager.is_running()
        peer.hold(paused=False)
        assert peer.manager.is_running()
        assert answers() == before
    assert [len(ids) for ids in before] == caps
