"""The vLLM peer: vLLM's real server (scripts/install-vllm.sh) driven with the benchmark's requests, its answers held
to our engine's token for token, and the benchmark's vllm mode end to end.

Every test shares the session's one server (tests/conftest.py): the race reaches it as a running server
(`--vllm-url`), which it leaves running. How the race starts a server of its own and stops it whatever happens is
checked here on one that fails to start (the race's own start, a Python without vLLM), and on a real server process
in tests/bench/peers/test_local_server.py. Without vLLM they skip, which CI (CI=true) counts as a failure.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

import psutil
import pytest

from batching.arrivals import Schedule
from batching.bench.cli import main
from batching.bench.peers.vllm_peer import VllmPeer
from batching.engine.request import FinishReason
from model.prompting import format_prompt
from tests.bench.vllm_helpers import MODEL, RunningVllm, our_answers
from tests.engine.helpers import loaded
from tests.helpers import free_port
from tests.remote.test_remote import QUESTIONS as REMOTE_QUESTIONS

QUESTIONS = REMOTE_QUESTIONS[:6]  # the remote tests' questions, the first six
CAPS = [9, 60, 14, 40, 7, 24]  # 60 and 40 run past the embedded model's EOS: ignore_eos keeps them going


def _prompt_ids() -> list[list[int]]:
    tokenizer = loaded(MODEL).tokenizer
    return [tokenizer(format_prompt(question))["input_ids"] for question in QUESTIONS]


def _peer(vllm: RunningVllm) -> VllmPeer:
    return VllmPeer(vllm.url, vllm.model, vllm.slots)


def test_every_request_gets_exactly_its_cap_of_the_same_greedy_tokens_as_our_engine(vllm: RunningVllm) -> None:
    prompts = _prompt_ids()
    record, kv_lens = _peer(vllm).run(prompts, CAPS, Schedule.at_once(len(prompts)), ignore_eos=True)
    assert kv_lens == [] and record.steps == []  # the server does not report its batches
    assert [event.request_id for event in record.finished] == [f"q{index}" for index in range(len(prompts))]
    assert all(event.reason is FinishReason.LENGTH and event.error is None for event in record.finished)
    assert [event.output_tokens for event in record.finished] == CAPS
    ours = our_answers(prompts, CAPS, ignore_eos=True)
    assert [event.output_ids for event in record.finished] == [event.output_ids for event in ours]
    assert [event.text for event in record.finished] == [event.text for event in ours]
    for event in record.finished:
        assert event.arrival <= event.first_token <= event.finished <= record.end  # type: ignore[operator]
        assert event.admitted is None and event.slot is None  # not visible from outside
    assert record.wall_s > 0


def test_without_ignore_eos_an_answer_ends_at_the_models_eos_as_ours_does(vllm: RunningVllm) -> None:
    prompts = _prompt_ids()[:2]
    record, _ = _peer(vllm).run(prompts, [60, 60], Schedule.at_once(2), ignore_eos=False)
    ours = our_answers(prompts, [60, 60], ignore_eos=False)
    assert [event.reason for event in record.finished] == [event.reason for event in ours]
    assert FinishReason.EOS in {event.reason for event in record.finished}
    assert [event.output_ids for event in record.finished] == [event.output_ids for event in ours]


def test_a_request_due_at_a_later_step_is_sent_after_the_server_has_taken_that_many_steps(vllm: RunningVllm) -> None:
    peer = _peer(vllm)
    prompts = _prompt_ids()[:3]
    before = peer.engine_steps()
    readings: list[tuple[float, int]] = []  # (when, steps) for each read of the server's step counter
    read_steps = peer.engine_steps

    def watched_steps() -> int:
        steps = read_steps()
        readings.append((peer.clock(), steps - before))
        return steps

    peer.engine_steps = watched_steps  # type: ignore[method-assign]
    record, _ = peer.run(prompts, [30, 30, 4], Schedule.per_step([0, 0, 20]), ignore_eos=True)
    assert read_steps() - before >= 30
    _, _, late = record.finished
    # Sent only after the counter was seen at 20 steps or more, and never before: events in order, not speed.
    seen = [steps for when, steps in readings if when <= late.arrival]
    assert max(seen) >= 20
    assert late.output_tokens == 4


def _workload(folder: Path) -> Path:
    path = folder / "small.json"
    rows = [{"prompt": question, "max_new_tokens": cap} for question, cap in zip(QUESTIONS, CAPS, strict=True)]
    path.write_text(json.dumps({"name": "small", "batch_size": 3, "requests": rows}))
    return path


def _bench(argv: list[str]) -> int:
    return main(["race", *argv, "--device", "cpu", "--dtype", "float32", "--threads", "1", "--no-progress"])


def test_the_race_reports_a_vllm_row_like_the_other_modes_and_leaves_a_running_server_running(
    vllm: RunningVllm, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "out.json"
    before = set(psutil.Process().children(recursive=True))  # the session's vLLM server among them
    argv = ["--workload", str(_workload(tmp_path)), "--modes", "static,vllm", "--ignore-eos", "--repeat", "2"]
    assert _bench([*argv, "--model", MODEL, "--vllm-url", vllm.url, "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert any(line.split()[0] == "vllm" for line in table.splitlines() if line.strip())
    figures = json.loads(out.read_text())["modes"]["vllm"]
    assert figures["output_tokens"] == sum(CAPS) and figures["requests_finished"] == len(CAPS)
    assert [request["output_tokens"] for request in figures["requests"]] == CAPS
    assert all(request["finish_reason"] == "length" for request in figures["requests"])
    assert figures["outputs_match_static"] is True  # token for token, EOS and what follows it included
    assert figures["tokens_per_s"] > 0 and figures["speedup_vs_static"] > 0 and len(figures["wall_s_runs"]) == 2
    assert figures["policy"] == "fcfs" and figures["steps"] is None
    assert figures["cpu_s"] is None  # a server the race did not start: its processes' CPU time is not known
    assert figures["ttft_s"]["p50"] <= figures["ttft_s"]["p99"] and figures["tpot_s"]["p50"] > 0
    assert set(psutil.Process().children(recursive=True)) == before  # nothing started, nothing stopped
    with urllib.request.urlopen(f"{vllm.url}/health", timeout=10) as answer:
        assert answer.status == 200


def test_a_vllm_url_with_nothing_listening_is_one_line_and_exit_code_2(
    tiny_model_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    argv = ["--workload", str(_workload(tmp_path)), "--modes", "continuous,vllm", "--vllm-url", url]
    assert _bench([*argv, "--model", str(tiny_model_dirs["llama"])]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bench race: error: --vllm-url: cannot connect to {url}") and err.count("\n") == 1


def test_without_vllm_the_benchmark_says_not_installed_and_runs_the_other_modes(
    tiny_model_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.delenv("BATCHSCOPE_PEERS__VLLM_PYTHON", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no environment at the default place
    out = tmp_path / "out.json"
    argv = ["--workload", str(_workload(tmp_path)), "--modes", "continuous,vllm", "--json", str(out)]
    assert _bench([*argv, "--model", str(tiny_model_dirs["llama"])]) == 0
    assert "vllm: not installed (bash scripts/install-vllm.sh)" in capsys.readouterr().err
    assert set(json.loads(out.read_text())["modes"]) == {"continuous"}
    assert _bench(["--workload", str(_workload(tmp_path)), "--modes", "vllm"]) == 2
    assert "no mode left to run without vLLM" in capsys.readouterr().err


def test_a_vllm_python_that_does_not_exist_is_one_line_and_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    argv = ["--workload", str(_workload(tmp_path)), "--modes", "continuous,vllm"]
    assert _bench([*argv, "--vllm-python", "/nonexistent/python"]) == 2
    err = capsys.readouterr().err
    expected = "vLLM Python /nonexistent/python: no such executable (bash scripts/install-vllm.sh makes one)"
    assert err == f"bench race: error: {expected}\n"


def test_a_server_that_will_not_start_is_one_line_with_its_log_and_exit_code_2(
    tiny_model_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # our own environment has no vLLM: its server module is not there, so the process exits at once
    argv = ["--workload", str(_workload(tmp_path)), "--modes", "continuous,vllm", "--vllm-python", sys.executable]
    assert _bench([*argv, "--model", str(tiny_model_dirs["llama"])]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("bench race: error: vLLM's server exited with code 1 before /health:") and err.count("\n") == 1
    )
    assert "No module named 'vllm'" in err
