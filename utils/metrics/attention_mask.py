"""One step's attention mask as a frame to draw, and a static wave's padded rectangle at that step.

The mask is expanded from the description the runner recorded for the step (`StepEvent.mask`), so the page draws
the plan attention received, never a mask re-derived here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from batching.engine.attention import Chunk, Locality
from batching.engine.events import StepEvent
from batching.engine.mask_view import CELL_NAMES, StepMask, cell_kinds
from batching.runs import RunRecord
from utils.metrics.inspector import OTHERS

MASK_CELL_LIMIT = 20_000  # cells drawn at most; a larger step is drawn at one in `stride` queries and keys
MASK_COLUMNS = ["query", "key", "kind", "query_token", "key_column"]


def mask_stride(mask: StepMask, limit: int = MASK_CELL_LIMIT) -> int:
    """The smallest stride whose sampled queries x keys fit in `limit` cells."""
    stride = 1
    while math.ceil(mask.queries / stride) * math.ceil(mask.keys / stride) > limit:
        stride += 1
    return stride


def window_name(window: Locality) -> str:
    if isinstance(window, Chunk):
        return f"chunked attention {window.size}"
    return "full attention" if window is None else f"sliding window {window}"


def mask_frame(
    step: StepEvent, labels: Mapping[str, str], window: Locality, limit: int = MASK_CELL_LIMIT
) -> tuple[pd.DataFrame, int]:
    """One cell per (packed query, key column) of the step's mask for layers with `window`; returns the stride.

    Queries are labelled by request and position (or padding), keys by request and cache column, grouped row by
    row, so a packed step shows its block diagonal. Empty when the step carries no mask.
    """
    mask = step.mask
    if mask is None or not mask.rows:
        return pd.DataFrame(columns=MASK_COLUMNS), 1
    stride = mask_stride(mask, limit)
    owners = [labels.get(row.request_id, OTHERS) for row in step.rows if row.tokens + row.padding]
    query_names: list[str] = []
    key_names: list[str] = []
    for owner, row in zip(owners, mask.rows, strict=True):
        for column in range(row.first_column, row.first_column + row.queries):
            shown = "padding" if column < row.padding else f"position {column - row.padding}"
            query_names.append(f"{owner} · {shown}")
        key_names += [f"{owner} · column {column}" for column in range(row.kv_len)]
    cells = cell_kinds(mask, window, stride).numpy()
    queries, keys = cells.shape
    query_index = np.repeat(np.arange(queries), keys)
    key_index = np.tile(np.arange(keys), queries)
    frame = pd.DataFrame(
        {
            "query": query_index,
            "key": key_index,
            "kind": np.array(CELL_NAMES, dtype=object)[cells.ravel()],
            "query_token": np.array(query_names, dtype=object)[query_index * stride],
            "key_column": np.array(key_names, dtype=object)[key_index * stride],
        },
        columns=MASK_COLUMNS,
    )
    return frame, stride


@dataclass(frozen=True)
class PaddedRectangle:
    """A static wave's batch as a rectangle after one step: every row as long as the longest (left padding, and the
    padding tokens finished members computed while holding their slot)."""

    rows: int
    columns: int
    padding: int

    @property
    def cells(self) -> int:
        return self.rows * self.columns

    @property
    def padding_share(self) -> float:
        return self.padding / self.cells if self.cells else math.nan


def padded_rectangle(run: RunRecord, number: int) -> PaddedRectangle | None:
    """The rectangle of the wave at step `number` (0-based in the run); None without a mask for that step.

    Real cells are the tokens each row's request added in every step up to this one; the rest is padding.
    """
    step = run.steps[number]
    if step.mask is None or not step.mask.rows:
        return None
    members = {row.request_id for row in step.rows}
    real = sum(row.tokens for event in run.steps[: number + 1] for row in event.rows if row.request_id in members)
    columns = max(row.first_column + row.queries for row in step.mask.rows)
    return PaddedRectangle(len(step.rows), columns, len(step.rows) * columns - real)
