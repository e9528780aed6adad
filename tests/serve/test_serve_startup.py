"""`python -m batching.serve` starting as a server: the graphs of its compiled steps made before the port opens, each
said in the log, and no step it serves eager; `--no-compile` starting at once, every step eager; and its KV pool
sized for serving and said in the log, not the page's demo pool; a warning when it listens beyond this machine without a
key."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from batching.allocator import find_tcmalloc
from batching.bench.steady import steps_by_path
from batching.serve.server import exposure_warning
from tests.helpers import children_of
from tests.serve.helpers import our_server


def _complete(url: str, prompt: str, max_tokens: int) -> dict:
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}).encode()
    request = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        return json.loads(answer.read())


def _log(tmp_path: Path) -> list[str]:
    (path,) = tmp_path.glob("serve-*.log")
    return path.read_text().splitlines()


def _index(lines: list[str], text: str) -> int:
    return next(number for number, line in enumerate(lines) if text in line)


@pytest.mark.long
def test_a_server_makes_its_graphs_before_it_listens_and_runs_no_step_it_serves_eager(
    tiny_model_dirs: dict, tmp_path: Path
) -> None:
    env = {
        "BATCHSCOPE_MODEL__NAME_OR_PATH": str(tiny_model_dirs["llama"]),
        "BATCHSCOPE_ENGINE__COMPILE_STEPS": "true",
        "BATCHSCOPE_ENGINE__COMPILE_AUTOTUNE": "false",  # the same graphs, made in half the time
        "BATCHSCOPE_ENGINE__COMPILE_CACHE_DIR": str(tmp_path / "compiled"),
        "BATCHSCOPE_BATCHING__MAX_BATCH_SIZE": "4",
    }
    with our_server(tmp_path, env, args=("--log-level", "info"), start_s=900) as (url, _):
        for prompt in ("Hello there", "How are you", "Where is my parcel"):
            assert _complete(url, prompt, 8)["usage"]["completion_tokens"] == 8
        steps = steps_by_path(url)
    lines = _log(tmp_path)
    made = [_index(lines, f"compiled  [{bar}] {n}/3: ") for n, bar in ((1, "#.."), (2, "##."), (3, "###"))]
    assert "the paged-decode operator" in lines[made[0]]
    assert "the graph of decode steps of 4 rows in " in lines[made[1]]
    assert "the graph of prompt steps of 4 rows in " in lines[made[2]]
    assert made == sorted(made) and made[-1] < _index(lines, "serving ")  # all made, then the port opened
    assert "requests of the whole" in lines[_index(lines, "KV cache: ")]
    # Every step of the three requests called a graph directly: each graph's direct call was made and checked
    # with the graph, before the port opened.
    assert steps["eager"] == steps["compiled"] == 0 and steps["direct"] > 0


def test_no_compile_starts_at_once_eager_and_a_kv_budget_given_is_the_pool(
    tiny_model_dirs: dict, tmp_path: Path
) -> None:
    env = {"BATCHSCOPE_MODEL__NAME_OR_PATH": str(tiny_model_dirs["llama"]), "BATCHSCOPE_ENGINE__COMPILE_STEPS": "true"}
    args = ("--log-level", "info", "--no-compile", "--kv-cache-mb", "2")
    with our_server(tmp_path, env, args=args) as (url, process):
        _complete(url, "Hello there", 4)
        steps = steps_by_path(url)
        # Started again under TCMalloc (the same process id: replaced in place), its engine process forked with it.
        mapped = [Path(f"/proc/{pid}/maps").read_text() for pid in (process.pid, *children_of(process.pid))]
    lines = _log(tmp_path)
    assert not any("compiling [" in line for line in lines)
    assert _index(lines, "compiled steps are off") < _index(lines, "serving ")
    assert "KV cache: 2.0 MiB (as set)" in lines[_index(lines, "KV cache: ")]
    assert steps["eager"] >= 4 and steps["compiled"] == steps["direct"] == 0
    if find_tcmalloc() is None:
        pytest.skip("TCMalloc is not installed (apt-get install libtcmalloc-minimal4): the rest checks it is used")
    assert len(mapped) == 2 and all("libtcmalloc" in maps for maps in mapped), len(mapped)
    assert "malloc: TCMalloc (" in lines[_index(lines, "malloc: ")]


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_listening_on_this_machine_alone_needs_no_key(host: str) -> None:
    assert exposure_warning(host, None) is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "gpu-box"])
def test_listening_beyond_this_machine_without_a_key_is_warned_of_and_with_one_is_not(host: str) -> None:
    warning = exposure_warning(host, None)
    assert warning is not None and f"listens on {host}, beyond this machine, without an API key" in warning
    assert "--api-key" in warning and exposure_warning(host, "sesame") is None
