"""KV memory of a run, read from the `MemoryView` every `StepEvent` carries: the block pool by state, each request's
block table, positions holding tokens against positions reserved over the steps, preemptions and prefix hits.

Nothing here is re-derived from the schedule: it is what the engine's block pool reported after each step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from batching.engine.events import MemoryView
from batching.runs import RunRecord

SHARED = "shared by several requests"
IN_USE = "in use"
CACHED = "cached"
FREE = "free"
BLOCK_STATES = (SHARED, IN_USE, CACHED, FREE)  # legend order: the waffle fills in this order
POOL_COLUMNS = ["block", "row", "column", "state"]
TABLE_COLUMNS = ["request", "blocks", "shared", "table"]
STEP_COLUMNS = ["step", "kind", "positions"]
HOLDING = "positions holding tokens"
RESERVED = "positions reserved"
OTHERS = "other user"


def holding(view: MemoryView) -> int:
    """Positions of the pool holding a real token, each counted once (the engine counts a block several requests
    share after a prefix hit once, and leaves a static wave's padding out)."""
    return view.tokens


def unused(view: MemoryView) -> int:
    """Positions reserved (whole blocks held) with no token in them yet."""
    return max(0, view.reserved - holding(view))


def last_memory(run: RunRecord) -> MemoryView | None:
    """The pool after the run's latest step that reported one (None before any)."""
    for event in reversed(run.steps):
        if event.memory is not None:
            return event.memory
    return None


def peak_memory(run: RunRecord) -> MemoryView | None:
    """The pool after the step that held the most blocks (the first such step; None before any)."""
    views = [event.memory for event in run.steps if event.memory is not None]
    return max(views, key=lambda view: view.usage.in_use, default=None)


def pool_frame(view: MemoryView, columns: int = 16) -> pd.DataFrame:
    """One row per block of the pool, coloured by state, laid out as a waffle `columns` wide (row by row).

    Blocks are ordered by state (shared, in use, cached, free), not by id: the pool reports how many are cached
    or free, not which; the block tables say which ids each request holds.
    """
    usage = view.usage
    counts = {
        SHARED: usage.shared,
        IN_USE: usage.in_use - usage.shared,
        CACHED: usage.cached,
        FREE: usage.free,
    }
    states = [state for state in BLOCK_STATES for _ in range(max(0, counts[state]))]
    rows = [
        {"block": number, "row": number // columns, "column": number % columns, "state": state}
        for number, state in enumerate(states)
    ]
    return pd.DataFrame(rows, columns=POOL_COLUMNS)


def block_tables_frame(view: MemoryView, labels: Mapping[str, str]) -> pd.DataFrame:
    """One row per running request: its label, how many blocks it holds, how many of them another request holds
    too (a prefix hit), and its block table (block ids in order)."""
    holders = Counter(block for _, table in view.tables for block in table)
    rows = [
        {
            "request": labels.get(request_id, OTHERS),
            "blocks": len(table),
            "shared": sum(1 for block in table if holders[block] > 1),
            "table": " ".join(str(block) for block in table),
        }
        for request_id, table in view.tables
    ]
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def memory_steps_frame(run: RunRecord) -> pd.DataFrame:
    """Long form, two rows per step (numbered from 1): positions holding tokens (a shared block once), and
    positions reserved."""
    rows = []
    for number, event in enumerate(run.steps, start=1):
        if event.memory is None:
            continue
        rows.append({"step": number, "kind": HOLDING, "positions": holding(event.memory)})
        rows.append({"step": number, "kind": RESERVED, "positions": event.memory.reserved})
    return pd.DataFrame(rows, columns=STEP_COLUMNS)


@dataclass(frozen=True)
class MemoryNumbers:
    """A run's KV memory in a few figures, as of its latest step."""

    blocks: int  # the pool's size
    block_size: int
    in_use: int  # blocks held now
    peak_in_use: int  # most blocks held after any step
    preemptions: int
    prefix_queries: int  # prompt tokens looked up in the prefix cache
    prefix_hits: int  # of those, found cached
    state_bytes: int = 0  # a hybrid model's conv and SSM states held now, beside the blocks
    state_bytes_per_request: int = 0

    @property
    def hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    def line(self) -> str:
        """One line for the page."""
        return (
            f"{self.in_use} of {self.blocks} blocks held ({self.block_size} positions each; peak {self.peak_in_use})"
            f" · {self.preemptions} preemption{'s' if self.preemptions != 1 else ''}"
            f" · prefix hits {self.prefix_hits} of {self.prefix_queries} prompt tokens looked up" + self.states_line()
        )

    def states_line(self) -> str:
        """A hybrid model's states, which live beside the blocks (empty for attention-only models)."""
        if not self.state_bytes_per_request:
            return ""
        return (
            f" · conv/SSM states {self.state_bytes / 2**10:,.1f} KiB now ({self.state_bytes_per_request / 2**10:,.1f}"
            " KiB a running request, beside the blocks; no prefix caching: a state cannot be cut at a block)"
        )


def memory_numbers(run: RunRecord) -> MemoryNumbers | None:
    """The run's pool size, blocks held now and at peak, preemptions and prefix hits (None before any step)."""
    view = last_memory(run)
    if view is None:
        return None
    peak = max(event.memory.usage.in_use for event in run.steps if event.memory is not None)
    preemptions = max(view.preemptions, len(run.preempted))
    return MemoryNumbers(
        view.usage.total,
        view.block_size,
        view.usage.in_use,
        peak,
        preemptions,
        view.prefix_queries,
        view.prefix_hits,
        view.state_bytes,
        view.state_bytes_per_request,
    )
