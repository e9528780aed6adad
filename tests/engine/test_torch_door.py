"""The one door to torch's internals: one version gate (one function, one checked torch), and an engine that imports,
compiles and serves token for token the same without it, whether the door's package cannot be imported at all or
the setting closes it (fresh processes: the door is chosen once per process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from batching.engine.torch_gate import CHECKED_TORCH, DoorState, checked, compile_route, door_state
from tests.engine.helpers import door_open
from tests.helpers import ROOT


def test_the_gate_takes_the_checked_torch_release_alone() -> None:
    assert checked("2.13.0+cpu", on="2.13") and checked("2.13.1", on="2.13") and checked("2.13.0a0+git5e1d", on="2.13")
    assert not checked("2.14.1+cu128", on="2.13") and not checked("2.1.0", on="2.13")
    assert not checked("2.130.0", on="2.13") and not checked("3.13.0", on="2.13") and not checked("", on="2.13")
    assert checked("2.13.2+cpu", on="2.13.2") and not checked("2.13.1", on="2.13.2")


def test_the_door_state_says_which_way_compiled_steps_run() -> None:
    version = f"{CHECKED_TORCH}.0+cpu"
    on = f"torch internals: on (checked on torch {CHECKED_TORCH})"
    assert door_state(version, allowed=True) == DoorState(True, on)
    other = door_state("2.14.1+cu128", allowed=True)
    assert not other.open
    assert other.line == "torch internals: off: torch 2.14.1+cu128 was not checked (public torch APIs only)"
    off = door_state(version, allowed=False)
    assert not off.open and off.line == "torch internals: off by setting (public torch APIs only)"


def test_the_checked_torch_is_written_once() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "batching").rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if line.startswith("CHECKED_TORCH =")
    ]
    assert found == ["batching/engine/torch_gate.py:" + found[0].rsplit(":", 1)[-1]], found


@pytest.mark.skipif(not door_open(), reason="the door to torch's internals is closed here")
def test_the_door_opens_where_it_may_and_says_so() -> None:
    state, route = compile_route()
    assert state.open and route.name == "torch internals" and "batching.engine.torch_door" in sys.modules


# A fresh process: the door as `how` leaves it, then a compiled batcher (its graph made up front) and an eager one on
# the tiny llama serve the same few requests, some arriving late; prints the start line, the steps by how they ran,
# whether each answer is `generate`'s, and the door's modules imported.
_SERVE = """
import json, sys
sys.path.insert(0, {root!r})
{how}
import torch
torch.set_num_threads(1)
from batching.engine.batcher import Batcher
from batching.engine.options import BatcherOptions
from batching.engine.torch_gate import allow_internals, compile_route
from config.settings import load_settings
from tests.engine.helpers import loaded, random_prompts, reference, run_with_late_arrivals

allow_internals(load_settings().engine.torch_internals)  # as every entry point does
model = loaded({folder!r})
caps = [12, 3, 9, 14]
prompts = random_prompts(len(caps), vocab=300, seed=31, longest=12)
expected = [reference(model.model, prompt, cap, ignore_eos=True) for prompt, cap in zip(prompts, caps)]
answers, paths = {{}}, {{}}
for compiled in (True, False):
    options = BatcherOptions(max_batch_size=2, max_batched_tokens=16, max_seq_len=64, compile_steps=compiled,
                             compile_autotune=False)
    batcher = Batcher(model.model, model.tokenizer, options)
    if compiled:
        assert batcher.runner.compiler.compile_now() is not None
    events = []
    outputs = run_with_late_arrivals(batcher, prompts, caps, late_from=2, join_at_step=2, ignore_eos=True,
                                     events=events)
    answers[compiled] = [outputs[i] == expected[i] for i in range(len(caps))]
    steps = [event.path for event in events if type(event).__name__ == "StepEvent"]
    paths[compiled] = {{path: steps.count(path) for path in set(steps)}}
door = sorted(name for name, module in sys.modules.items() if name.startswith("batching.engine.torch_door") and module)
print(json.dumps({{"line": compile_route()[0].line, "exact": answers, "paths": paths, "door": door}}))
"""
# The door's package made unimportable, as on a build that lacks it: `import` of it raises ImportError.
WITHOUT_THE_DOOR = 'sys.modules["batching.engine.torch_door"] = None'


def _launch(folder: Path, how: str, env: dict[str, str]) -> subprocess.Popen[str]:
    script = _SERVE.format(root=str(ROOT), how=how, folder=str(folder))
    environ = {**os.environ, **env}
    return subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ
    )


def _result(process: subprocess.Popen[str]) -> dict[str, Any]:
    stdout, stderr = process.communicate(timeout=900)
    assert process.returncode == 0, stderr[-3000:]
    result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return result


@pytest.mark.long
def test_without_the_door_or_with_it_closed_the_engine_serves_compiled_and_eager_token_for_token(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    folder = tiny_model_dirs["llama"]
    cache = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}  # a real compile, not one left by another test
    # Side by side, each in a process of its own: the door's package unimportable, and the setting off.
    launched = {
        "unimportable": _launch(folder, WITHOUT_THE_DOOR, {**cache, "BATCHSCOPE_ENGINE__TORCH_INTERNALS": "true"}),
        "setting": _launch(folder, "", {**cache, "BATCHSCOPE_ENGINE__TORCH_INTERNALS": "false"}),
    }
    results = {name: _result(process) for name, process in launched.items()}
    for name, result in results.items():
        assert result["exact"] == {"true": [True] * 4, "false": [True] * 4}, (name, result)
        assert result["door"] == [], name  # nothing of the door imported
        compiled, eager = result["paths"]["true"], result["paths"]["false"]
        assert compiled.get("compiled", 0) > 10 and "direct" not in compiled, (name, compiled)  # the public route
        assert set(eager) == {"eager"}, name
    assert results["unimportable"]["line"].startswith("torch internals: off: the door could not open")
    assert results["setting"]["line"] == "torch internals: off by setting (public torch APIs only)"
