"""The serving benchmark's own logic: guidellm's reports read right, equal load for both servers, one-line errors.

The reports under tests/bench/peers/data are real guidellm 0.8.1 output (see its README.md); the figures expected here
are the ones guidellm itself printed for them (`guidellm export FILE --output kind=console`), so the parser is
checked against the tool, not against itself. The slow tests start the real servers: no load generator needed.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import pytest

from batching.bench.cli import main
from batching.bench.options import BadInput
from batching.bench.peers import serve_peer
from batching.bench.peers.serve_peer import Load, format_table, parse_report, scenario, server_specs
from tests.bench.vllm_helpers import RunningVllm

DATA = Path(__file__).parent / "data"
MODEL = "model/builtin"
LOAD = Load(
    rates=(2.0, 4.0),
    requests=10,
    prompt_tokens=48,
    prompt_tokens_min=16,
    prompt_tokens_max=96,
    output_tokens=32,
    throughput=True,
)


def _report(name: str) -> dict:
    with gzip.open(DATA / f"guidellm-0.8.1-{name}.json.gz", "rt") as handle:
        return json.load(handle)


def test_a_poisson_report_gives_one_row_per_rate_with_the_figures_guidellm_printed() -> None:
    rows = parse_report(_report("transformers-1-poisson"), "transformers", round_index=1)
    assert [(row.profile, row.rate) for row in rows] == [("poisson", 4.0), ("poisson", 8.0)]
    assert all(row.server == "transformers" and row.round == 1 for row in rows)
    assert [(row.requests, row.errors, row.incomplete, row.output_tokens) for row in rows] == [(6, 0, 0, 192)] * 2
    # guidellm's console: TTFT Mdn 36.8 / 32.4 ms (p95 = max of 6: 69.1 / 57.6), ITL Mdn 13.1 / 17.5 ms,
    # output tokens per s 160.1 / 252.5, requests per s 5.0 / 7.9
    assert [round(row.ttft_p50_ms, 1) for row in rows] == [36.8, 32.4]
    assert [round(row.ttft_p99_ms, 1) for row in rows] == [69.1, 57.6]
    assert [round(row.itl_p50_ms, 1) for row in rows] == [13.1, 17.5]
    assert [round(row.output_tokens_per_s, 1) for row in rows] == [160.1, 252.5]
    assert [round(row.requests_per_s, 1) for row in rows] == [5.0, 7.9]
    assert all(row.itl_p99_ms >= row.itl_p50_ms for row in rows)


def test_a_throughput_report_is_labelled_all_at_once_in_the_table() -> None:
    rows = parse_report(_report("batchscope-1-throughput"), "batchscope")
    assert [
        (row.profile, row.requests, round(row.ttft_p50_ms, 1), round(row.output_tokens_per_s, 1)) for row in rows
    ] == [("throughput", 6, 111.1, 329.9)]
    lines = format_table(rows + parse_report(_report("transformers-1-poisson"), "transformers")).splitlines()
    assert len(lines) == 2 + 3  # header, rule, one line per row
    assert "all at once" in lines[2] and "poisson 4/s" in lines[3] and "poisson 8/s" in lines[4]
    assert lines[2].split()[0] == "batchscope" and "111.1 / 122.7" in lines[2]


def test_a_report_of_another_layout_is_refused_naming_its_version() -> None:
    report = _report("batchscope-1-throughput")
    report["metadata"]["version"] = 3
    with pytest.raises(BadInput, match="version 3"):
        parse_report(report, "batchscope")


def test_both_servers_get_the_same_load_and_only_their_own_ignore_eos_field(tmp_path: Path) -> None:
    specs = server_specs(MODEL, 8, 512, LOAD, tmp_path)
    profile = {"kind": "poisson", "rate": [2.0, 4.0]}
    ours = scenario("http://a", MODEL, tmp_path, specs["batchscope"], LOAD, profile)["spec"]
    theirs = scenario("http://a", MODEL, tmp_path, specs["transformers"], LOAD, profile)["spec"]
    ours_body, theirs_body = ours["backend"]["extras"].pop("body"), theirs["backend"]["extras"].pop("body")
    assert ours == theirs
    assert ours_body == {"temperature": 0, "ignore_eos": True}
    assert theirs_body["temperature"] == 0 and "ignore_eos" not in theirs_body
    assert json.loads(theirs_body["generation_config"])["eos_token_id"] == -1
    assert ours["backend"]["max_tokens"] == 32 and ours["constraints"] == [{"kind": "max_requests", "count": 10}]


def test_both_servers_get_the_same_slots_token_budget_and_one_thread(tmp_path: Path) -> None:
    specs = server_specs(MODEL, 4, 256, LOAD, tmp_path)
    ours, theirs = specs["batchscope"], specs["transformers"]
    assert ours.env["BATCHSCOPE_BATCHING__MAX_BATCH_SIZE"] == "4"
    assert ours.env["BATCHSCOPE_BATCHING__MAX_BATCHED_TOKENS"] == "256"
    command = list(theirs.command)
    assert command[command.index("--cb-max-batch-tokens") + 1] == "256"
    assert command[command.index("--cb-num-blocks") + 1] == "4"  # one 256-token page per request of <= 128 tokens
    longer = replace(LOAD, prompt_tokens_max=300)
    assert serve_peer.transformers_blocks(4, longer) == 8
    assert all(spec.env["OMP_NUM_THREADS"] == "1" and spec.env["HF_HUB_OFFLINE"] == "1" for spec in specs.values())
    assert command[-1] == MODEL and MODEL in ours.command


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--rates", "0"], "'0'"),
        (["--rates", "two"], "'two'"),
        (["--requests", "0"], "--requests 0"),
        (["--servers", "sglang"], "'sglang'"),
        (["--model", "nowhere"], "'nowhere'"),
        (["--guidellm", "/nonexistent/guidellm"], "/nonexistent/guidellm"),
        (["--no-such-flag"], "--no-such-flag"),
    ],
)
def test_bad_arguments_are_one_line_naming_the_value_and_exit_2(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve-peer", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("bench serve-peer: error: ") and captured.err.count("\n") == 1
    assert named in captured.err


def _completion_tokens(url: str, spec: serve_peer.ServerSpec, ignore_eos: bool) -> int:
    body = {"model": MODEL, "prompt": "Q: How do I reset my password?\nA:", "max_tokens": 64, "temperature": 0}
    return int(
        serve_peer._post_json(f"{url}/v1/completions", {**body, **(spec.ignore_eos_body if ignore_eos else {})}, 60)[
            "usage"
        ]["completion_tokens"]
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", ["batchscope", "transformers"])  # vLLM: the session's server, below
def test_each_real_server_starts_answers_to_full_length_with_its_ignore_eos_field_and_stops(
    name: str, tmp_path: Path
) -> None:
    spec = server_specs(MODEL, 2, 256, LOAD, tmp_path)[name]
    with serve_peer.running_server(spec, MODEL, tmp_path) as url:
        assert _completion_tokens(url, spec, ignore_eos=False) < 64  # the model ends this answer at EOS
        assert _completion_tokens(url, spec, ignore_eos=True) == 64
    with pytest.raises(OSError):
        serve_peer._post_json(f"{url}/v1/completions", {"model": MODEL, "prompt": "Q: hi\nA:"}, 5)


def test_vllm_started_as_the_serving_benchmark_starts_it_answers_to_full_length_with_ignore_eos(
    vllm: RunningVllm, tmp_path: Path
) -> None:
    spec = server_specs(vllm.model, vllm.slots, 512, LOAD, tmp_path, Path("python"))["vllm"]
    assert _completion_tokens(vllm.url, spec, ignore_eos=False) < 64  # the model ends this answer at EOS
    assert _completion_tokens(vllm.url, spec, ignore_eos=True) == 64


def test_vllm_gets_the_same_load_slots_token_budget_and_one_thread(tmp_path: Path) -> None:
    specs = server_specs(MODEL, 4, 256, LOAD, tmp_path, Path("/venv/bin/python"))
    vllm = specs["vllm"]
    command = list(vllm.command)
    assert command[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    flags = dict(zip(command[3::2], command[4::2], strict=False))
    assert flags["--model"] == MODEL and flags["--served-model-name"] == MODEL  # the name guidellm sends
    assert flags["--max-num-seqs"] == "4" and flags["--max-num-batched-tokens"] == "256"
    assert flags["--max-model-len"] == "256"  # one 256-token page per request of <= 128 tokens, as transformers
    assert "--no-enable-prefix-caching" in command  # repeated rounds must not skip their prefill
    assert vllm.env["OMP_NUM_THREADS"] == "1" and vllm.env["HF_HUB_OFFLINE"] == "1"
    assert vllm.startup_timeout_s > serve_peer.STARTUP_TIMEOUT_S  # about a minute, more on a busy machine
    profile = {"kind": "throughput", "max_concurrency": 10}
    ours = scenario("http://a", MODEL, tmp_path, specs["batchscope"], LOAD, profile)
    assert scenario("http://a", MODEL, tmp_path, vllm, LOAD, profile) == ours  # ignore_eos: the same field as ours


def test_without_vllm_the_serving_benchmark_says_not_installed_and_runs_the_other_servers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("BATCHSCOPE_PEERS__VLLM_PYTHON", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no environment at the default place
    assert main(["serve-peer", "--servers", "batchscope,vllm", "--guidellm", "/nonexistent/guidellm"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "vllm: not installed (bash scripts/install-vllm.sh)"
    assert "/nonexistent/guidellm" in err[1]  # it went on with the other server, as far as the load generator
    assert main(["serve-peer", "--servers", "vllm"]) == 2
    assert "no server left to run without vLLM" in capsys.readouterr().err


def test_a_guidellm_found_on_a_relative_path_is_named_by_its_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # guidellm runs in a folder of its own, where `PATH=.venv/bin:$PATH`'s relative entry finds nothing
    script = tmp_path / "venv" / "bin" / "guidellm"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\necho 'guidellm version 0.8.1'\n")
    script.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "venv/bin")
    assert serve_peer.guidellm_binary(None) == (str(script), "0.8.1")


def test_repeated_rounds_give_per_load_medians_with_counts_summed_ordered_by_load_then_server() -> None:
    theirs = parse_report(_report("transformers-1-poisson"), "transformers")
    ours = [replace(row, server="batchscope") for row in theirs]
    rounds = [
        [replace(row, round=index, ttft_p50_ms=row.ttft_p50_ms * factor, load_avg=float(index)) for row in rows]
        for index, factor in enumerate((1.0, 0.5, 3.0))
        for rows in (ours, theirs)
    ]
    medians = serve_peer.median_rows([row for rows in rounds for row in rows])
    assert [(row.server, row.rate) for row in medians] == [
        ("batchscope", 4.0),
        ("transformers", 4.0),
        ("batchscope", 8.0),
        ("transformers", 8.0),
    ]
    assert [row.ttft_p50_ms for row in medians] == [theirs[0].ttft_p50_ms] * 2 + [theirs[1].ttft_p50_ms] * 2
    assert all(row.requests == 18 and row.output_tokens == 3 * 192 and row.load_avg == 1.0 for row in medians)
    assert all(row.round == -1 for row in medians) and "median" in format_table(medians).splitlines()[2]
