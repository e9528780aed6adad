"""Inside the steps of a run: the token grid (slots x steps), one step's packed batch, and the waste meters.

Everything here is read from the rows each `StepEvent` carries (what the runner packed), never re-derived.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from batching.engine.events import RowKind, StepEvent, StepRow
from batching.runs import RunRecord
from utils.metrics import memory
from utils.metrics.run import percentile

IDLE = "idle"
OTHERS = "other user"
PADDING = "padding"
# What a cell of the grid shows, in legend order.
CELL_KINDS = (RowKind.PREFILL.value, RowKind.DECODE.value, RowKind.HELD.value, PADDING, RowKind.WAITING.value, IDLE)
GRID_COLUMNS = [
    "column",
    "first_step",
    "last_step",
    "slot",
    "kind",
    "request",
    "tokens",
    "padding",
    "positions",
    "mark",
]
# A cell's mark, beside its kind: tokens computed again after a preemption, or a first prompt chunk that starts
# after a prefix hit (the cached tokens before it were never computed).
NO_MARK = ""
RECOMPUTED = "recomputed (after a preemption)"
PREFIX_HIT = "after a prefix hit (cached tokens skipped)"
MARKS = (NO_MARK, RECOMPUTED, PREFIX_HIT)


def _cell_kind(tokens: int, padding: int, kind: RowKind) -> str:
    """A prefill row that computed only padding (a static wave member cancelled before its prefill) is padding."""
    if kind is RowKind.PREFILL and not tokens and padding:
        return PADDING
    return kind.value


def _positions(first: int, tokens: int) -> str:
    """ "7" for one token, "0–4" for five, "" for none."""
    if not tokens:
        return ""
    return str(first) if tokens == 1 else f"{first}–{first + tokens - 1}"


def _mark(row: StepRow, computed: dict[str, int]) -> str:
    """Whether a row's tokens are computed again (it starts before what its request already computed: it was
    preempted), or are its first and start past 0 (a prefix hit); `computed` is updated with the row."""
    if not row.tokens:
        return NO_MARK
    done = computed.get(row.request_id)
    computed[row.request_id] = max(done or 0, row.first_position + row.tokens)
    if done is None:
        return PREFIX_HIT if row.kind is RowKind.PREFILL and row.first_position > 0 else NO_MARK
    return RECOMPUTED if row.first_position < done else NO_MARK


def grid_frame(run: RunRecord, labels: Mapping[str, str], max_columns: int = 600) -> tuple[pd.DataFrame, int]:
    """One cell per slot per step (or per group of `width` steps when a run has more steps than `max_columns`).

    A cell's `mark` says when its tokens were computed again after a preemption, or start after a prefix hit.
    Returns the frame and the group width (1: every step has its own column). A grouped cell shows the kind
    its slot had most often in the group, and the sums of its tokens and padding.
    """
    steps = run.steps
    width = max(1, math.ceil(len(steps) / max_columns)) if steps else 1
    cells: dict[tuple[int, int], dict] = {}
    counts: dict[tuple[int, int], dict[str, int]] = {}
    computed: dict[str, int] = {}  # each request's positions computed so far (the next one's index)
    for number, event in enumerate(steps):  # numbered from 0 within this run (the shared engine's own count differs)
        column = number // width
        by_slot = {row.slot: row for row in event.rows}
        for slot in range(len(event.slots)):
            key = (column, slot)
            row = by_slot.get(slot)
            mark = NO_MARK
            if row is None:
                kind, request, tokens, padding, positions = IDLE, "", 0, 0, ""
            else:
                mark = _mark(row, computed)
                kind = _cell_kind(row.tokens, row.padding, row.kind)
                request = labels.get(row.request_id, OTHERS)
                tokens, padding = row.tokens, row.padding
                positions = _positions(row.first_position, row.tokens)
            cell = cells.setdefault(
                key,
                {"column": column, "first_step": number, "slot": slot + 1, "tokens": 0, "padding": 0, "mark": NO_MARK},
            )
            if mark != NO_MARK and cell["mark"] == NO_MARK:
                cell["mark"] = mark
            cell["last_step"] = number
            cell["tokens"] += tokens
            cell["padding"] += padding
            tally = counts.setdefault(key, {})
            tally[kind] = tally.get(kind, 0) + 1
            if tally[kind] >= max(tally.values()):
                cell.update(kind=kind, request=request, positions=positions if width == 1 else "")
    frame = pd.DataFrame(list(cells.values()), columns=GRID_COLUMNS)
    return frame.sort_values(["column", "slot"]).reset_index(drop=True), width


@dataclass(frozen=True)
class WasteMeters:
    """How much of what a run computed was useful work."""

    steps: int
    slot_steps: int  # slots x steps: what was available
    slot_steps_used: int  # a slot did prompt or decode work for a live request
    slot_steps_held: int  # a finished request sat in its slot (static waves), computing padding
    padding_tokens: int  # tokens computed for nothing: left padding of static prefills, held slots' tokens
    tokens_per_step_mean: float  # prompt + decode tokens a step computed (vLLM's iteration tokens)
    tokens_per_step_max: int
    budget_fill_mean: float  # tokens per step / the scheduler's token budget, 0 to 1
    budget_fill_p50: float
    budget_fill_p90: float
    # KV positions reserved (whole blocks held) but holding no token, summed over steps (position-steps)
    kv_reserved_unused: int = 0
    kv_reserved: int = 0  # KV positions reserved, summed over steps (position-steps)

    @property
    def slot_use(self) -> float:
        return self.slot_steps_used / self.slot_steps if self.slot_steps else math.nan

    @property
    def kv_unused_share(self) -> float:
        """Of the KV positions reserved over the run (summed over steps), the share that never held a token."""
        return self.kv_reserved_unused / self.kv_reserved if self.kv_reserved else math.nan

    def as_dict(self) -> dict[str, float]:
        return {**self.__dict__, "slot_use": self.slot_use, "kv_unused_share": self.kv_unused_share}


def waste_meters(run: RunRecord) -> WasteMeters:
    """Add up what every step's rows computed, and the KV positions its pool reserved without a token in them."""
    used = held = padding = reserved = unused = 0
    per_step: list[int] = []
    fills: list[float] = []
    for event in run.steps:
        tokens = 0
        for row in event.rows:
            padding += row.padding
            tokens += row.tokens
            if row.kind is RowKind.HELD:
                held += 1
            elif row.tokens:
                used += 1
        per_step.append(tokens)
        if event.memory is not None:
            reserved += event.memory.reserved
            unused += memory.unused(event.memory)
        if event.token_budget:
            fills.append(tokens / event.token_budget)
    slots = sum(len(event.slots) for event in run.steps)
    return WasteMeters(
        steps=len(run.steps),
        slot_steps=slots,
        slot_steps_used=used,
        slot_steps_held=held,
        padding_tokens=padding,
        tokens_per_step_mean=sum(per_step) / len(per_step) if per_step else math.nan,
        tokens_per_step_max=max(per_step, default=0),
        budget_fill_mean=sum(fills) / len(fills) if fills else math.nan,
        budget_fill_p50=percentile(fills, 50),
        budget_fill_p90=percentile(fills, 90),
        kv_reserved_unused=unused,
        kv_reserved=reserved,
    )


