"""Compiled decode steps replayed from CUDA graphs, on a GPU: one graph per column bucket, captured at first use.

On a GPU a compiled decode step of a small model is bound by launching its kernels, not by running them: a few
hundred kernels of a few microseconds each, every one launched from the graph's Python wrapper. A CUDA graph
replays them all with one launch (what vLLM does for its decode steps, and `torch.compile`'s "reduce-overhead").

A graph reads and writes fixed addresses, so each bucket has static inputs (the step's token ids, positions, cache
slots, columns, block tables and first columns, int64 on the device) that every step's values are copied into,
from pinned host buffers; the KV pools are the runner's own, allocated once, so their addresses hold for the
runner's life. Buckets pad every step to the runner's slot count (a step's cost on a GPU barely moves with its rows)
and its columns to a multiple of `COLUMN_STEP` (the padding columns read the scratch block and are masked), so a
run captures a graph or two. A graph is captured from a real step: its call through `torch.compile` answers the
step, then the captured graph is replayed over the same inputs with the cache slots it writes overwritten with NaN,
and its outputs and writes must equal the call's: bit for bit, or within a few roundings where a library picked
another kernel on the capture's stream, the greedy choices always exactly; else the runner gives graphs up for good
(one line in the log) and calls the compiled step as before. Dynamo's guards run at capture only: a bucket fixes
every size the graph could be guarded on.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from batching.engine.attention import PackedPlan
from batching.engine.kv_cache import StepPlan

logger = logging.getLogger(__name__)

COLUMN_STEP = 256  # a bucket's columns are a multiple of this (and of the compiled graph's own column step)
STATS: Counter[str] = Counter()  # this process's captures, replays and failures, for the benchmark's report

Outputs = tuple[torch.Tensor, torch.Tensor]  # a compiled decode step's logits and greedy choices


@dataclass
class CapturedStep:
    """One bucket's graph: its static inputs (device tensors and their pinned host buffers), outputs, and the
    objects the step's plan holds (kept for the runner's cache plan and mask descriptions)."""

    graph: torch.cuda.CUDAGraph
    inputs: list[torch.Tensor]
    hosts: list[torch.Tensor]
    outputs: Outputs
    plans: tuple[StepPlan, PackedPlan]


class DecodeGraphs:
    """A runner's decode-step graphs, by bucket (rows, columns); `failed` once a capture went wrong."""

    def __init__(self, rows: int, column_step: int, max_columns: int) -> None:
        """`rows`: every step's padded rows (the runner's slots); `column_step`, `max_columns`: the compiled graph's
        column step and the most columns a step of the runner can read, a multiple of it."""
        self.rows = rows
        self.column_step = -(-max(COLUMN_STEP, column_step) // column_step) * column_step
        self.max_columns = max_columns
        self.failed = False
        self.replayed = 0
        self._graphs: dict[tuple[int, int], CapturedStep] = {}
        self._pool: Any = None  # one memory pool for every graph (they never run at once), made at the first capture
        self._stream: Any = None  # the stream graphs are captured on, made at the first capture

    @property
    def captured(self) -> int:
        """How many buckets have a graph."""
        return len(self._graphs)

    def bucket(self, kv_len: int) -> tuple[int, int]:
        """The padded shape of a decode step reading `kv_len` columns: every slot, the columns rounded up."""
        return self.rows, min(-(-kv_len // self.column_step) * self.column_step, self.max_columns)

    def replay(self, bucket: tuple[int, int], values: Sequence[Sequence[Any]]) -> CapturedStep | None:
        """Copy the step's values (nested lists of the static inputs' shapes) into the bucket's static inputs and
        replay its graph; None when the bucket has no graph yet."""
        captured = self._graphs.get(bucket)
        if captured is None:
            return None
        for host, device_input, value in zip(captured.hosts, captured.inputs, values, strict=True):
            host.numpy()[...] = value
            device_input.copy_(host, non_blocking=True)
        captured.graph.replay()
        self.replayed += 1
        STATS["replayed"] += 1
        return captured

    def capture(
        self,
        bucket: tuple[int, int],
        inputs: list[torch.Tensor],
        plans: tuple[StepPlan, PackedPlan],
        called: Outputs,
        run: Callable[[], Outputs],
        pools: list[torch.Tensor],
        slots: torch.Tensor,
    ) -> None:
        """Capture the bucket's graph from `run` (the compiled call over `inputs` again, raising if it ran no graph),
        the step already answered by that call (`called`), and check one replay against it (see the module's
        docstring). On any failure the runner gives graphs up (`failed`)."""
        why = ""
        try:
            self._pool = self._pool or torch.cuda.graph_pool_handle()
            stream = self._stream = self._stream or torch.cuda.Stream()
            # The step once more on the capture's stream first: what a library initialises lazily for a stream (a
            # workspace, a handle) must not happen inside the capture (H100, torch 2.11: the capture was invalidated).
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                run()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool, stream=stream, capture_error_mode="thread_local"):
                static = run()
            agreement = _replay_agreement(graph, static, called, pools, slots)
            why = "" if agreement else ": its replay disagreed with the call"
        except Exception as exc:  # any failure means: no graphs, the compiled call as before
            logger.debug("CUDA graph capture failed", exc_info=exc)
            agreement = None
            why = f": {type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
        if agreement is None:
            self.failed = True
            STATS["failed"] += 1
            logger.warning("a decode step's CUDA graph failed or disagreed with its compiled call, none used%s", why)
            return
        STATS[agreement] += 1
        hosts = [torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True) for tensor in inputs]
        self._graphs[bucket] = CapturedStep(graph, inputs, hosts, static, plans)
        STATS["captured"] += 1
        logger.info("decode step of %d rows over %d columns captured as a CUDA graph", *bucket)


def _replay_agreement(
    graph: Any, static: Outputs, outputs: Outputs, pools: list[torch.Tensor], slots: torch.Tensor
) -> str | None:
    """Replay `graph` with the cache slots the step wrote overwritten with NaN, and compare its outputs and writes
    with the compiled call's: "bitwise" when equal, "close" when the greedy choices are equal and the logits and
    writes within `TOLERANCE` of the call's (a library may pick another kernel on the capture's stream), else None.
    The slots hold the call's writes again afterwards, whatever the result."""
    flat = [pool.view(pool.shape[0], -1, pool.shape[-1]) for pool in pools]
    written = [pool[:, slots].clone() for pool in flat]
    for pool in flat:
        pool[:, slots] = float("nan")
    graph.replay()
    pairs = [(static[0], outputs[0]), *((pool[:, slots], kept) for pool, kept in zip(flat, written, strict=True))]
    agreement: str | None = "bitwise"
    if not torch.equal(static[1], outputs[1]):
        agreement = None
    elif not all(torch.equal(replayed, called) for replayed, called in pairs):
        agreement = "close" if all(_close(replayed, called) for replayed, called in pairs) else None
    for pool, kept in zip(flat, written, strict=True):
        pool[:, slots] = kept
    return agreement


TOLERANCE = 1e-2  # relative (norms of the difference and of the call's tensor): a few roundings in bfloat16


def _close(replayed: torch.Tensor, called: torch.Tensor) -> bool:
    replayed, called = replayed.float(), called.float()
    if not bool(torch.isfinite(replayed).all()):
        return False
    return float(torch.linalg.vector_norm(replayed - called)) <= TOLERANCE * float(torch.linalg.vector_norm(called))
