"""Turn "these rows get these new tokens" into one forward pass of a transformers model over the paged cache."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
from transformers import PreTrainedModel

from batching.engine.attention import PLAN_KWARG, ChunkPlan, PackedPlan, RowMask, use_packed_attention
from batching.engine.blocks import DEFAULT_BLOCK_SIZE, BlockPool
from batching.engine.compiled import Bucket, StepCompiler, step_compiler
from batching.engine.kv_cache import PagedKVCache, StepPlan
from batching.engine.mask_view import StepMask, describe_step, layer_windows
from batching.engine.model_support import check_supported
from batching.engine.recurrent import StateGroup, StatePlan, cache_kwarg, recurrent_layout, split_mixers


class ModelRunner:
    """Owns the model's forward pass and the KV cache; knows nothing of requests or scheduling.

    Every forward covers all rows in use. A row's new tokens may be a prompt chunk, one decode token, or nothing
    (it waits this step). All new tokens are packed into one sequence, so prompt chunks and decode tokens share
    one pass through the model with no padding; attention is split per row (see `packed_attention`), and the LM
    head runs only on each row's last new token.
    """

    def __init__(  # noqa: PLR0913  (the cache's shape, the model's padding, and how steps run)
        self,
        model: PreTrainedModel,
        capacity: int,
        max_len: int,
        pad_token_id: int,
        pool: BlockPool | None = None,
        max_position: int | None = None,
        compile_steps: bool = False,
        compile_autotune: bool = True,
    ) -> None:
        check_supported(model)  # refuse before any request rather than answer wrongly
        self.model = model
        self.device = model.device
        self.max_len = max_len
        # A finished static row computing padding would otherwise run past the context: learned position tables
        # end there, and a length-dependent rope would pick its factors for the whole step from that row.
        self.max_position = max_len - 1 if max_position is None else max_position
        self.pad_token_id = pad_token_id
        num_layers = model.config.get_text_config().num_hidden_layers
        # Without a pool of its own choosing, every row gets its whole `max_len` (a slot cache's memory).
        pool = pool or BlockPool(capacity * -(-max_len // DEFAULT_BLOCK_SIZE), DEFAULT_BLOCK_SIZE, prefix_caching=False)
        # A hybrid model's conv and SSM states live beside the blocks, and its mixers run per request.
        layout = recurrent_layout(model)
        if layout is not None:
            split_mixers(layout)
        self.cache_kwarg = cache_kwarg(model)
        # Inference tensors whoever builds the runner: a compiled step's guards check it, and the scratch runner
        # that makes the graphs is built in inference mode.
        with torch.inference_mode():
            self.cache = PagedKVCache(num_layers, capacity, max_len, pool, self.device, layout)
            # A prepared 4D mask is passed through by the model untouched; the real masks travel in the plan.
            self._placeholder_mask = torch.zeros((1, 1, 1, 1), dtype=model.dtype, device=self.device)
        self.compiler: StepCompiler | None = None
        self.compiled_steps = 0  # decode steps the compiled graph answered: what shows it served them
        if compile_steps:
            # A weak reference: the compiler is a value of a weak dictionary keyed by this model.
            warm = partial(_warm_bucket, weakref.ref(model), capacity, max_len, pad_token_id, pool.block_size)
            self.compiler = step_compiler(model, capacity, pool.block_size, compile_autotune, warm)
        use_packed_attention(model)
        self.describe_masks = False  # the batcher turns it on with step detail: `last_mask` describes each step
        self.last_mask: StepMask | None = None
        self.last_compiled = False  # whether the last step ran through the compiled graph
        self.windows = layer_windows(model)
        self.recurrent_layers = len(layout.layers) if layout is not None else 0

    # --- cache rows: the runner is the only way into the cache -------------------------------------------------
    def claim(self, request_id: str, computed: int = 0) -> int:
        """Give a request the next free cache row; its first `computed` tokens are in its blocks already."""
        return self.cache.claim(request_id, computed)

    def release(self, request_id: str) -> None:
        """Free a request's row and blocks (the last row's bookkeeping moves into it)."""
        self.cache.release(request_id)

    def row_owners(self) -> list[str]:
        """The request in each cache row in use, in row order: the order `forward` takes its rows in."""
        return [owner for owner in self.cache.owners() if owner is not None]

    @torch.inference_mode()
    def forward(self, row_tokens: Sequence[list[int]], new_padding: Sequence[int] | None = None) -> torch.Tensor:
        """Run one step; returns float32 logits `[rows, vocab]` at each row's last new token.

        `new_padding[r]` > 0 says the first tokens of row r are left padding (the static baseline's waves).
        Rows with no new tokens get a meaningless logits row.
        """
        cache = self.cache
        rows = len(row_tokens)
        if rows != cache.active_rows:
            raise ValueError(f"got tokens for {rows} rows but {cache.active_rows} rows are in use")
        if new_padding:
            for row, count in enumerate(new_padding):
                if count:
                    cache.mark_padding(row, cache.lengths[row] + count)

        input_ids: list[int] = []
        positions: list[int] = []
        write_slots: list[int] = []
        write_columns: list[int] = []
        last_token: list[int] = []
        singles: list[tuple[int, int]] = []  # (row, packed index)
        chunks: list[tuple[int, int, int]] = []  # (row, packed start, packed end)
        for row, tokens in enumerate(row_tokens):
            start, count = cache.lengths[row], len(tokens)
            if start + count > self.max_len:
                raise ValueError(f"row {row} would hold {start + count} tokens; the cache holds {self.max_len}")
            position = cache.position_of_next(row)
            packed_start = len(input_ids)
            input_ids.extend(tokens)
            positions.extend(min(max(0, position + j), self.max_position) for j in range(count))
            write_slots.extend(cache.slots(row, start, count))
            write_columns.extend(range(start, start + count))
            last_token.append(max(packed_start + count - 1, 0))
            if count == 1:
                singles.append((row, packed_start))
            elif count > 1:
                chunks.append((row, packed_start, packed_start + count))
        if not input_ids:
            raise ValueError("no row has a new token this step")
        self.last_compiled = False
        if len(singles) == rows and not chunks:
            logits = self._decode(input_ids, positions, write_slots)
        else:
            logits = self._packed(input_ids, positions, write_slots, write_columns, last_token, singles, chunks)
        for row, tokens in enumerate(row_tokens):
            cache.lengths[row] += len(tokens)
        return logits

    def _packed(
        self,
        input_ids: list[int],
        positions: list[int],
        write_slots: list[int],
        write_columns: list[int],
        last_token: list[int],
        singles: list[tuple[int, int]],
        chunks: list[tuple[int, int, int]],
    ) -> torch.Tensor:
        """A step with prompt chunks: every row's new tokens packed into one sequence, always eager."""
        cache, rows = self.cache, len(last_token)
        device = self.device
        reach = [cache.lengths[row] + 1 for row, _ in singles] + [cache.lengths[r] + e - s for r, s, e in chunks]
        blocks = cache.pool.blocks_for(max(reach))
        cache.plan = StepPlan(
            slots=torch.tensor(write_slots, device=device),
            write_columns=torch.tensor(write_columns, device=device),
            tables=torch.tensor(cache.tables(rows, blocks), device=device),
        )
        plan = self._plan(rows, len(input_ids), singles, chunks, blocks * cache.pool.block_size)
        if self.describe_masks:
            self.last_mask = describe_step(
                plan, singles, cache.lengths, cache.padding, self.windows, self.recurrent_layers
            )
        if cache.recurrent_states is not None:
            cache.recurrent_states.plan = self._state_plan(singles, chunks)
        output = self.model(
            input_ids=torch.tensor([input_ids], device=device),
            position_ids=torch.tensor([positions], device=device),
            attention_mask=self._placeholder_mask,
            **{self.cache_kwarg: cache},
            use_cache=True,
            logits_to_keep=torch.tensor(last_token, device=device),
            **{PLAN_KWARG: plan},
        )
        return output.logits[0].float()

    def _decode(self, tokens: list[int], positions: list[int], slots: list[int]) -> torch.Tensor:
        """A decode step: compiled when the graph is ready, else eager (and the graph is made meanwhile)."""
        compiler = self.compiler
        if compiler is not None:
            bucket = compiler.bucket(len(tokens), max(self.cache.lengths[: len(tokens)]) + 1)
            step = compiler.step()
            if step is not None:
                try:
                    logits = self._decode_with(tokens, positions, slots, step, bucket)
                except Exception as exc:  # e.g. a guard failed and dynamo could not re-trace: no request pays for it
                    # Rerunning eager is safe: the cache's lengths move only after a step, and its writes repeat.
                    compiler.fail(exc, "a compiled decode step failed")
                else:
                    self.compiled_steps += 1
                    self.last_compiled = True
                    return logits
        return self._decode_with(tokens, positions, slots, None, None)

    def _decode_with(
        self,
        tokens: list[int],
        positions: list[int],
        slots: list[int],
        step: Callable[..., object] | None,
        bucket: Bucket | None,
        trace: bool = False,
    ) -> torch.Tensor:
        """A step where every row decodes one token.

        Eager, rows are exact and each row reads as many blocks as the longest needs. Compiled, rows are padded to
        the bucket's (the padding rows write to the scratch block and read it alone) and the columns rounded up to
        the bucket's, which the graph keeps symbolic.
        """
        cache, rows = self.cache, len(tokens)
        padded_rows, padded_len = (rows, max(cache.lengths[:rows]) + 1) if step is None or bucket is None else bucket
        pad = padded_rows - rows
        device = self.device
        columns = cache.lengths[:rows] + [0] * pad
        write_columns = torch.tensor(columns, device=device)
        write_slots = torch.tensor(slots + [cache.scratch_block * cache.pool.block_size] * pad, device=device)
        tables = torch.tensor(cache.tables(padded_rows, cache.pool.blocks_for(padded_len)), device=device)
        cache.plan = StepPlan(slots=write_slots, write_columns=write_columns, tables=tables)
        first = torch.tensor(cache.padding[:rows] + [0] * pad, device=device)
        mask = RowMask(write_columns[:, None, None, None], first[:, None, None, None], self.model.dtype)
        input_ids = torch.tensor([tokens + [self.pad_token_id] * pad], device=device)
        position_ids = torch.tensor([positions + [0] * pad], device=device)
        if trace:
            # Blocks and (with more than two slots) rows stay symbolic: one graph for every decode step. With two
            # slots or fewer every compiled step has all of them (one row is padded to two). Only the step that makes
            # the graph marks them (50 us a step): the graph's own guards accept every size of a symbolic dimension.
            torch._dynamo.mark_dynamic(tables, 1)
            for layer in cache.initialized_layers():  # any pool size: the scratch pool is smaller than a batcher's
                torch._dynamo.mark_dynamic(layer.keys, 1)
                torch._dynamo.mark_dynamic(layer.values, 1)
            if cache.capacity > 2:
                by_row = [(input_ids, 1), (position_ids, 1), (write_slots, 0), (write_columns, 0), (tables, 0)]
                for tensor, dim in [*by_row, (mask.query_columns, 0), (mask.first_columns, 0)]:
                    torch._dynamo.mark_dynamic(tensor, dim)
        plan = PackedPlan(padded_rows, None, None, mask, [], tables.shape[1] * cache.pool.block_size)
        if self.describe_masks:  # the real rows only: a compiled step's padding rows are free cache rows
            singles = [(row, row) for row in range(rows)]
            self.last_mask = describe_step(
                plan, singles, cache.lengths, cache.padding, self.windows, self.recurrent_layers
            )
        if cache.recurrent_states is not None:
            cache.recurrent_states.plan = StatePlan(None)  # rows are the batch, in order, padding rows included
        forward: Callable[..., Any] = self.model if step is None else partial(step, self.model)
        output = forward(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=self._placeholder_mask,
            **{self.cache_kwarg: cache},
            use_cache=True,
            logits_to_keep=0,
            **{PLAN_KWARG: plan},
        )
        return output.logits[0, :rows].float()

    def _state_plan(self, singles: list[tuple[int, int]], chunks: list[tuple[int, int, int]]) -> StatePlan:
        """How a hybrid model's mixers split this step: the decode rows as one batch of one-token sequences, and
        each prompt chunk alone, its left padding (a static wave's) left out; a chunk that starts at its row's first
        real column starts from zero state."""
        cache, device = self.cache, self.device
        groups = []
        if singles:
            tokens = torch.tensor([index for _, index in singles], device=device)
            groups.append(StateGroup(tokens, torch.tensor([row for row, _ in singles], device=device)))
        for row, start, end in chunks:
            first, padding = cache.lengths[row], cache.padding[row]
            skip = max(padding - first, 0)
            if start + skip < end:
                groups.append(StateGroup(slice(start + skip, end), slice(row, row + 1), first <= padding, chunk=True))
        return StatePlan(groups)

    def _plan(
        self, rows: int, total: int, singles: list[tuple[int, int]], chunks: list[tuple[int, int, int]], columns: int
    ) -> PackedPlan:
        """Masks and block tables for this step: each query sees its own row's columns up to itself, never padding
        columns (rows outside the single-token group read their column 0 alone: no softmax row is empty)."""
        cache, device, dtype = self.cache, self.device, self.model.dtype
        single_mask = single_rows = single_tokens = None
        if singles:
            limit, first = [0] * rows, [0] * rows
            for row, _ in singles:
                limit[row], first[row] = cache.lengths[row], cache.padding[row]
            query_columns = torch.tensor(limit, device=device)[:, None, None, None]
            first_columns = torch.tensor(first, device=device)[:, None, None, None]
            single_mask = RowMask(query_columns, first_columns, dtype)
            if not (len(singles) == rows and total == rows):
                single_rows = torch.tensor([row for row, _ in singles], device=device)
                single_tokens = torch.tensor([index for _, index in singles], device=device)
        chunk_plans = []
        for row, start, end in chunks:
            first_new = cache.lengths[row]
            kv_len = first_new + end - start
            own = torch.arange(first_new, kv_len, device=device)[None, None, :, None]
            mask = RowMask(own, torch.tensor(cache.padding[row], device=device).view(1, 1, 1, 1), dtype)
            chunk_plans.append(ChunkPlan(row, start, end, kv_len, mask))
        return PackedPlan(rows, single_rows, single_tokens, single_mask, chunk_plans, columns if singles else 1)


@torch.inference_mode()
def _warm_bucket(
    model_ref: weakref.ref[PreTrainedModel],
    capacity: int,
    max_len: int,
    pad_token_id: int,
    block_size: int,
    forward: Callable[..., object],
    bucket: Bucket,
) -> None:
    """Run one decode step of this shape through the compiled forward on a scratch runner with its own cache and
    pool, so the graph is made while the real batchers go on stepping on theirs."""
    model = model_ref()
    if model is None:
        raise RuntimeError("the model was unloaded before its decode graph was made")
    rows, columns = bucket
    pool = BlockPool(rows * -(-columns // block_size), block_size, prefix_caching=False)
    scratch = ModelRunner(model, capacity, max_len, pad_token_id, pool)
    for row in range(rows):
        scratch.claim(f"warm{row}")
        pool.grow(f"warm{row}", columns)
    scratch.forward([[pad_token_id]] * rows)  # allocates the scratch cache, eager
    scratch.cache.lengths[:rows] = [columns - 1] * rows
    slots = [scratch.cache.slots(row, columns - 1, 1)[0] for row in range(rows)]
    scratch._decode_with([pad_token_id] * rows, [0] * rows, slots, forward, bucket, trace=True)
