"""A compact description of the attention masks a step's plan really built, and its expansion to a dense matrix.

The step builders make boolean masks per row (`step_builder`) and attention narrows them per layer's sliding window
(`RowMask.additive`). Copying those tensors out every step would cost more than the step's bookkeeping, so the
runner records only the few integers they were built from (`describe_step`); `cell_kinds` rebuilds every cell from
them with the same rules, and tests/engine/test_mask_view.py checks it against the tensors attention actually received.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from batching.engine.attention import Chunk, Locality, PackedPlan
from batching.engine.model_support import probe_attention

# What one cell (query x key column) of a step's mask is, in legend order.
ALLOWED, FUTURE, OTHER_ROW, PADDING, OUTSIDE_WINDOW, OUTSIDE_CHUNK = range(6)
CELL_NAMES = ("allowed", "future (causal)", "another row", "padding", "outside the window", "an earlier chunk")


@dataclass(frozen=True)
class MaskRow:
    """One row's queries in one step: `queries` consecutive cache columns from `first_column`, over `kv_len` keys.

    Columns `[0, padding)` of the row hold left padding (blocked). `batched`: the row went through the one batched
    call of single-token rows (its `kv_len` is that call's, the longest such row's); otherwise it had its own call,
    where a padding query still attends to itself (a softmax row is never empty).
    """

    row: int
    first_column: int
    queries: int
    kv_len: int
    padding: int
    batched: bool


@dataclass(frozen=True)
class StepMask:
    """The masks of one forward pass: its rows in packed order, and the model's distinct sliding windows (None: full
    attention; a `Chunk`: chunked local attention), each layer using one of them."""

    rows: tuple[MaskRow, ...]
    windows: tuple[Locality, ...]
    # A hybrid's conv / SSM / linear-attention layers: no mask (each request's tokens run through its own state).
    recurrent_layers: int = 0

    @property
    def queries(self) -> int:
        return sum(row.queries for row in self.rows)

    @property
    def keys(self) -> int:
        return sum(row.kv_len for row in self.rows)


def describe_step(
    plan: PackedPlan,
    singles: Sequence[tuple[int, int]],
    first_columns: Sequence[int],
    padding: Sequence[int],
    windows: tuple[Locality, ...],
    recurrent_layers: int = 0,
) -> StepMask:
    """The runner's step, from its plan and what the plan was built from: `singles` (row, packed index), each
    row's first new column and its padding columns (read before the step writes). A few integers per row."""
    chunks = [(chunk.row, chunk.start, chunk.end, chunk.kv_len) for chunk in plan.chunks]
    return describe_rows(plan.single_kv_len, singles, chunks, first_columns, padding, windows, recurrent_layers)


def describe_rows(
    single_kv_len: int,
    singles: Sequence[tuple[int, int]],
    chunks: Sequence[tuple[int, int, int, int]],
    first_columns: Sequence[int],
    padding: Sequence[int],
    windows: tuple[Locality, ...],
    recurrent_layers: int = 0,
) -> StepMask:
    """A step's masks from its rows: `singles` (row, packed index) read `single_kv_len` columns in one batched
    call; each chunk (row, packed start, packed end, columns read) is a call of its own."""
    placed = [(index, MaskRow(row, first_columns[row], 1, single_kv_len, padding[row], True)) for row, index in singles]
    placed += [
        (start, MaskRow(row, first_columns[row], end - start, kv_len, padding[row], False))
        for row, start, end, kv_len in chunks
    ]
    placed.sort(key=lambda item: item[0])
    return StepMask(tuple(row for _, row in placed), windows, recurrent_layers)


def layer_windows(model: PreTrainedModel) -> tuple[Locality, ...]:
    """The model's distinct sliding windows in layer order (None: a full-attention layer; a `Chunk`: a chunked one),
    as its layers pass them."""
    return tuple(dict.fromkeys(layer.locality for layer in probe_attention(model)))


def row_cells(row: MaskRow, window: Locality) -> torch.Tensor:
    """One row's own block, `[queries, kv_len]`, as cell kinds (ALLOWED, FUTURE, PADDING, OUTSIDE_WINDOW,
    OUTSIDE_CHUNK)."""
    own = torch.arange(row.first_column, row.first_column + row.queries)
    return _kinds(row, window, own[:, None], torch.arange(row.kv_len)[None, :])


def _kinds(row: MaskRow, window: Locality, own: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """Cell kinds of queries at cache columns `own` [q, 1] over key columns `columns` [1, k], by the runner's rules."""
    cells = torch.full((own.shape[0], columns.shape[1]), ALLOWED, dtype=torch.int8)
    if isinstance(window, Chunk):  # chunks count from the row's first real position
        cells[(columns - row.padding) // window.size != (own - row.padding) // window.size] = OUTSIDE_CHUNK
    elif window is not None:
        cells[columns <= own - window] = OUTSIDE_WINDOW
    padded = columns < row.padding
    if not row.batched:
        padded = padded & (columns != own)
    cells[padded] = PADDING
    cells[columns > own] = FUTURE
    return cells


def cell_kinds(mask: StepMask, window: Locality, stride: int = 1) -> torch.Tensor:
    """The step's whole mask, packed queries x every row's key columns side by side: `[queries, keys]` cell kinds.

    A query sees its own row's block only (block-diagonal). `stride` > 1 keeps every stride-th query and key (only
    those cells are computed), for a picture of a step too large to draw cell by cell.
    """
    queries, keys = torch.arange(0, mask.queries, stride), torch.arange(0, mask.keys, stride)
    cells = torch.full((len(queries), len(keys)), OTHER_ROW, dtype=torch.int8)
    query = key = 0
    for row in mask.rows:
        # the sampled queries and keys of this row's block: a contiguous run of each
        top, bottom = -(-query // stride), -(-(query + row.queries) // stride)
        left, right = -(-key // stride), -(-(key + row.kv_len) // stride)
        if top < bottom and left < right:
            own = queries[top:bottom, None] - query + row.first_column
            cells[top:bottom, left:right] = _kinds(row, window, own, keys[None, left:right] - key)
        query += row.queries
        key += row.kv_len
    return cells
