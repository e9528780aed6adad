"""The KV cache: one preallocated tensor pair per layer, one row per running request, owned here and nowhere else.

Slot and row are different numbers on purpose. A request's *slot* is its place in the batch, fixed from
admission to release (what the page draws). Its *row* is where its keys and values sit in this cache: rows in
use are always the contiguous prefix `[0, active_rows)`, so attention reads a view of the cache, never a
gathered copy. Freeing a row moves the last row into the hole (the work is one request's keys and values), so
a request's row can change when another one finishes. Each row keeps its own length; columns that hold padding
are marked blocked and masked out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


@dataclass
class StepPlan:
    """Where this step's new keys and values go (one row and column per new token), set by the runner."""

    row_index: torch.Tensor  # [tokens]
    write_columns: torch.Tensor  # [tokens]


class SlotLayer(CacheLayerMixin):
    """One attention layer's keys and values for every slot: `[slots, kv_heads, max_len, head_dim]`."""

    keys: torch.Tensor  # allocated on the first forward pass, before any read
    values: torch.Tensor

    def __init__(self, owner: SlotKVCache) -> None:
        super().__init__()
        self.owner = owner

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        # Allocated on the first forward pass, on the device and dtype of this layer (accelerate may spread layers).
        shape = (self.owner.capacity, key_states.shape[1], self.owner.max_len, key_states.shape[3])
        self.keys = torch.zeros(shape, dtype=key_states.dtype, device=key_states.device)
        self.values = torch.zeros(
            (*shape[:3], value_states.shape[3]), dtype=value_states.dtype, device=value_states.device
        )
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        plan = self.owner.plan
        rows = plan.row_index.to(self.keys.device)
        columns = plan.write_columns.to(self.keys.device)
        # New states arrive packed, [1, kv_heads, tokens, dim]; [rows, :, columns] addresses [tokens, kv_heads, dim].
        self.keys[rows, :, columns] = key_states[0].transpose(0, 1).to(self.keys.dtype)
        self.values[rows, :, columns] = value_states[0].transpose(0, 1).to(self.values.dtype)
        # Attention picks each row's own view of these (see packed_attention): nothing is copied here.
        return self.keys, self.values

    def move_row(self, source: int, target: int, length: int) -> None:
        if self.is_initialized:
            self.keys[target, :, :length] = self.keys[source, :, :length]
            self.values[target, :, :length] = self.values[source, :, :length]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.max_len, 0

    def get_seq_length(self) -> int:
        if torch.compiler.is_compiling():
            # A compiled step (always a decode step) reads it from its own write columns, each row's length, as a
            # 0-d tensor as transformers' static cache does: a Python int would be guarded on, so every step would
            # re-trace (OPT asks for it in every forward, and uses it only without position ids).
            return self.owner.plan.write_columns.max()  # type: ignore[return-value]
        return max(self.owner.lengths[: self.owner.active_rows], default=0)

    def get_max_length(self) -> int:
        return self.owner.max_len


class SlotKVCache(Cache):
    """Keys and values of every running request, a row each, with each row's length and padding."""

    def __init__(self, num_layers: int, capacity: int, max_len: int, device: torch.device) -> None:
        self.capacity = capacity
        self.max_len = max_len
        self.device = device
        self.lengths: list[int] = [0] * capacity
        self.padding: list[int] = [0] * capacity
        self.blocked = torch.zeros((capacity, max_len), dtype=torch.bool, device=device)
        self.active_rows = 0
        self._row_of: dict[str, int] = {}
        self._owner_of: list[str | None] = [None] * capacity
        self.plan = StepPlan(row_index=torch.zeros(0, dtype=torch.long), write_columns=torch.zeros(0, dtype=torch.long))
        self.slot_layers = [SlotLayer(self) for _ in range(num_layers)]  # the same objects as `layers`, typed
        super().__init__(layers=list(self.slot_layers))

    def claim(self, request_id: str) -> int:
        """Give a request the next free row."""
        if request_id in self._row_of:
            raise ValueError(f"request {request_id!r} already holds cache row {self._row_of[request_id]}")
        if self.active_rows >= self.capacity:
            raise RuntimeError(f"all {self.capacity} cache rows are in use")
        row = self.active_rows
        self.active_rows += 1
        self._row_of[request_id] = row
        self._owner_of[row] = request_id
        self.lengths[row] = 0  # a free row's padding was cleared when it was released
        return row

    @torch.inference_mode()
    def release(self, request_id: str) -> None:
        """Free a request's row; the last row moves into the hole so rows in use stay contiguous."""
        row = self._row_of.pop(request_id)
        last = self.active_rows - 1
        if row != last:
            moved = self._owner_of[last]
            length = self.lengths[last]
            for layer in self.slot_layers:
                layer.move_row(last, row, length)
            self.lengths[row] = length
            if self.padding[last] or self.padding[row]:
                self.blocked[row] = self.blocked[last]
            self.padding[row] = self.padding[last]
            assert moved is not None, "every row below active_rows has an owner"
            self._owner_of[row] = moved
            self._row_of[moved] = row
        self._owner_of[last] = None
        self.lengths[last] = 0
        if self.padding[last]:
            self.blocked[last].zero_()
            self.padding[last] = 0
        self.active_rows -= 1

    def row_of(self, request_id: str) -> int:
        return self._row_of[request_id]

    def owner_of(self, row: int) -> str | None:
        return self._owner_of[row]

    def owners(self) -> list[str | None]:
        """The request in each row in use, in row order."""
        return self._owner_of[: self.active_rows]

    @torch.inference_mode()
    def mark_padding(self, row: int, columns: int) -> None:
        """The first `columns` positions of a row hold left padding: never attend to them."""
        self.blocked[row, :columns] = True
        self.padding[row] = columns

    def position_of_next(self, row: int) -> int:
        """The position id of the row's next token (padding does not count)."""
        return self.lengths[row] - self.padding[row]

    def request_view(self, request_id: str, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One request's cached keys and values in one layer (a view; for inspection and tests)."""
        row = self._row_of[request_id]
        cached = self.slot_layers[layer]
        return cached.keys[row, :, : self.lengths[row]], cached.values[row, :, : self.lengths[row]]

    @property
    def held_requests(self) -> tuple[str, ...]:
        return tuple(self._row_of)

    def storage_pointers(self) -> list[int]:
        """Addresses of every layer's tensors: they never change once allocated."""
        return [t.data_ptr() for layer in self.slot_layers if layer.is_initialized for t in (layer.keys, layer.values)]
