"""The KV cache: every layer's keys and values in blocks, read and written through the block pool's tables.

Each attention layer holds one tensor pair shaped `[kv_heads, blocks + 1, block_size, head_dim]`; block `b` of
the pool (`blocks.BlockPool`) is `b` in every layer, and the extra last block is scratch: the rows a compiled step
pads with write there, and table entries past a row's blocks point there (masked out). A step's new keys and
values are written at their *slots* (`block * block_size + offset`), and attention gathers each row's blocks in
table order (`gather_blocks`), so a request's memory grows a block at a time wherever blocks are free.

Slot and row are different numbers on purpose. A request's *slot* is its place in the batch, fixed from
admission to release (what the page draws). Its *row* is its place in a step's packed batch: rows in use are the
contiguous prefix `[0, active_rows)`; freeing a row moves the last row's bookkeeping (its length and padding, a
few integers) into the hole, never its keys and values. Columns are positions in a row's own sequence, left
padding (a static wave's) included: the first `padding[row]` columns are padding, masked out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from batching.engine.blocks import BlockPool
from batching.engine.model_support import LayerKV
from batching.engine.recurrent import RecurrentLayout, RecurrentStates


@dataclass
class StepPlan:
    """Where this step's new keys and values go (one slot per new token) and which blocks each row reads, set by
    the runner."""

    slots: torch.Tensor  # [tokens]: block * block_size + offset
    write_columns: torch.Tensor  # [tokens]: each token's column in its own row
    tables: torch.Tensor  # [rows, blocks]: each row's blocks in order, as many as the step's longest row needs
    # Attention reads the pools through the tables (`paged_decode`): no gathered copy. Its tables are then the
    # attention plan's, one per query row (with prompt chunks, one per token).
    paged: bool = False


def gather_blocks(pool: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """Rows' blocks in table order: `[kv_heads, blocks, size, dim]` by `[rows, n]` -> `[kv_heads, rows, n * size,
    dim]` (one copy; the rows' columns then lie contiguous, as attention's batched matmuls want them)."""
    heads, _, size, dim = pool.shape
    rows, count = tables.shape
    return pool.index_select(1, tables.reshape(-1)).view(heads, rows, count * size, dim)


class PagedLayer(CacheLayerMixin):
    """One attention layer's keys and values for the whole pool, plus the scratch block."""

    keys: torch.Tensor  # allocated on the first forward pass, before any read
    values: torch.Tensor

    def __init__(self, owner: PagedKVCache) -> None:
        super().__init__()
        self.owner = owner

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        # Allocated on the first forward pass, on the device and dtype of this layer (accelerate may spread layers).
        shape = (key_states.shape[1], self.owner.pool.num_blocks + 1, self.owner.pool.block_size)
        self.keys = torch.zeros((*shape, key_states.shape[3]), dtype=key_states.dtype, device=key_states.device)
        self.values = torch.zeros((*shape, value_states.shape[3]), dtype=value_states.dtype, device=value_states.device)
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        slots = self.owner.plan.slots.to(self.keys.device)
        heads, blocks, size = self.keys.shape[:3]
        # New states arrive packed, [1, kv_heads, tokens, dim]: token i goes to slot slots[i] of every head.
        self.keys.view(heads, blocks * size, -1)[:, slots] = key_states[0].to(self.keys.dtype)
        self.values.view(heads, blocks * size, -1)[:, slots] = value_states[0].to(self.values.dtype)
        if self.owner.plan.paged:  # a step read through the tables (`paged_decode`): the pools themselves
            return self.keys, self.values
        # Each row's blocks gathered in order: `[rows, kv_heads, blocks * size, dim]`, what a batch cache returns, so
        # models that transform what the cache gives back (MLA expands its latents) work unchanged. A view of a
        # heads-first copy: attention's batched matmuls take it heads-first without copying again.
        tables = self.owner.plan.tables.to(self.keys.device)
        return gather_blocks(self.keys, tables).transpose(0, 1), gather_blocks(self.values, tables).transpose(0, 1)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.max_len, 0

    def get_seq_length(self) -> int:
        if torch.compiler.is_compiling():
            # A compiled step reads it from its own write columns (a decode step's: each row's length), as a
            # 0-d tensor as transformers' static cache does: a Python int would be guarded on, so every step would
            # re-trace (OPT asks for it in every forward, and uses it only without position ids).
            return self.owner.plan.write_columns.max()  # type: ignore[return-value]
        return max(self.owner.lengths[: self.owner.active_rows], default=0)

    def get_max_length(self) -> int:
        return self.owner.max_len


class PagedKVCache(Cache):
    """Keys and values of every running request in the pool's blocks, with each row's length and padding."""

    def __init__(
        self,
        num_layers: int,
        capacity: int,
        max_len: int,
        pool: BlockPool,
        device: torch.device,
        layout: RecurrentLayout | None = None,
    ) -> None:
        self.capacity = capacity
        self.max_len = max_len
        self.pool = pool
        self.device = device
        self.scratch_block = pool.num_blocks  # the block past the pool's: written by padding rows, never read
        self.lengths: list[int] = [0] * capacity
        self.padding: list[int] = [0] * capacity
        self.active_rows = 0
        self._row_of: dict[str, int] = {}
        self._owner_of: list[str | None] = [None] * capacity
        empty = torch.zeros(0, dtype=torch.long)
        self.plan = StepPlan(slots=empty, write_columns=empty, tables=empty.view(0, 0))
        # The step's attention plan and position ids, for attention classes the model passes neither down to
        # (Falcon's, Llama 4's temperature-tuned layers: `routed_attention`); the runner sets them with each step.
        self.attention_plan: object = None
        self.position_ids: torch.Tensor | None = None
        self.paged_layers = [PagedLayer(self) for _ in range(num_layers)]  # the same objects as `layers`, typed
        super().__init__(layers=list(self.paged_layers))
        # A hybrid model's per-request states, one row per cache row (None: keys and values are all it keeps).
        self.recurrent_states = RecurrentStates(layout, capacity, device) if layout is not None else None

    # --- rows ---------------------------------------------------------------------------------------------
    def claim(self, request_id: str, computed: int = 0) -> int:
        """Give a request the next free row; its first `computed` columns are there already (a prefix hit's blocks,
        which the pool's table for it lists)."""
        if request_id in self._row_of:
            raise ValueError(f"request {request_id!r} already holds cache row {self._row_of[request_id]}")
        if self.active_rows >= self.capacity:
            raise RuntimeError(f"all {self.capacity} cache rows are in use")
        row = self.active_rows
        self.active_rows += 1
        self._row_of[request_id] = row
        self._owner_of[row] = request_id
        self.lengths[row] = computed
        self.padding[row] = 0
        if self.recurrent_states is not None:
            self.recurrent_states.zero_row(row)
        return row

    def release(self, request_id: str) -> None:
        """Free a request's row and blocks; the last row's bookkeeping moves into the hole (no keys move)."""
        row = self._row_of.pop(request_id)
        self.pool.free(request_id)
        last = self.active_rows - 1
        if row != last:
            moved = self._owner_of[last]
            assert moved is not None, "every row below active_rows has an owner"
            self.lengths[row], self.padding[row] = self.lengths[last], self.padding[last]
            if self.recurrent_states is not None:
                self.recurrent_states.move_row(last, row)
            self._owner_of[row] = moved
            self._row_of[moved] = row
        self._owner_of[last] = None
        self.lengths[last] = self.padding[last] = 0
        self.active_rows -= 1

    def row_of(self, request_id: str) -> int:
        return self._row_of[request_id]

    def owner_of(self, row: int) -> str | None:
        return self._owner_of[row]

    def owners(self) -> list[str | None]:
        """The request in each row in use, in row order."""
        return self._owner_of[: self.active_rows]

    @property
    def held_requests(self) -> tuple[str, ...]:
        return tuple(self._row_of)

    def mark_padding(self, row: int, columns: int) -> None:
        """The first `columns` positions of a row hold left padding: never attend to them."""
        self.padding[row] = columns

    def position_of_next(self, row: int) -> int:
        """The position id of the row's next token (padding does not count)."""
        return self.lengths[row] - self.padding[row]

    # --- blocks ---------------------------------------------------------------------------------------------
    def slots(self, row: int, start: int, count: int) -> list[int]:
        """The pool slots of columns `[start, start + count)` of a row, taking blocks it lacks (the scheduler took
        them already in a batcher's step; a runner driven directly takes them here)."""
        owner = self._owner_of[row]
        if owner is None or not self.pool.grow(owner, start + count):
            raise ValueError(f"row {row} needs blocks for {start + count} tokens; the pool has too few left")
        table, size = self.pool.tables[owner], self.pool.block_size
        return [table[column // size] * size + column % size for column in range(start, start + count)]

    def tables(self, rows: int, blocks: int) -> list[list[int]]:
        """The first `blocks` entries of rows `[0, rows)`' tables, the scratch block past a table's end (and for
        rows in a padded step that no request holds)."""
        return self.tables_of([row if row < self.active_rows else None for row in range(rows)], blocks)

    def tables_of(self, rows: Sequence[int | None], blocks: int) -> list[list[int]]:
        """The first `blocks` entries of these rows' tables in this order; None: a padding row (the scratch block)."""
        tables = []
        for row in rows:
            owner = self._owner_of[row] if row is not None else None
            table = self.pool.tables.get(owner, [])[:blocks] if owner is not None else []
            tables.append(table + [self.scratch_block] * (blocks - len(table)))
        return tables

    def request_view(self, request_id: str, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One request's cached keys and values in one layer, `[kv_heads, length, dim]` (a copy; for inspection)."""
        row = self._row_of[request_id]
        cached = self.paged_layers[layer]
        length = self.lengths[row]
        blocks = self.pool.blocks_for(length)
        tables = torch.tensor(self.tables(row + 1, blocks)[row : row + 1], device=cached.keys.device)
        return (
            gather_blocks(cached.keys, tables)[:, 0, :length],
            gather_blocks(cached.values, tables)[:, 0, :length],
        )

    # --- a hybrid model's states: transformers' cache methods, answered for the mixer call now running -----------
    def _states(self) -> RecurrentStates:
        if self.recurrent_states is None:
            raise ValueError("this model keeps no conv or recurrent state")
        return self.recurrent_states

    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        return self._states().get_conv(layer_idx, state_idx)

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        return self._states().get_recurrent(layer_idx, state_idx)

    def update_conv_state(
        self, conv_states: torch.Tensor, layer_idx: int, state_idx: int = 0, **kwargs: object
    ) -> torch.Tensor:
        return self._states().update_conv(layer_idx, state_idx, conv_states)

    def update_recurrent_state(
        self, recurrent_states: torch.Tensor, layer_idx: int, state_idx: int = 0, **kwargs: object
    ) -> torch.Tensor:
        return self._states().update_recurrent(layer_idx, state_idx, recurrent_states)

    def has_previous_state(self, layer_idx: int | None = None, state_idx: int | None = None) -> bool:
        states = self._states()
        return states.has_previous(layer_idx if layer_idx is not None else states.layout.layers[-1].layer)

    def is_recording_past(self, layer_idx: int) -> bool:
        return False

    def allocate(self, layers: Sequence[LayerKV], dtype: torch.dtype) -> None:
        """These layers' pools now, on the cache's device, rather than on the first forward pass (each its own head
        count and sizes; a layer not listed writes no keys and values and holds no pool)."""
        for shape in layers:
            layer = self.paged_layers[shape.layer]
            if not layer.is_initialized:
                keys = torch.empty((1, shape.kv_heads, 0, shape.key_dim), dtype=dtype, device=self.device)
                values = torch.empty((1, shape.kv_heads, 0, shape.value_dim), dtype=dtype, device=self.device)
                layer.lazy_initialization(keys, values)

    def initialized_layers(self) -> list[PagedLayer]:
        """The layers holding keys and values (a hybrid model's recurrent layers never allocate theirs)."""
        return [layer for layer in self.paged_layers if layer.is_initialized]

    def pools(self) -> list[torch.Tensor]:
        """Every allocated layer's key and value pools, in layer order."""
        return [tensor for layer in self.initialized_layers() for tensor in (layer.keys, layer.values)]

    def storage_pointers(self) -> list[int]:
        """Addresses of every layer's tensors and states: they never change once allocated."""
        states = self.recurrent_states.tensors() if self.recurrent_states is not None else []
        return [t.data_ptr() for t in self.pools()] + [t.data_ptr() for t in states]
