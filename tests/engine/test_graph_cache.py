"""The disk cache of compiled graphs: a second start reads its graphs instead of compiling them, and loads them
without AOT autograd or freezing running again (`torch_door.frozen_graphs`; counted, not timed), a graph made for other
weights, another dtype or other engine code is a miss, and a cache that cannot be trusted (files garbled, a kept
entry naming a graph that is gone, a graph that disagrees with eager, one that fails after its direct call was made)
is cleared or compiled afresh, never answered from."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaForCausalLM

import batching.engine.graph_cache as graph_cache
from batching.engine.compiled import StepCompiler
from batching.engine.graph_cache import graph_cache_key
from batching.engine.step_call import DIRECT_CHECKS
from batching.engine.step_forward import run_model
from tests.engine.helpers import door_open, loaded
from tests.helpers import ROOT
from tests.tiny_models import TINY_CONFIGS

door_only = pytest.mark.skipif(not door_open(), reason="the door to torch's internals is closed: no frozen graphs kept")

# One start of a process: the decode graph of a 2-slot runner made through the cache in `cache`, then a decode step
# compiled and eager; prints the graphs read from the cache and compiled, those kept without tracing AOT autograd and
# freezing again and loaded so (`frozen_graphs`), and both steps' logits.
_START = """
import json, sys, torch
sys.path.insert(0, {root!r})
torch.set_num_threads({threads})
from batching.engine.compiled import use_compile_cache
use_compile_cache(__import__("pathlib").Path({cache!r}))
from batching.engine.torch_door.inductor_cache import cache_hits, cache_misses
from batching.engine.torch_door.frozen_graphs import stats
from batching.engine.runner import ModelRunner
from tests.engine.helpers import loaded
model = loaded({folder!r}).model

def last_logits(compiled):
    runner = ModelRunner(model, capacity=2, max_len=64, pad_token_id=0, compile_steps=compiled, compile_autotune=False)
    if compiled:
        assert runner.compiler.compile_now() is not None
    for row in range(2):
        runner.claim(f"r{{row}}")
    runner.forward([[1, 2, 3], [4, 5]])
    return runner.forward([[7], [8]]).tolist()

compiled = last_logits(True)
print(json.dumps({{"hits": cache_hits(), "misses": cache_misses(), "kept": stats["kept"], "loaded": stats["loaded"],
                  "compiled": compiled, "eager": last_logits(False)}}))
"""


# Every start's compiler runs in its own process (inductor's pool of compile workers is left out): the starts run side
# by side, and each makes its graph as the others do (the kept entries' key holds inductor's whole configuration).
START_ENV = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}


def launch(folder: Path, cache: Path, threads: int = 1) -> subprocess.Popen[str]:
    """A fresh process on `threads` torch threads making the graph through `cache` (see `_START`), started."""
    script = _START.format(root=str(ROOT), cache=str(cache), folder=str(folder), threads=threads)
    env = {**os.environ, **START_ENV}
    return subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def result_of(process: subprocess.Popen[str]) -> dict[str, Any]:
    """A launched start's counts and logits, once it ends."""
    stdout, stderr = process.communicate(timeout=900)
    assert process.returncode == 0, stderr[-3000:]
    result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    result["log"] = stderr
    return result


def start(folder: Path, cache: Path, threads: int = 1) -> dict[str, Any]:
    """A fresh process making the graph through `cache`, run to its end: its counts and logits."""
    return result_of(launch(folder, cache, threads))