def step_rows_frame(step: StepEvent, labels: Mapping[str, str]) -> pd.DataFrame:
    """The rows of one forward pass, in packed order: request, slot, what it did, tokens and their positions."""
    rows = []
    start = 0
    for row in step.rows:
        size = row.padding + row.tokens
        rows.append(
            {
                "request": labels.get(row.request_id, OTHERS),
                "slot": row.slot + 1,
                "kind": _cell_kind(row.tokens, row.padding, row.kind),
                "tokens": row.tokens,
                "padding": row.padding,
                "positions": _positions(row.first_position, row.tokens),
                "packed": f"{start}–{start + size - 1}" if size else "",
            }
        )
        start += size
    return pd.DataFrame(rows, columns=["request", "slot", "kind", "tokens", "padding", "positions", "packed"])


def step_waiting_frame(step: StepEvent, labels: Mapping[str, str]) -> pd.DataFrame:
    """The requests that computed nothing in one step, and why (a preempted one with its tokens to compute again)."""
    rows = [
        {
            "request": labels.get(waiting.request_id, OTHERS),
            "why it waited": waiting.reason.value,
            "tokens to compute again": waiting.recompute or None,
        }
        for waiting in step.waiting
    ]
    return pd.DataFrame(rows, columns=["request", "why it waited", "tokens to compute again"])


def packed_tokens(
    step: StepEvent, labels: Mapping[str, str], decode: Callable[[Sequence[int]], str]
) -> list[tuple[str, str]]:
    """The packed sequence the linear layers saw, as (request label, token text) pairs; padding shown as "␣pad".

    Only requests in `labels` (the reader's own) show their text; other users' tokens are counted as "•".
    """
    sequence = []
    for row in step.rows:
        label = labels.get(row.request_id, OTHERS)
        sequence += [(label, "␣pad")] * row.padding
        if row.request_id in labels:
            sequence += [(label, decode([token])) for token in row.token_ids]
        else:  # another user's request on the shared engine: its place in the batch, never its text
            sequence += [(label, "•")] * row.tokens
    return sequence
