"""How the engine picks its torch thread count: the rule over measured times (fed here, never this machine's), the
timing loop on a fake clock, and the OpenMP wait policy left to the environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from batching.engine import omp_wait, threads
from tests.engine.helpers import loaded

ROOT = Path(__file__).resolve().parents[2]


def test_the_counts_tried_are_one_then_powers_of_two_then_the_most_allowed() -> None:
    assert threads.counts_up_to(1) == [1]
    assert threads.counts_up_to(2) == [1, 2]
    assert threads.counts_up_to(6) == [1, 2, 4, 6]
    assert threads.counts_up_to(16) == [1, 2, 4, 8, 16]


def test_more_threads_measured_slower_are_not_chosen() -> None:
    assert threads.choose({1: 0.010, 2: 0.047}) == 1  # the embedded model on shared cores: 4.7x slower at two
    assert threads.choose({1: 0.010, 2: 0.012, 4: 0.020}) == 1


def test_more_threads_are_chosen_only_when_faster_by_more_than_the_margin() -> None:
    assert threads.choose({1: 0.140, 2: 0.080, 4: 0.050, 8: 0.049}) == 4  # 8 within 5% of 4: the fewer
    assert threads.choose({1: 0.100, 2: 0.097}) == 1  # 3% faster is noise
    assert threads.choose({1: 0.100, 2: 0.090}) == 2


def test_compiled_steps_take_the_most_threads_among_the_fastest_never_one_measured_clearly_slower() -> None:
    assert threads.choose({1: 0.00775, 2: 0.00774}, compiled=True) == 2  # the embedded model's eager tie, quiet
    assert threads.choose({1: 0.100, 2: 0.104}, compiled=True) == 2  # within the margin
    assert threads.choose({1: 0.00626, 2: 0.00834}, compiled=True) == 2  # eager 1.33x slower at two: compiled gains
    assert threads.choose({1: 0.00716, 2: 0.01323}, compiled=True) == 2  # 1.85x, once on a quiet machine
    assert threads.choose({1: 0.010, 2: 0.047}, compiled=True) == 1  # shared cores: clearly slower at two
    # Every allowed thread, as the peers run, unless the eager step there is twice the fastest count's or more.
    assert threads.choose({1: 0.140, 2: 0.080, 4: 0.050, 8: 0.070}, compiled=True) == 8
    assert threads.choose({1: 0.140, 2: 0.080, 4: 0.050, 8: 0.101}, compiled=True) == 4


def test_the_choice_is_never_slower_than_one_thread_measured() -> None:
    for seconds in ({1: 1.0, 2: 0.96, 4: 0.5}, {1: 0.3, 2: 0.31, 4: 0.2}, {1: 0.2, 2: 0.5, 4: 0.9}):
        assert seconds[threads.choose(seconds)] <= seconds[1]


def test_each_count_is_timed_by_the_median_of_its_rounds_at_that_count() -> None:
    """A fake clock that advances by what the current thread count costs, with one slow spell in round two."""
    cost = {1: 3.0, 2: 5.0, 4: 2.0}
    now = [0.0]
    calls: list[int] = []

    def work() -> None:
        count = torch.get_num_threads()
        calls.append(count)
        spell = 100.0 if len(calls) in (7, 8) else 0.0  # round two's first count, warm-up and timed call
        now[0] += cost[count] + spell

    before = torch.get_num_threads()
    seconds = threads.time_counts(work, [1, 2, 4], rounds=3, clock=lambda: now[0])
    assert seconds == cost  # the slow spell is one round of three: the median leaves it out
    assert torch.get_num_threads() == before
    assert calls[:6] == [1, 1, 2, 2, 4, 4] and calls[6:12] == [2, 2, 4, 4, 1, 1]  # each round starts one later
    assert threads.choose(seconds) == 4


def test_one_thread_allowed_or_a_gpu_is_not_timed(tiny_model_dirs) -> None:
    model = loaded(str(tiny_model_dirs["llama"]))
    choice = threads.pick_threads(model.model, model.tokenizer, 1)
    assert (choice.threads, choice.most, dict(choice.step_s)) == (1, 1, {})
    assert "not timed" in choice.line()


def test_the_probe_times_real_decode_steps_and_leaves_torch_as_it_was(tiny_model_dirs) -> None:
    model = loaded(str(tiny_model_dirs["llama"]))
    before = torch.get_num_threads()
    choice = threads.pick_threads(model.model, model.tokenizer, 2)
    assert torch.get_num_threads() == before
    assert set(choice.step_s) == {1, 2} and all(took > 0 for took in choice.step_s.values())
    assert choice.threads == threads.choose(choice.step_s)
    assert f"{choice.threads} of 2 thread(s)" in choice.line()


@pytest.mark.long
def test_the_engine_package_leaves_the_openmp_wait_policy_to_the_environment() -> None:
    """libgomp reads the policy once, when torch loads it: importing the engine must not have set one (a passive
    wait made two threads 4.6x slower than spinning on a quiet machine); a user's own setting stays."""
    script = (
        "import os, sys\n"
        "class Watch:\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'torch': print('at torch:', os.environ.get('OMP_WAIT_POLICY'))\n"
        "sys.meta_path.insert(0, Watch())\n"
        "import batching.bench.cli\n"
    )
    env = {key: value for key, value in os.environ.items() if key != omp_wait.ENV}
    env["PYTHONPATH"] = str(ROOT)
    unset = subprocess.run([sys.executable, "-c", script], env=env, **_text())
    told = subprocess.run([sys.executable, "-c", script], env={**env, omp_wait.ENV: "ACTIVE"}, **_text())
    assert unset.stdout.splitlines()[0] == "at torch: None"
    assert told.stdout.splitlines()[0] == "at torch: ACTIVE"


def _text() -> dict:
    return {"capture_output": True, "text": True, "check": True, "cwd": str(ROOT), "timeout": 120}
