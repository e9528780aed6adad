"""Making a step kind's graph off the serving path: one traced step on a scratch runner of the batcher's shape, so
the real batchers go on stepping on theirs while the graph is made (`compiled.StepCompiler` runs these)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

import batching.engine.paged_decode as paged_decode
from batching.engine.compiled import Bucket, StepCompiler
from batching.engine.kv_cache import PagedKVCache
from batching.engine.step_builder import StepBuilder
from batching.engine.step_call import DIRECT_CHECKS, DIRECT_TRIES, StepAnswer
from batching.engine.step_inputs import PackedStep
from batching.engine.torch_gate import compile_route


class Scratch(Protocol):
    """What a warm-up needs of a runner: its cache and builder, and its two compiled step kinds, traced; the prompt
    steps' compiler (a scratch runner has none until the warm-up makes a direct call; a decode step is given its)."""

    cache: PagedKVCache
    builder: StepBuilder
    reads_through_tables: bool
    mixed_compiler: StepCompiler | None

    def decode_with(
        self,
        tokens: list[int],
        positions: list[int],
        slots: list[int],
        step: Callable[..., object] | None,
        bucket: Bucket | None,
        compiler: StepCompiler | None = None,
        trace: bool = False,
    ) -> StepAnswer: ...

    def mixed_with(self, step: Callable[..., object], packed: PackedStep, trace: bool = False) -> StepAnswer: ...


# (rows, columns) -> a runner of the batcher's shape on a pool of its own, its rows claimed and cache allocated
ScratchMaker = Callable[[int, int], Scratch]


def make_direct_call(compiler: StepCompiler, run: Callable[[Callable[..., object]], object]) -> None:
    """Make and check `compiler`'s direct call (`direct_call`) with scratch steps (`run(step)`), before the graph is
    ready: a call that makes it is watched, and the next `DIRECT_CHECKS` run the graph twice, which the first real
    steps would pay (a 512-token prompt step of the 0.5B shape took 5.7 s instead of 2.9 for its first three)."""
    path, step = compiler.direct, compiler.graphs_only()
    for _ in range(DIRECT_TRIES + DIRECT_CHECKS):
        if path.failed or path.checked >= DIRECT_CHECKS:
            return
        run(step)


@torch.inference_mode()
def warm_decode(
    make: ScratchMaker, forward: Callable[..., object], bucket: Bucket, compiler: StepCompiler | None
) -> None:
    """Run one decode step of this shape through the compiled forward on a scratch runner, which makes its graph;
    where the route cannot mark sizes symbolic, one of other rows and columns (`_resized`: what differs, dynamo makes
    symbolic); then one of every smaller row count a decode step may have (2 up: one row is padded to two), so a
    count the graph's guards refuse gets a graph of its own now, never in a step. Most models' first graph takes them
    all. With `compiler`, then its direct call (`make_direct_call`)."""
    rows, columns = bucket
    scratch, slots = _decode_scratch(make, rows, columns)
    pad = scratch.builder.pad_token_id
    scratch.decode_with([pad] * rows, [0] * rows, slots, forward, bucket, trace=True)
    if not compile_route()[1].marks_sizes:
        other_rows, other_columns = _resized(rows, columns, scratch.cache.pool.block_size)
        other, other_slots = _decode_scratch(make, other_rows, other_columns)
        other.decode_with([pad] * other_rows, [0] * other_rows, other_slots, forward, (other_rows, other_columns))
    for count in range(2, rows):
        scratch.decode_with([pad] * count, [0] * count, slots[:count], forward, (count, columns))
    if compiler is not None:
        make_direct_call(
            compiler, lambda step: scratch.decode_with([pad] * rows, [0] * rows, slots, step, bucket, compiler)
        )


def _decode_scratch(make: ScratchMaker, rows: int, columns: int) -> tuple[Scratch, list[int]]:
    """A scratch runner of `rows` rows each holding `columns` - 1 columns, and each row's slot for its next token."""
    scratch = make(rows, columns)
    if scratch.reads_through_tables:
        paged_decode.load()  # before the graph is traced: the graph calls the operator from then on
    scratch.cache.lengths[:rows] = [columns - 1] * rows
    return scratch, [scratch.cache.slots(row, columns - 1, 1)[0] for row in range(rows)]


