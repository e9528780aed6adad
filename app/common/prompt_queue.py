"""The page's prompt queue: the canonical list of prompts and caps (the data editor only shows it). Every change is
validated first; plain Python, so it is tested without Streamlit.
"""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeGuard

import pandas as pd

# Raises ValueError with a clear message when a prompt (with its cap) cannot run on the model.
Check = Callable[[str, int], None]


class QueueError(ValueError):
    """Bad queue input; the message is one line saying what is wrong and what is allowed."""


@dataclass(frozen=True)
class QueueItem:
    item_id: int
    prompt: str
    max_new_tokens: int


class PromptQueue:
    """Prompts waiting to be generated, with their max-new-token caps. Every change is validated first."""

    def __init__(self, max_items: int, max_cap: int) -> None:
        self.max_items = max_items
        self.max_cap = max_cap
        self.items: list[QueueItem] = []
        self._ids = itertools.count(1)
        # The table shown for the queue: its editor's change set counts rows of that table, so a whole new queue, or
        # edits once applied, need a table drawn afresh (under a new key, from this version).
        self.table_version = 0
        self._table_lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.items)

    def check_cap(self, cap: object) -> int:
        """The cap as a whole number in range, or a QueueError. Text (the cap box, the table) must be digits only:
        `2.5`, `-7`, `1e3` or an empty cell are refused as typed, never rounded, truncated or skipped."""
        allowed = f"a whole number from 1 to {self.max_cap}"
        if cap is None or (isinstance(cap, str) and not cap.strip()):
            raise QueueError(f"max new tokens is empty: type {allowed}")
        if isinstance(cap, str):
            typed = cap.strip()
            if not _DIGITS.fullmatch(typed):
                raise QueueError(f"max new tokens must be {allowed}, not {_as_typed(typed)}")
            cap = int(typed)
        elif isinstance(cap, float) and cap.is_integer():
            cap = int(cap)
        if isinstance(cap, bool) or not isinstance(cap, int) or not 1 <= cap <= self.max_cap:
            raise QueueError(f"max new tokens must be {allowed}, not {cap!r}")
        return cap

    def _checked(self, prompt: object, cap: object, check: Check | None) -> tuple[str, int]:
        if not isinstance(prompt, str) or not prompt.strip():
            raise QueueError("the prompt is empty: type a question first")
        cap = self.check_cap(cap)
        if check is not None:
            try:
                check(prompt, cap)
            except ValueError as exc:
                raise QueueError(str(exc)) from None
        return prompt.strip(), cap

    def _room_for(self, count: int) -> None:
        if len(self.items) + count > self.max_items:
            raise QueueError(
                f"the queue holds at most {self.max_items} prompts (BATCHSCOPE_LIMITS__MAX_QUEUE_PER_SESSION) and "
                f"has {len(self.items)}: remove some before adding {count}"
            )

    def add(self, prompt: object, cap: object, check: Check | None = None) -> QueueItem:
        prompt, cap = self._checked(prompt, cap, check)
        self._room_for(1)
        item = QueueItem(next(self._ids), prompt, cap)
        self.items.append(item)
        return item

    def replace_all(self, pairs: Iterable[tuple[str, int]], check: Check | None = None) -> None:
        """Swap the whole queue for `pairs` (an example workload); nothing changes if any pair is bad."""
        pairs = list(pairs)
        checked = []
        for number, (prompt, cap) in enumerate(pairs, start=1):
            try:
                checked.append(self._checked(prompt, cap, check))
            except QueueError as exc:
                raise QueueError(f"prompt {number}: {exc}") from None
        if len(checked) > self.max_items:
            raise QueueError(
                f"that example has {len(checked)} prompts, more than the {self.max_items} the queue holds "
                "(BATCHSCOPE_LIMITS__MAX_QUEUE_PER_SESSION)"
            )
        with self._table_lock:
            self.items = [QueueItem(next(self._ids), prompt, cap) for prompt, cap in checked]
            self.table_version += 1

    def clear(self) -> None:
        with self._table_lock:
            self.items = []
            self.table_version += 1

    def apply_table_edits(self, version: int, delta: Mapping, check: Check | None = None) -> list[str] | None:
        """The change set of the table drawn at `version`, applied once: the table is then drawn afresh at the next
        version. Returns a message per refused edit, or None if that table's edits were applied already (with
        Streamlit's fast reruns, a script run still going and the one a click started can both find them; applied
        twice, a deleted row would take its neighbour with it)."""
        with self._table_lock:
            if version != self.table_version:
                return None
            self.table_version += 1
            return self.apply_edits(delta, check)

    def apply_edits(self, delta: Mapping, check: Check | None = None) -> list[str]:
        """Apply a data editor's change set (edited caps, deleted rows); returns a message per refused edit.

        Row numbers in the change set are positions in the table as it was shown, i.e. in `items` now; messages
        name a row by the table's index, which counts from 1 (see `editor_frame`).
        """
        problems = []
        items = list(self.items)
        for row, changes in (delta.get("edited_rows") or {}).items():
            row = int(row)
            if not 0 <= row < len(items) or "max_new_tokens" not in changes:
                continue
            item = items[row]
            try:
                _, cap = self._checked(item.prompt, changes["max_new_tokens"], check)
            except QueueError as exc:
                problems.append(f"row {row + 1}: {exc}")
                continue
            items[row] = QueueItem(item.item_id, item.prompt, cap)
        deleted = {int(row) for row in delta.get("deleted_rows") or ()}
        self.items = [item for row, item in enumerate(items) if row not in deleted]
        return problems

    def frame(self) -> pd.DataFrame:
        """One row per prompt: its text and cap."""
        return pd.DataFrame(
            {"prompt": [i.prompt for i in self.items], "max_new_tokens": [i.max_new_tokens for i in self.items]},
            columns=["prompt", "max_new_tokens"],
        )

    def editor_frame(self) -> pd.DataFrame:
        """What the data editor shows: rows indexed from 1 (as messages and answer cards number them), caps as
        text, so what a person types reaches `apply_edits` unchanged (a number cell would reshape it first)."""
        frame = self.frame()
        frame["max_new_tokens"] = frame["max_new_tokens"].astype(str)
        frame.index = pd.RangeIndex(1, len(frame) + 1)
        return frame


_DIGITS = re.compile(r"[0-9]+")
_NUMBER_LIKE = re.compile(r"[0-9eE.+\- ]{1,24}")


def _as_typed(text: str) -> str:
    """How a refused cap is echoed: number-like text as typed; anything else is not repeated (it is user text)."""
    return repr(text) if _NUMBER_LIKE.fullmatch(text) else "that text"


def has_edits(delta: object) -> TypeGuard[Mapping]:
    """Whether a data editor's change set holds anything to apply."""
    return isinstance(delta, Mapping) and bool(delta.get("edited_rows") or delta.get("deleted_rows"))