def answers_as_eager(result: dict[str, Any]) -> None:
    torch.testing.assert_close(torch.tensor(result["compiled"]), torch.tensor(result["eager"]), atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def other_weights(tiny_model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama's folder with other weights (same config and shapes)."""
    folder = tmp_path_factory.mktemp("other-weights") / "llama"
    shutil.copytree(tiny_model_dirs["llama"], folder)
    torch.manual_seed(1)
    LlamaForCausalLM(TINY_CONFIGS["llama"]).save_pretrained(folder)
    return folder


@dataclass
class Starts:
    """The first start on an empty cache (the one cold compile the tests share) and the starts made from copies of
    its cache, side by side: what each printed, and the folder each ran on."""

    first: dict[str, Any]
    results: dict[str, dict[str, Any]]
    caches: dict[str, Path]


def _emptied_of_inductors_entries(cache: Path) -> None:
    """Inductor's cache emptied, what `frozen_graphs` kept left behind (naming compiled graphs that are gone)."""
    from batching.engine.torch_door.frozen_graphs import FOLDER

    for entry in cache.iterdir():
        if entry.name != FOLDER:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


def _garbled(cache: Path) -> int:
    """Built wrappers and kernels, graphs' sources, inductor's entries and what `frozen_graphs` kept, overwritten;
    how many files."""
    garbled = 0
    for path in cache.rglob("*"):
        if path.is_file() and path.suffix in (".so", ".py", "", ".pt"):
            path.write_bytes(b"\0garbled" * 8)
            garbled += 1
    return garbled


@pytest.fixture(scope="module")
def starts(tiny_model_dirs: dict[str, Path], other_weights: Path, tmp_path_factory: pytest.TempPathFactory) -> Starts:
    """A first start on an empty cache, then, each on its own copy of that cache and all at once: a second start, one
    on two threads, one after inductor's entries were emptied, one of a model with other weights, and one after
    every file was garbled, followed (once it ends, beside the others) by another on what it rebuilt."""
    llama = tiny_model_dirs["llama"]
    root = tmp_path_factory.mktemp("graph-cache")
    first_cache = root / "first"
    first = start(llama, first_cache)
    caches = {name: root / name for name in ("second", "two_threads", "emptied", "other_weights", "garbled")}
    for cache in caches.values():
        shutil.copytree(first_cache, cache)
    _emptied_of_inductors_entries(caches["emptied"])
    assert _garbled(caches["garbled"])
    launched = {
        name: launch(other_weights if name == "other_weights" else llama, cache, 2 if name == "two_threads" else 1)
        for name, cache in caches.items()
    }
    results = {"garbled": result_of(launched.pop("garbled"))}
    launched["garbled_again"] = launch(llama, caches["garbled"])
    results |= {name: result_of(process) for name, process in launched.items()}
    return Starts(first, results, caches)


@door_only
@pytest.mark.long
def test_a_second_start_reads_its_graph_from_the_disk_cache_and_a_model_with_other_weights_compiles_its_own(
    starts: Starts,
) -> None:
    first, results = starts.first, starts.results
    assert first["hits"] == 0 and first["misses"] >= 1
    assert first["kept"] == 1 and first["loaded"] == 0, first["log"][-3000:]
    second = results["second"]
    assert second["hits"] >= 1 and second["misses"] == 0, second["log"][-3000:]
    # Dynamo traced the step; AOT autograd and freezing did not run: the graph was loaded from what the first kept.
    assert second["loaded"] == 1 and second["kept"] == 0, second["log"][-3000:]
    answers_as_eager(second)
    torch.testing.assert_close(torch.tensor(second["compiled"]), torch.tensor(first["compiled"]), atol=1e-5, rtol=0)
    # On two threads inductor makes other kernels (split over threads): neither its entry nor the kept one is taken.
    two = results["two_threads"]
    assert two["loaded"] == 0 and two["misses"] >= 1 and two["kept"] == 1, two["log"][-3000:]
    answers_as_eager(two)
    from batching.engine.torch_door.frozen_graphs import FOLDER

    assert len(list((starts.caches["two_threads"] / FOLDER).glob("*.pt"))) == 2  # one a thread count
    # Inductor's cache emptied, what `frozen_graphs` kept left behind, naming a compiled graph that is gone: the
    # entry is dropped with a warning, the graph compiled in full and kept again.
    third = results["emptied"]
    assert third["loaded"] == 0 and third["misses"] >= 1 and third["kept"] == 1, third["log"][-3000:]
    assert "a kept graph could not be used" in third["log"]
    answers_as_eager(third)
    # Same config and shapes, other weights: inductor's own key would take the first model's graph.
    other = results["other_weights"]
    assert other["hits"] == 0 and other["misses"] >= 1 and other["loaded"] == 0
    answers_as_eager(other)


@door_only
def test_a_cache_with_garbled_files_is_cleared_and_the_graph_compiled_afresh(starts: Starts) -> None:
    after = starts.results["garbled"]
    assert after["misses"] >= 1, after["log"][-3000:]
    answers_as_eager(after)
    again = starts.results["garbled_again"]  # what the rebuild wrote is read back
    assert again["hits"] >= 1 and again["misses"] == 0 and again["loaded"] == 1, again["log"][-3000:]
    answers_as_eager(again)


@door_only
def test_a_cached_graph_that_disagrees_with_eager_is_dropped_and_compiled_afresh(
    tiny_model_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    (tmp_path / "planted").write_text("an entry of the cache")
    from batching.engine.torch_door import inductor_cache

    model = loaded(str(tiny_model_dirs["llama"])).model
    calls: list[str] = []

    def forward(model: LlamaForCausalLM, **inputs: Any) -> tuple[torch.Tensor, torch.Tensor, bool]:
        logits, greedy, _ = run_model(model, **inputs)
        if not calls:  # the first: "read from the cache", and wrong
            inductor_cache.counters["inductor"]["fxgraph_cache_hit"] += 1
            calls.append("cached")
            return logits + 10.0, greedy, True  # as a graph answers
        calls.append("compiled")
        return logits, greedy, True

    def warm(step: Any, bucket: tuple[int, int], compiler: StepCompiler | None) -> None:
        with torch.inference_mode():
            step(model, input_ids=torch.tensor([[1, 2, 3]]))

    compiler = StepCompiler(model, 2, 16, False, warm)
    compiler.forward = forward
    with caplog.at_level(logging.WARNING, logger="batching.engine.compiled"):
        assert compiler.compile_now() is not None
    assert compiler.ready and not compiler.failed
    assert calls == ["cached", "compiled"]
    assert not (tmp_path / "planted").exists()
    assert any("could not be used" in record.getMessage() for record in caplog.records)


@door_only
def test_a_direct_call_made_from_a_cached_graph_that_fails_later_is_dropped_with_it(
    tiny_model_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The warm-up makes the graph's direct call; a graph read from the cache that fails after that (say, in the
    direct call's own checks) is compiled afresh, and its direct call must be made again from the new graph."""
    from batching.engine.torch_door import inductor_cache

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    model = loaded(str(tiny_model_dirs["llama"])).model
    seen: list[int] = []  # the direct path's checked calls at the start of each warm-up

    def warm(step: Any, bucket: tuple[int, int], compiler: StepCompiler | None) -> None:
        assert compiler is not None
        seen.append(compiler.direct.checked)
        if len(seen) == 1:  # read from the cache, its direct call made and checked, then a failure
            inductor_cache.counters["inductor"]["fxgraph_cache_hit"] += 1
            compiler.direct.checked = DIRECT_CHECKS
            raise RuntimeError("the cached graph failed in a later step")

    compiler = StepCompiler(model, 2, 16, False, warm)
    assert compiler.compile_now() is not None
    assert seen == [0, 0]  # the retry started on a fresh direct path, not the dropped graph's
    assert compiler.ready and compiler.direct.checked == 0


def test_the_key_changes_with_the_weights_the_dtype_and_the_engine_code_but_not_with_a_reload(
    tiny_model_dirs: dict[str, Path], other_weights: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = str(tiny_model_dirs["llama"])
    key = graph_cache_key(loaded(folder).model)
    assert graph_cache_key(loaded(folder).model) == key
    assert graph_cache_key(loaded(str(other_weights)).model) != key
    assert graph_cache_key(loaded(folder, dtype="bfloat16").model) != key
    monkeypatch.setattr(graph_cache, "engine_code_digest", lambda: "other code")
    assert graph_cache_key(loaded(folder).model) != key


@door_only
def test_a_cached_graphs_tensors_are_kept_as_raw_bytes_and_read_back_equal_and_writable() -> None:
    # Inductor's cache module pickles what it keeps through ours once patched: a graph's constants (the C++
    # templates' packed weights, 1.44 GB at the 0.5B shape) as raw bytes, not torch's legacy format (9.3 s to load).
    from torch._inductor import codecache

    from batching.engine.torch_door import inductor_cache

    inductor_cache.cache_frozen_mkldnn_weights()
    assert isinstance(codecache.pickle, inductor_cache._GraphPickle)
    base = torch.randn(50, 30)
    kept = {"base": base, "view": base[10:20, 5:], "ints": torch.arange(7), "empty": torch.empty(0, 4)}
    kept["half"] = torch.randn(3, 5).to(torch.bfloat16).t()
    content = codecache.pickle.dumps(kept)
    assert b"_storage_from_bytes" in content and b"_load_from_bytes" not in content
    back = codecache.pickle.loads(content)
    for name, tensor in kept.items():
        read = back[name]
        assert (read.dtype, read.shape, read.stride()) == (tensor.dtype, tensor.shape, tensor.stride()), name
        assert torch.equal(read, tensor), name
    before = base.clone()
    back["base"][0, 0] = before[0, 0] + 1.0  # a writable copy, its own memory
    assert torch.equal(base, before)
