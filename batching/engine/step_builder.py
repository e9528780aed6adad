"""What a step computes: the rows' new tokens turned into one forward call's `StepInputs`, one builder per step kind.

- **decode**: every row decodes one token; compiled, rows and columns padded to the graph's bucket.
- **mixed, eager**: prompt chunks beside decode rows, packed with no padding; attention either gathers each row's
  blocks (`gathered`) or reads the pools through the tables, one query row per token (`through_tables`).
- **mixed, compiled**: the same step laid out for the prompt graph: two padded groups of whole rows (`grouped`), or
  through the tables with the columns rounded up to the graph's step.

How a built step is called (eager, through the graphs, or their graph called directly) is `step_call`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy
import torch
from transformers import PreTrainedModel

from batching.engine.attention import ChunkPlan, GroupedPlan, PackedPlan, QueryGroup, RowMask
from batching.engine.kv_cache import PagedKVCache, StepPlan
from batching.engine.mask_view import StepMask, describe_rows, describe_step, layer_windows
from batching.engine.recurrent import StateGroup, StatePlan
from batching.engine.step_inputs import Dims, PackedStep, StepInputs


class StepBuilder:
    """Builds each step kind's forward call over one cache; knows nothing of how the call runs."""

    def __init__(
        self,
        model: PreTrainedModel,
        cache: PagedKVCache,
        max_len: int,
        max_position: int,
        pad_token_id: int,
        recurrent_layers: int,
    ) -> None:
        self.cache = cache
        self.device = model.device
        self.dtype = model.dtype
        self.max_len = max_len
        self.max_position = max_position
        self.pad_token_id = pad_token_id
        self.windows = layer_windows(model)
        self.recurrent_layers = recurrent_layers
        self.describe = False  # the batcher turns it on with step detail: each step's `StepInputs.mask`

    def _tensor(self, values: Any) -> torch.Tensor:
        """Indices (ints, nested lists of them) as an int64 tensor. On a CPU through numpy: a quarter of
        `torch.tensor`'s cost on a list, and a decode step makes six of them."""
        if self.device.type == "cpu":
            return torch.from_numpy(numpy.array(values, dtype=numpy.int64))
        return torch.tensor(values, dtype=torch.int64, device=self.device)

    def pack(self, row_tokens: Sequence[list[int]]) -> PackedStep:
        """Every row's new tokens in one sequence, with where each goes in the cache."""
        cache = self.cache
        packed = PackedStep()
        for row, tokens in enumerate(row_tokens):
            start, count = cache.lengths[row], len(tokens)
            if start + count > self.max_len:
                raise ValueError(f"row {row} would hold {start + count} tokens; the cache holds {self.max_len}")
            position = cache.position_of_next(row)
            packed_start = len(packed.input_ids)
            packed.input_ids.extend(tokens)
            packed.positions.extend(min(max(0, position + j), self.max_position) for j in range(count))
            packed.write_slots.extend(cache.slots(row, start, count))
            packed.write_columns.extend(range(start, start + count))
            packed.last_token.append(max(packed_start + count - 1, 0))
            if count == 1:
                packed.singles.append((row, packed_start))
            elif count > 1:
                packed.chunks.append((row, packed_start, packed_start + count))
        if not packed.input_ids:
            raise ValueError("no row has a new token this step")
        return packed

    def reach(self, packed: PackedStep) -> int:
        """The most columns any row holds once this step's tokens are written."""
        lengths = self.cache.lengths
        singles = [lengths[row] + 1 for row, _ in packed.singles]
        return max(singles + [lengths[row] + end - start for row, start, end in packed.chunks])

    # --- decode ---------------------------------------------------------------------------------------------------
    def decode_values(
        self, tokens: list[int], positions: list[int], slots: list[int], padded_rows: int, padded_len: int
    ) -> list[list[Any]]:
        """A decode step's inputs as nested lists, padded to `padded_rows` rows reading `padded_len` columns (the
        padding rows write to the scratch block and read it alone): input ids, position ids, write slots, write
        columns, tables, first columns. A captured CUDA graph takes these as they are (`cuda_graphs`)."""
        cache, rows = self.cache, len(tokens)
        pad = padded_rows - rows
        return [
            [tokens + [self.pad_token_id] * pad],
            [positions + [0] * pad],
            slots + [cache.scratch_block * cache.pool.block_size] * pad,
            cache.lengths[:rows] + [0] * pad,
            cache.tables(padded_rows, cache.pool.blocks_for(padded_len)),
            cache.padding[:rows] + [0] * pad,
        ]

    def decode(
        self, values: list[list[Any]], rows: int, paged: bool, trace: bool = False
    ) -> tuple[StepInputs, list[torch.Tensor]]:
        """A decode step from `decode_values`, and the tensors made of them (a CUDA graph's capture copies into
        them). With `trace` (the step that makes the graph) its sizes to keep symbolic: blocks, and rows too with
        more than two slots (with two or fewer every compiled step has all of them: one row is padded to two)."""
        cache = self.cache
        sources = [self._tensor(value) for value in values]
        input_ids, position_ids, write_slots, write_columns, tables, first = sources
        mask = RowMask(write_columns[:, None, None, None], first[:, None, None, None], self.dtype)
        kv_len = tables.shape[1] * cache.pool.block_size
        plan = PackedPlan(tables.shape[0], None, None, mask, [], kv_len, tables if paged else None)
        dynamic: Dims = []
        maybe: Dims = []
        if trace:  # any pool size: the scratch pool is smaller than a batcher's
            dynamic = [(tables, 1), *((pool, 1) for pool in cache.pools())]
        if trace and cache.capacity > 2:
            # Rows may be specialised after all: a hybrid's mixers take rows as their batch, and inductor's linear
            # fusion compares the batch with the sizes of a parameter added to a projection (Qwen3.5's dt_bias: its
            # head count), which guards the count off that size, or on it when they are equal while tracing. The
            # warm-up then makes a graph for every count the first graph refuses (`warmup.warm_decode`).
            by_row = [(input_ids, 1), (position_ids, 1), (write_slots, 0), (write_columns, 0), (tables, 0)]
            maybe = [*by_row, (mask.query_columns, 0), (mask.first_columns, 0)]
        inputs = StepInputs(
            input_ids,
            position_ids,
            0,
            StepPlan(slots=write_slots, write_columns=write_columns, tables=tables, paged=paged),
            plan,
            rows,
            state_plan=StatePlan(None),  # rows are the batch, in order, padding rows included
            mask=self.describe_decode(plan, rows),
            dynamic=dynamic,
            maybe_dynamic=maybe,
        )
        return inputs, sources

    def describe_decode(self, plan: PackedPlan, rows: int) -> StepMask | None:
        """A decode step's masks, the real rows only (a compiled step's padding rows are free cache rows)."""
        if not self.describe:
            return None
        cache = self.cache
        singles = [(row, row) for row in range(rows)]
        return describe_step(plan, singles, cache.lengths, cache.padding, self.windows, self.recurrent_layers)

    # --- steps with prompt chunks, eager --------------------------------------------------------------------------
    def gathered(self, packed: PackedStep) -> StepInputs:
        """Eager, each row's blocks gathered: each chunk attends on its own over its row's columns, the decode rows
        together over the step's longest row."""
        cache = self.cache
        blocks = cache.pool.blocks_for(self.reach(packed))
        columns = blocks * cache.pool.block_size
        cache_plan = StepPlan(
            slots=self._tensor(packed.write_slots),
            write_columns=self._tensor(packed.write_columns),
            tables=self._tensor(cache.tables(packed.rows, blocks)),
        )
        plan = self._gathered_plan(packed, columns)
        return self._mixed_inputs(packed, cache_plan, plan, self._describe(packed, columns), eager=True)

    def through_tables(self, packed: PackedStep, columns: int | None = None) -> StepInputs:
        """Every new token, a prompt chunk's as a decode row's, attends through its own row's table
        (`paged_decode`): each token is a query row of its own, with its row's table, its own column and its row's
        first real column, so a chunk's tokens see their row up to themselves (causal) and no blocks are gathered.
        `columns`: the compiled graph's (the reach rounded up to its step); None: eager, the step's own reach."""
        cache = self.cache
        blocks = cache.pool.blocks_for(self.reach(packed) if columns is None else columns)
        token_rows = [0] * len(packed.input_ids)
        for row, index in packed.singles:
            token_rows[index] = row
        for row, start, end in packed.chunks:
            token_rows[start:end] = [row] * (end - start)
        tables = self._tensor(cache.tables(packed.rows, blocks))[self._tensor(token_rows)]
        write_columns = self._tensor(packed.write_columns)
        first = self._tensor([cache.padding[row] for row in token_rows])
        cache_plan = StepPlan(self._tensor(packed.write_slots), write_columns, tables, paged=True)
        mask = RowMask(write_columns[:, None, None, None], first[:, None, None, None], self.dtype)
        kv_len = blocks * cache.pool.block_size
        plan = PackedPlan(len(token_rows), None, None, mask, [], kv_len, tables)
        inputs = self._mixed_inputs(packed, cache_plan, plan, self._describe(packed, kv_len), eager=columns is None)
        if columns is not None:
            inputs.dynamic += [(tables, 0), (tables, 1), (mask.query_columns, 0), (mask.first_columns, 0)]
        return inputs

    def _gathered_plan(self, packed: PackedStep, columns: int) -> PackedPlan:
        """Masks for an eager gathered step: each query sees its own row's columns up to itself, never padding
        columns (rows outside the single-token group read their column 0 alone: no softmax row is empty)."""
        cache, rows, total = self.cache, packed.rows, len(packed.input_ids)
        singles = packed.singles
        single_mask = single_rows = single_tokens = None
        if singles:
            limit, first = [0] * rows, [0] * rows
            for row, _ in singles:
                limit[row], first[row] = cache.lengths[row], cache.padding[row]
            single_mask = RowMask(
                self._tensor(limit)[:, None, None, None], self._tensor(first)[:, None, None, None], self.dtype
            )
            if not (len(singles) == rows and total == rows):
                single_rows = self._tensor([row for row, _ in singles])
                single_tokens = self._tensor([index for _, index in singles])
        chunk_plans = []
        for row, start, end in packed.chunks:
            first_new = cache.lengths[row]
            kv_len = first_new + end - start
            own = torch.arange(first_new, kv_len, device=self.device)[None, None, :, None]
            mask = RowMask(own, self._tensor(cache.padding[row]).view(1, 1, 1, 1), self.dtype)
            chunk_plans.append(ChunkPlan(row, start, end, kv_len, mask))
        return PackedPlan(rows, single_rows, single_tokens, single_mask, chunk_plans, columns if singles else 1)

    # --- steps with prompt chunks, for the prompt graph -----------------------------------------------------------
    def grouped(self, packed: PackedStep, columns: int) -> StepInputs:
        """A step with prompt chunks as two padded groups (see `GroupedPlan`): the single-token rows, then the
        chunks' rows, each at least two (padding rows read the scratch block, their queries write past the last
        token), so no size of the compiled graph is ever 0 or 1 (sizes the compiler would specialise on)."""
        cache = self.cache
        single_rows, chunk_rows = max(len(packed.singles), 2), max(len(packed.chunks), 2)
        order: list[int | None] = [row for row, _ in packed.singles] + [None] * (single_rows - len(packed.singles))
        order += [row for row, _, _ in packed.chunks] + [None] * (chunk_rows - len(packed.chunks))
        tables = self._tensor(cache.tables_of(order, cache.pool.blocks_for(columns)))
        cache_plan = StepPlan(
            slots=self._tensor(packed.write_slots), write_columns=self._tensor(packed.write_columns), tables=tables
        )
        single_group = self._single_group(packed, single_rows)
        chunk_group = self._chunk_group(packed, chunk_rows)
        mask = None
        if self.describe:
            kv_len = tables.shape[1] * cache.pool.block_size
            described = [(row, start, end, kv_len) for row, start, end in packed.chunks]
            mask = describe_rows(
                kv_len, packed.singles, described, cache.lengths, cache.padding, self.windows, self.recurrent_layers
            )
        inputs = self._mixed_inputs(packed, cache_plan, GroupedPlan(single_group, chunk_group), mask, eager=False)
        inputs.dynamic += [(tables, 0), (tables, 1)]
        for group in (single_group, chunk_group):
            inputs.dynamic += [(group.sources, 0), (group.targets, 0), (group.mask.query_columns, 0)]
            inputs.dynamic += [(group.mask.first_columns, 0)]
        inputs.dynamic += [(chunk_group.sources, 1), (chunk_group.targets, 1), (chunk_group.mask.query_columns, 2)]
        return inputs

    def _single_group(self, packed: PackedStep, group_rows: int) -> QueryGroup:
        """The decode rows of a grouped step, padded to `group_rows` rows that write past the last token."""
        cache, total = self.cache, len(packed.input_ids)
        pad = [(0, total, 0, 0)] * (group_rows - len(packed.singles))  # (source, target, column, first)
        single = [(index, index, cache.lengths[row], cache.padding[row]) for row, index in packed.singles] + pad
        sources, targets, own, first = zip(*single, strict=True)
        mask = RowMask(self._tensor(own)[:, None, None, None], self._tensor(first)[:, None, None, None], self.dtype)
        return QueryGroup(self._tensor(sources)[:, None], self._tensor(targets)[:, None], mask)

    def _chunk_group(self, packed: PackedStep, group_rows: int) -> QueryGroup:
        """The prompt chunks' rows of a grouped step, each padded to the longest chunk, and padding rows."""
        cache, total, longest = self.cache, len(packed.input_ids), packed.longest_chunk
        sources, targets, columns, first = [], [], [], []
        for row, start, end in packed.chunks:
            count, length = end - start, cache.lengths[row]
            # A padding query repeats the chunk's last token: it sees what that one sees, and its output is dropped.
            sources.append([start + min(j, count - 1) for j in range(longest)])
            targets.append([start + j if j < count else total for j in range(longest)])
            columns.append([length + min(j, count - 1) for j in range(longest)])
            first.append(cache.padding[row])
        for _ in range(group_rows - len(packed.chunks)):
            sources.append([0] * longest)
            targets.append([total] * longest)
            columns.append([0] * longest)
            first.append(0)
        mask = RowMask(self._tensor(columns)[:, None, :, None], self._tensor(first)[:, None, None, None], self.dtype)
        return QueryGroup(self._tensor(sources), self._tensor(targets), mask)

    def _mixed_inputs(
        self,
        packed: PackedStep,
        cache_plan: StepPlan,
        plan: PackedPlan | GroupedPlan,
        mask: StepMask | None,
        eager: bool,
    ) -> StepInputs:
        """A step with prompt chunks, logits kept at each row's last token. For the prompt graph, rows past the real
        ones (a step of one row) keep the logits' row count off 1, and every size is symbolic: one graph for every
        step with prompt chunks (see `compiled`)."""
        rows = packed.rows
        keep = self._tensor(packed.last_token + ([] if eager else [0] * (max(rows, 2) - rows)))
        input_ids, position_ids = self._tensor([packed.input_ids]), self._tensor([packed.positions])
        state_plan = self._state_plan(packed) if eager and self.cache.recurrent_states is not None else None
        inputs = StepInputs(input_ids, position_ids, keep, cache_plan, plan, rows, state_plan, mask)
        if not eager:
            inputs.dynamic += [(input_ids, 1), (position_ids, 1), (keep, 0)]
            inputs.dynamic += [(cache_plan.slots, 0), (cache_plan.write_columns, 0)]
            inputs.dynamic += [(pool, 1) for pool in self.cache.pools()]
        return inputs

    def _describe(self, packed: PackedStep, columns: int) -> StepMask | None:
        """The step's masks as its rows see them: the single-token rows over `columns`, each chunk over its row."""
        if not self.describe:
            return None
        cache = self.cache
        chunks = [(row, start, end, cache.lengths[row] + end - start) for row, start, end in packed.chunks]
        single_columns = columns if packed.singles else 1
        return describe_rows(
            single_columns, packed.singles, chunks, cache.lengths, cache.padding, self.windows, self.recurrent_layers
        )

    def _state_plan(self, packed: PackedStep) -> StatePlan:
        """How a hybrid model's mixers split this step: the decode rows as one batch of one-token sequences, and
        each prompt chunk alone, its left padding (a static wave's) left out; a chunk that starts at its row's first
        real column starts from zero state."""
        cache = self.cache
        groups = []
        if packed.singles:
            tokens = self._tensor([index for _, index in packed.singles])
            groups.append(StateGroup(tokens, self._tensor([row for row, _ in packed.singles])))
        for row, start, end in packed.chunks:
            first, padding = cache.lengths[row], cache.padding[row]
            skip = max(padding - first, 0)
            if start + skip < end:
                groups.append(StateGroup(slice(start + skip, end), slice(row, row + 1), first <= padding, chunk=True))
        return StatePlan(groups)
