"""Fixtures the tests of every folder share: tiny random models of each architecture family, saved once per session
to a temp folder, and vLLM's real server; the session's environment; CI's rule that nothing is skipped."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from batching.engine.torch_gate import allow_internals
from config.settings import load_settings
from tests.bench.vllm_helpers import RunningVllm, serving_benchmark_vllm
from tests.engine.families import FAMILIES
from tests.helpers import KEEP_EAGER
from tests.tiny_models import TINY_CONFIGS, save_tiny_models

# Engines started by the tests (AppTest, browser, servers: subprocesses inherit this) run eager: compiling their
# decode steps in the background would take both of this machine's cores for half a minute per engine. The
# compiled path and the default's flow (eager at first, compiled when ready) have tests of their own that turn it on.
os.environ.setdefault(KEEP_EAGER, "false")
# One torch thread in the test process too, as the engine process runs a small model: on two cores shared with an
# engine process, a browser and a server, two threads per process mostly wait on each other (the eager families
# matrix took 491 s on two threads and 33 s on one, with other work on the machine). Tests of thread counts set
# their own.
torch.set_num_threads(1)
# The door to torch's internals as the settings say, as every entry point does: BATCHSCOPE_ENGINE__TORCH_INTERNALS=false
# runs the engine's tests on public torch APIs only (tests of the door's own pieces skip then).
allow_internals(load_settings().engine.torch_internals)


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One folder per architecture, each holding a random-init model and the shared tiny tokenizer."""
    return save_tiny_models(tmp_path_factory.mktemp("tiny-models"), TINY_CONFIGS)


class FamilyDirs(dict[str, Path]):
    """The families' folders; a GPTQ family's is there only where gptqmodel is installed, and asking for it without
    skips the test (under CI=true, a failure: see `pytest_runtest_makereport`)."""

    def __missing__(self, name: str) -> Path:
        pytest.skip(f"{name} needs gptqmodel to be quantised: pip install -r requirements-gptq.txt")


@pytest.fixture(scope="session")
def family_model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A folder per model family of tests/engine/families.py (its tiny config, random weights, the tiny tokenizer),
    a GPTQ family's saved random model quantised by `model.gptq.quantize` (the embedded calibration texts)."""
    root = tmp_path_factory.mktemp("family-models")
    dirs = FamilyDirs(save_tiny_models(root, {family.name: family.config() for family in FAMILIES}))
    from transformers.utils import is_gptqmodel_available

    for family in FAMILIES:
        if family.gptq_bits:
            plain = dirs.pop(family.name)
            if is_gptqmodel_available():
                from model.gptq import quantize

                dirs[family.name] = quantize(str(plain), root / f"{family.name}-quantised", family.gptq_bits).folder
    return dirs


# The suite runs on two pytest-xdist workers (`-n 2 --dist loadgroup` in pyproject's addopts): these modules, which
# compile graphs (a graph per model family; processes that start on a cold and a warm disk cache; builds of the
# paged-decode operator; graphs made beside running steps), CPU-bound and nothing timed, on one worker at the lowest
# CPU priority; everything else, in order, on the other. The timed tests (browsers, servers, step medians) keep the
# cores whenever they want them, and the compiles take what they leave idle. All but the families moved here on
# 2026-11-27: on the foreground worker they were about 250 of its 900 s, the background's families about 7 minutes.
BACKGROUND_MODULES = (
    "tests/engine/test_families.py",
    "tests/engine/test_graph_cache.py",
    "tests/engine/test_paged_decode.py",
    "tests/engine/test_compiled.py",
    "tests/service/test_race_graphs.py",
)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into the tests' ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        background = item.nodeid.startswith(BACKGROUND_MODULES)
        item.add_marker(pytest.mark.xdist_group("background" if background else "foreground"))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A worker running background modules lowers its priority once (its compiler subprocesses inherit it)."""
    if os.environ.get("PYTEST_XDIST_WORKER") and item.nodeid.startswith(BACKGROUND_MODULES) and os.nice(0) < 19:
        lowest_cpu_priority()


def lowest_cpu_priority() -> None:
    """This process (and what it starts later) at the lowest CPU priority, against every other process.

    Niceness alone only ranks the processes of one session: with the kernel's autogroups on (as here), each session
    (a browser, a server started in a session of its own) gets an equal share whatever its processes' niceness. So
    the process starts a session of its own and gives that session the lowest priority too.
    """
    try:
        os.setsid()
        Path("/proc/self/autogroup").write_text("19")
    except OSError:  # already a session leader, or no autogroups (cgroups then rank by niceness alone)
        pass
    os.nice(19 - os.nice(0))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    """Under CI=true a skipped test is a failure: nothing may pass by being left out for a missing dependency."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI", "").lower() == "true" and report.skipped and call.when in ("setup", "call"):
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which requires every dependency: {report.longrepr}"


@pytest.fixture(scope="session")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningVllm]:
    """vLLM's real server on the embedded model, shared by the whole session: it takes about a minute to start
    (half of it compiling the model) and idles at about 2 % of a core. Skips when vLLM is not installed."""
    with serving_benchmark_vllm(tmp_path_factory.mktemp("vllm")) as server:
        yield server
