"""vLLM's real server for the tests: its Python (a test skips when vLLM is not installed, which CI=true counts as a
failure), the one server a test session shares (tests/conftest.py), and our engine's answers to hold it to."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from batching.bench.peers.serve_peer import Load, running_server, server_specs
from batching.bench.peers.vllm_server import NOT_INSTALLED, find_python
from batching.engine.batcher import Batcher
from batching.engine.events import FinishedEvent
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams
from config.settings import load_settings
from tests.engine.helpers import loaded

MODEL = "model/builtin"  # as the serving benchmark names it: vLLM serves it under this name
SLOTS = 4  # vLLM's --max-num-seqs: a remote run with more lanes makes requests wait on the server
# The serving benchmark sizes vLLM's context from its load: 96 + 400 tokens -> two 256-token pages, 512 tokens.
LOAD = Load(
    rates=(),
    requests=1,
    prompt_tokens=48,
    prompt_tokens_min=16,
    prompt_tokens_max=96,
    output_tokens=400,
    throughput=False,
)


def vllm_python() -> Path:
    """The vLLM environment's Python (the setting, else the default install), or skip saying how to install it."""
    python = find_python(load_settings().peers.vllm_python)
    if python is None:
        pytest.skip(NOT_INSTALLED)
    return python


@dataclass(frozen=True)
class RunningVllm:
    """A vLLM server started for the tests: where it is, the model name it serves, its slots and its log folder."""

    url: str
    model: str
    slots: int
    logs: Path


@contextlib.contextmanager
def serving_benchmark_vllm(folder: Path) -> Iterator[RunningVllm]:
    """vLLM started exactly as `python -m batching.bench serve-peer` starts it (SLOTS sequences, 512 tokens a step,
    one thread, offline), with one warm-up request; stopped after."""
    spec = server_specs(MODEL, SLOTS, 512, LOAD, folder, vllm_python())["vllm"]
    with running_server(spec, MODEL, folder) as url:
        yield RunningVllm(url, MODEL, SLOTS, folder)


def our_answers(prompts: Sequence[str | Sequence[int]], caps: Sequence[int], ignore_eos: bool) -> list[FinishedEvent]:
    """Our continuous batcher's greedy answers on the embedded model, in prompt order (one torch thread: two are
    several times slower for a model this small on this 2-core machine)."""
    model = loaded(MODEL)
    batcher = Batcher(model.model, model.tokenizer, BatcherOptions(max_batch_size=SLOTS), mode="continuous")
    for index, (prompt, cap) in enumerate(zip(prompts, caps, strict=True)):
        text_or_ids = prompt if isinstance(prompt, str) else list(prompt)
        batcher.add(text_or_ids, RequestParams(cap, ignore_eos=ignore_eos), request_id=str(index))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        finished = {event.request_id: event for event in batcher.run() if isinstance(event, FinishedEvent)}
    finally:
        torch.set_num_threads(threads)
    return [finished[str(index)] for index in range(len(prompts))]