def _resized(rows: int, columns: int, block_size: int) -> tuple[int, int]:
    """Another decode bucket than (`rows`, `columns`): a row fewer (never under two) and fewer blocks a row (never
    under two: a size of 1 would be specialised on), their count unlike its rows (sizes traced equal would be one
    symbol); the columns as they are where there are no fewer to take (a step of more then misses the graph once, and
    it is made again, those sizes symbolic: `StepCompiler.missed`)."""
    other_rows = rows - 1 if rows > 2 else rows
    fewer = [width for width in range(columns // block_size - 1, 1, -1) if width != other_rows]
    return other_rows, (fewer[0] * block_size if fewer else columns)


# The prompt graph's linear layers are autotuned at the step it is traced with: inductor times each kernel for that
# token count and keeps the winner for every count. Traced at 15 tokens, the choice between its C++ GEMM template
# and oneDNN's packed matmul was a coin toss that long prompts paid for: at the 0.5B shape (2 threads, AMD EPYC,
# 2026-11-27) one compile ran a 512-token prompt step in 2.02 s and another in 2.78 s (eager: 2.5 s). Traced with a
# first chunk of 245 tokens: 1.90 s at 512 tokens, 0.91 s at 256, 0.47 s at 128, 0.07 s at 8 (eager 2.53, 1.29,
# 0.74, 0.24 s). About half the default step budget (512 tokens), and at most half the context.
MIXED_TRACE_CHUNK = 245


@torch.inference_mode()
def warm_mixed(
    make: ScratchMaker,
    capacity: int,
    max_len: int,
    forward: Callable[..., object],
    bucket: Bucket,
    compiler: StepCompiler | None,
) -> None:
    """Run one step with prompt chunks through the compiled forward on a scratch runner: single-token rows beside
    a later chunk and a long first one (`MIXED_TRACE_CHUNK`, the size its kernels are chosen for), every count
    distinct, so no two sizes are traced equal; where the route cannot mark sizes symbolic, one with other counts
    (what differs, dynamo makes symbolic). With `compiler`, then its direct call (`make_direct_call`), on short steps
    of the same rows."""
    first = min(MIXED_TRACE_CHUNK, max_len // 2 - 8)
    first = first if first > 7 else 5  # a tiny context: as small as the other counts allow
    scratch, row_tokens = _mixed_scratch(make, capacity, bucket[1], first, 7)
    scratch.mixed_with(forward, scratch.builder.pack(row_tokens), trace=True)
    if not compile_route()[1].marks_sizes:
        other, other_tokens = _mixed_scratch(make, capacity, bucket[1], max(first // 2, 9), 6)
        other.mixed_with(forward, other.builder.pack(other_tokens))
    if compiler is not None:
        short = [tokens[:5] for tokens in row_tokens]
        scratch.mixed_compiler = compiler
        make_direct_call(compiler, lambda step: scratch.mixed_with(step, scratch.builder.pack(short)))


def _mixed_scratch(
    make: ScratchMaker, capacity: int, column_step: int, first: int, later: int
) -> tuple[Scratch, list[list[int]]]:
    """A scratch runner for a step with prompt chunks, and its rows' tokens: single-token rows, a later chunk of
    `later` tokens and a first one of `first` (the columns as many steps of `column_step` as it needs)."""
    columns = -(-(first + 1) // column_step) * column_step
    scratch = make(capacity, columns)
    if scratch.reads_through_tables:
        paged_decode.load()  # before the graph is traced, as for the decode graph
    pad = scratch.builder.pad_token_id
    scratch.cache.lengths[:capacity] = [columns // 2] * capacity
    row_tokens: list[list[int]] = [[pad]] * max(min(capacity - 2, 3), 0) + [[pad] * later]
    if capacity > 1:
        row_tokens.append([pad] * first)
        scratch.cache.lengths[len(row_tokens) - 1] = 0  # a first chunk
    row_tokens += [[] for _ in range(capacity - len(row_tokens))]
    return scratch, row_tokens
