"""Turn "these rows get these new tokens" into one forward pass of a transformers model over the paged cache."""

from __future__ import annotations

import dataclasses
import logging
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

import torch
from transformers import PreTrainedModel

import batching.engine.paged_decode as paged_decode
from batching.engine.attention import (
    PLAN_KWARG,
    ChunkPlan,
    GroupedPlan,
    PackedPlan,
    QueryGroup,
    RowMask,
    use_packed_attention,
)
from batching.engine.blocks import DEFAULT_BLOCK_SIZE, BlockPool
from batching.engine.compiled import Bucket, StepCompiler, fits_prompt_graph, step_compiler
from batching.engine.cuda_graphs import DecodeGraphs, Outputs
from batching.engine.direct_call import DirectCall, DirectPath, direct_calls_supported, watching_graph_calls
from batching.engine.events import StepPath
from batching.engine.kv_cache import PagedKVCache, StepPlan
from batching.engine.mask_view import StepMask, describe_rows, describe_step, layer_windows
from batching.engine.model_support import check_supported, kv_layers
from batching.engine.recurrent import StateGroup, StatePlan, cache_kwarg, recurrent_layout, split_mixers
from batching.engine.sampling import greedy_list

logger = logging.getLogger(__name__)

# A step kind's first calls through a direct graph call also run through `torch.compile`: outputs and cache writes
# must agree (`ModelRunner._checked_direct`). Watched calls that give no recipe are tried this many times.
DIRECT_CHECKS = 3
DIRECT_TRIES = 8


@dataclass
class PackedStep:
    """A step's new tokens, every row's packed into one sequence, and where each goes in the cache."""

    input_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    write_slots: list[int] = field(default_factory=list)
    write_columns: list[int] = field(default_factory=list)
    last_token: list[int] = field(default_factory=list)  # per row: its last new token's packed index
    singles: list[tuple[int, int]] = field(default_factory=list)  # (row, packed index): one new token
    chunks: list[tuple[int, int, int]] = field(default_factory=list)  # (row, packed start, packed end): a prompt chunk


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
        compile_prompt_steps: bool = False,
        cuda_graphs: bool = False,
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
        # Steps read keys and values through the tables once the operator is loaded (the compile thread loads it
        # before it traces the decode graph); until then, and for other models, they gather blocks.
        self.reads_through_tables = paged_decode.supports(model)
        # Inference tensors whoever builds the runner: a compiled step's guards check it, and the scratch runner
        # that makes the graphs is built in inference mode.
        with torch.inference_mode():
            self.cache = PagedKVCache(num_layers, capacity, max_len, pool, self.device, layout)
            if self.reads_through_tables:
                # The pools are allocated now, each layer's as the probe saw it write, so the first step (every
                # request's first chunk) may take a compiled graph, which cannot allocate them.
                self.cache.allocate(kv_layers(model), model.dtype)
            # A prepared 4D mask is passed through by the model untouched; the real masks travel in the plan.
            self._placeholder_mask = torch.zeros((1, 1, 1, 1), dtype=model.dtype, device=self.device)
        self.compiler: StepCompiler | None = None
        self.compiled_steps = 0  # steps a compiled graph answered: what shows it served them
        self.mixed_compiler: StepCompiler | None = None  # steps with prompt chunks (`fits_prompt_graph`)
        self.graphs: DecodeGraphs | None = None  # on a GPU: compiled decode steps replayed (`cuda_graphs`)
        if compile_steps:
            # A weak reference: the compiler is a value of a weak dictionary keyed by this model.
            shape = (weakref.ref(model), capacity, max_len, pad_token_id, pool.block_size)
            warm = partial(_warm_bucket, *shape)
            self.compiler = step_compiler(model, capacity, pool.block_size, compile_autotune, warm)
            if compile_prompt_steps and layout is None:  # a hybrid's mixers run each chunk on its own: eager
                warm_mixed = partial(_warm_mixed, *shape)
                self.mixed_compiler = step_compiler(
                    model, capacity, pool.block_size, compile_autotune, warm_mixed, kind="mixed"
                )
            if cuda_graphs and self.device.type == "cuda" and layout is None:  # a hybrid's states are not checked
                compiler = self.compiler
                self.graphs = DecodeGraphs(capacity, compiler.column_step, compiler.columns(max_len))
        use_packed_attention(model)
        self.describe_masks = False  # the batcher turns it on with step detail: `last_mask` describes each step
        self.last_mask: StepMask | None = None
        self.last_path: StepPath = "eager"  # how the last step ran: eager, through a graph, or its direct call
        self.last_greedy: list[int | None] | None = None  # the last step's greedy choices, when its graph made them
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

        packed = self._pack(row_tokens)
        self.last_path = "eager"
        self.last_greedy = None
        if len(packed.singles) == rows and not packed.chunks:
            logits = self._decode(packed.input_ids, packed.positions, packed.write_slots)
        else:
            step = self._mixed_step(packed)
            logits = self._packed(packed) if step is None else self._compiled_mixed(step, packed)
        for row, tokens in enumerate(row_tokens):
            cache.lengths[row] += len(tokens)
        return logits

    def _pack(self, row_tokens: Sequence[list[int]]) -> PackedStep:
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

    def _packed(self, packed: PackedStep) -> torch.Tensor:
        """A step with prompt chunks, eager: every row's new tokens packed into one sequence, each chunk attending
        on its own over its row's columns."""
        cache, rows = self.cache, len(packed.last_token)
        device = self.device
        input_ids, positions, write_slots = packed.input_ids, packed.positions, packed.write_slots
        write_columns, last_token = packed.write_columns, packed.last_token
        singles, chunks = packed.singles, packed.chunks
        blocks = cache.pool.blocks_for(self._reach(packed))
        plan: PackedPlan
        if self._reading_through_tables():
            cache.plan, plan = self._through_tables(packed, blocks)
        else:
            cache.plan = StepPlan(
                slots=torch.tensor(write_slots, device=device),
                write_columns=torch.tensor(write_columns, device=device),
                tables=torch.tensor(cache.tables(rows, blocks), device=device),
            )
            plan = self._plan(rows, len(input_ids), singles, chunks, blocks * cache.pool.block_size)
        if self.describe_masks:
            self.last_mask = self._describe(packed, blocks * cache.pool.block_size)
        if cache.recurrent_states is not None:
            cache.recurrent_states.plan = self._state_plan(singles, chunks)
        cache.attention_plan, cache.position_ids = plan, torch.tensor([positions], device=device)
        output = self.model(
            input_ids=torch.tensor([input_ids], device=device),
            position_ids=cache.position_ids,
            attention_mask=self._placeholder_mask,
            **{self.cache_kwarg: cache},
            use_cache=True,
            logits_to_keep=torch.tensor(last_token, device=device),
            **{PLAN_KWARG: plan},
        )
        return output.logits[0].float()

    def _reach(self, packed: PackedStep) -> int:
        """The most columns any row holds once this step's tokens are written."""
        lengths = self.cache.lengths
        singles = [lengths[row] + 1 for row, _ in packed.singles]
        return max(singles + [lengths[row] + end - start for row, start, end in packed.chunks])

    def _mixed_columns(self, packed: PackedStep) -> int:
        """`_reach` rounded up to the prompt graph's column step (the step's tables cover that many columns)."""
        reach = self._reach(packed)
        return self.mixed_compiler.columns(reach) if self.mixed_compiler is not None else reach

    def _reading_through_tables(self) -> bool:
        """Whether this step's attention reads the pools through the block tables (`paged_decode`)."""
        return self.reads_through_tables and paged_decode.ready()

    def _through_tables(self, packed: PackedStep, blocks: int) -> tuple[StepPlan, PackedPlan]:
        """A step whose every new token, a prompt chunk's as a decode row's, attends through its own row's table
        (`paged_decode`): each token is a query row of its own, with its row's table, its own column and its row's
        first real column, so a chunk's tokens see their row up to themselves (causal) and no blocks are gathered.

        Measured on the embedded model (1 thread, compiled): 7 decode rows beside a 40-token chunk, 5.5 against
        8.8 ms with the gathered groups (their gather of every row's blocks was a fifth of the step)."""
        cache, device = self.cache, self.device
        token_rows = [0] * len(packed.input_ids)
        for row, index in packed.singles:
            token_rows[index] = row
        for row, start, end in packed.chunks:
            token_rows[start:end] = [row] * (end - start)
        row_tables = torch.tensor(cache.tables(len(packed.last_token), blocks), device=device)
        tables = row_tables[torch.tensor(token_rows, device=device)]
        write_columns = torch.tensor(packed.write_columns, device=device)
        first = torch.tensor([cache.padding[row] for row in token_rows], device=device)
        step_plan = StepPlan(
            slots=torch.tensor(packed.write_slots, device=device),
            write_columns=write_columns,
            tables=tables,
            paged=True,
        )
        mask = RowMask(write_columns[:, None, None, None], first[:, None, None, None], self.model.dtype)
        plan = PackedPlan(len(token_rows), None, None, mask, [], blocks * cache.pool.block_size, tables)
        return step_plan, plan

    def _describe(self, packed: PackedStep, columns: int) -> StepMask:
        """The step's masks as its rows see them: the single-token rows over `columns`, each chunk over its row."""
        cache = self.cache
        chunks = [(row, start, end, cache.lengths[row] + end - start) for row, start, end in packed.chunks]
        single_columns = columns if packed.singles else 1
        return describe_rows(
            single_columns, packed.singles, chunks, cache.lengths, cache.padding, self.windows, self.recurrent_layers
        )

    def _mixed_step(self, packed: PackedStep) -> Callable[..., object] | None:
        """The compiled forward for a step with prompt chunks when its graph is ready and the step is one it wins
        on (`fits_prompt_graph`; else None: eager); the graph is made meanwhile, once the decode graph is ready
        (decode steps are most steps: their graph comes first)."""
        compiler = self.mixed_compiler
        if compiler is None or self.compiler is None or not self.compiler.ready or not packed.chunks:
            return None
        longest = max(end - start for _, start, end in packed.chunks)
        if not fits_prompt_graph(len(packed.input_ids), longest, self._reading_through_tables()):
            return None
        if not self.cache.initialized_layers():  # a first step that allocates the cache: eager
            return None
        return compiler.step()

    def _compiled_mixed(self, step: Callable[..., object], packed: PackedStep) -> torch.Tensor:
        """A step with prompt chunks through the compiled graph; eager (for good) if the graph fails, eager this once
        (and the graph made again in the background) if its guards refuse the step."""
        compiler = self.mixed_compiler
        assert compiler is not None
        try:
            logits = self._grouped_with(step, packed)
        except Exception as exc:  # as a decode step's: the step reruns eager, no request pays for it
            compiler.fail(exc, "a compiled prompt step failed")
            self.last_path = "eager"
            return self._packed(packed)
        if self.last_path == "eager":
            compiler.missed(None)
        else:
            self.compiled_steps += 1
        return logits

    def _grouped_with(
        self, step: Callable[..., object] | None, packed: PackedStep, trace: bool = False
    ) -> torch.Tensor:
        """A step with prompt chunks as two padded groups (see `GroupedPlan`): the single-token rows, then the
        chunks' rows, each at least two (padding rows read the scratch block, their queries write past the last
        token), so no size of the compiled graph is ever 0 or 1 (sizes the compiler would specialise on). Models
        that read through the tables take one query row per token instead (`_compiled_through_tables`)."""
        if self._reading_through_tables():
            return self._compiled_through_tables(step, packed, trace)
        cache, device, dtype = self.cache, self.device, self.model.dtype
        singles, chunks = packed.singles, packed.chunks
        total = len(packed.input_ids)
        single_rows = max(len(singles), 2)
        chunk_rows = max(len(chunks), 2)
        longest = max(end - start for _, start, end in chunks)
        columns = self._mixed_columns(packed)
        order: list[int | None] = [row for row, _ in singles] + [None] * (single_rows - len(singles))
        order += [row for row, _, _ in chunks] + [None] * (chunk_rows - len(chunks))
        tables = torch.tensor(cache.tables_of(order, cache.pool.blocks_for(columns)), device=device)
        cache.plan = StepPlan(
            slots=torch.tensor(packed.write_slots, device=device),
            write_columns=torch.tensor(packed.write_columns, device=device),
            tables=tables,
        )
        pad = [(0, total, 0, 0)] * (single_rows - len(singles))  # (source, target, column, first)
        single = [(index, index, cache.lengths[row], cache.padding[row]) for row, index in singles] + pad
        sources, targets, own, first = zip(*single, strict=True)
        single_group = QueryGroup(
            torch.tensor(sources, device=device)[:, None],
            torch.tensor(targets, device=device)[:, None],
            RowMask(
                torch.tensor(own, device=device)[:, None, None, None],
                torch.tensor(first, device=device)[:, None, None, None],
                dtype,
            ),
        )
        chunk_sources, chunk_targets, chunk_columns, chunk_first = [], [], [], []
        for row, start, end in chunks:
            count, length = end - start, cache.lengths[row]
            # A padding query repeats the chunk's last token: it sees what that one sees, and its output is dropped.
            chunk_sources.append([start + min(j, count - 1) for j in range(longest)])
            chunk_targets.append([start + j if j < count else total for j in range(longest)])
            chunk_columns.append([length + min(j, count - 1) for j in range(longest)])
            chunk_first.append(cache.padding[row])
        for _ in range(chunk_rows - len(chunks)):
            chunk_sources.append([0] * longest)
            chunk_targets.append([total] * longest)
            chunk_columns.append([0] * longest)
            chunk_first.append(0)
        chunk_group = QueryGroup(
            torch.tensor(chunk_sources, device=device),
            torch.tensor(chunk_targets, device=device),
            RowMask(
                torch.tensor(chunk_columns, device=device)[:, None, :, None],
                torch.tensor(chunk_first, device=device)[:, None, None, None],
                dtype,
            ),
        )
        plan = GroupedPlan(single_group, chunk_group)
        if self.describe_masks:
            kv_len = tables.shape[1] * cache.pool.block_size
            described = [(row, start, end, kv_len) for row, start, end in chunks]
            self.last_mask = describe_rows(
                kv_len, singles, described, cache.lengths, cache.padding, self.windows, self.recurrent_layers
            )
        dynamic = [(tables, 0), (tables, 1)]
        for group in (single_group, chunk_group):
            dynamic += [(group.sources, 0), (group.targets, 0), (group.mask.query_columns, 0)]
            dynamic += [(group.mask.first_columns, 0)]
        dynamic += [(chunk_group.sources, 1), (chunk_group.targets, 1), (chunk_group.mask.query_columns, 2)]
        return self._call_mixed(step, packed, plan, dynamic if trace else None)

    def _compiled_through_tables(
        self, step: Callable[..., object] | None, packed: PackedStep, trace: bool = False
    ) -> torch.Tensor:
        """A step with prompt chunks whose tokens all read through the tables (`_through_tables`), for the compiled
        graph: the columns rounded up to the graph's step, the kept logits' rows to at least two."""
        cache = self.cache
        columns = self._mixed_columns(packed)
        cache.plan, plan = self._through_tables(packed, cache.pool.blocks_for(columns))
        if self.describe_masks:
            self.last_mask = self._describe(packed, plan.single_kv_len)
        assert plan.tables is not None and plan.single_mask is not None
        dynamic = [(plan.tables, 0), (plan.tables, 1)]
        dynamic += [(plan.single_mask.query_columns, 0), (plan.single_mask.first_columns, 0)]
        return self._call_mixed(step, packed, plan, dynamic if trace else None)

    def _call_mixed(
        self,
        step: Callable[..., object] | None,
        packed: PackedStep,
        plan: PackedPlan | GroupedPlan,
        dynamic: list[tuple[torch.Tensor, int]] | None,
    ) -> torch.Tensor:
        """A step with prompt chunks through `step` (the prompt graph; None: eager), logits kept at each row's last
        token. `dynamic`: the plan's sizes to keep symbolic when this call traces the graph (None: it does not)."""
        cache, device, rows = self.cache, self.device, len(packed.last_token)
        # Rows past the real ones (a step of one row) keep the logits' row count off 1.
        keep = torch.tensor(packed.last_token + [0] * (max(rows, 2) - rows), device=device)
        input_ids = torch.tensor([packed.input_ids], device=device)
        position_ids = torch.tensor([packed.positions], device=device)
        if dynamic is not None:
            # Every size symbolic: one graph for every step with prompt chunks (see `compiled`).
            dynamic = [*dynamic, (input_ids, 1), (position_ids, 1), (keep, 0)]
            dynamic += [(cache.plan.slots, 0), (cache.plan.write_columns, 0)]
            dynamic += [(pool, 1) for pool in cache.pools()]
            for tensor, dim in dynamic:
                torch._dynamo.mark_dynamic(tensor, dim)
        roles = [input_ids, position_ids, keep, self._placeholder_mask, *_tensors_of(cache.plan), *_tensors_of(plan)]
        return self._call(
            step,
            rows,
            self.mixed_compiler,
            roles + self.cache.pools(),
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=self._placeholder_mask,
            **{self.cache_kwarg: cache},
            use_cache=True,
            logits_to_keep=keep,
            **{PLAN_KWARG: plan},
        )

    def _call(
        self,
        step: Callable[..., object] | None,
        rows: int,
        compiler: StepCompiler | None = None,
        roles: list[torch.Tensor] | None = None,
        **inputs: Any,
    ) -> torch.Tensor:
        """The model's forward, eager (`step` None) or compiled; the first `rows` rows' logits, in float32. A compiled
        step also answers each row's greedy choice (`sampling.greedy_choices`, in the graph): kept in `last_greedy`.
        `roles`: every tensor the step passes (its inputs, its plans' and the pools), for calling its graph directly
        (`direct_call`). `last_path` says how it ran: a step the graphs' guards refused ran eager inside `step`."""
        self.cache.attention_plan, self.cache.position_ids = inputs[PLAN_KWARG], inputs["position_ids"]
        if step is None:
            output: Any = self.model(**inputs)
            return output.logits[0, :rows].float()
        outputs = None
        if compiler is not None and roles is not None:
            outputs = self._direct(compiler.direct, step, roles, inputs)
        if outputs is None:
            outputs = self._through_graphs(step, inputs)
        logits, greedy = outputs[0], outputs[1]
        self.last_greedy = greedy_list(greedy[:rows])
        return logits[:rows].float()

    def _through_graphs(self, step: Callable[..., object], inputs: dict[str, Any]) -> Sequence[torch.Tensor]:
        """The step through `step` (the graphs in run-only mode, `StepCompiler.graphs_only`): `last_path` says
        "compiled" when a graph ran, "eager" when none admitted the step and the model's own code ran."""
        with watching_graph_calls() as seen:
            outputs = cast(Sequence[torch.Tensor], step(self.model, **inputs))
        self.last_path = "compiled" if seen else "eager"
        return outputs

    def _direct(
        self, path: DirectPath, step: Callable[..., object], roles: list[torch.Tensor], inputs: dict[str, Any]
    ) -> Sequence[torch.Tensor] | None:
        """The step through its graph called directly (`direct_call`) once the call is made and checked; until then
        through `torch.compile`, watched to make the call, then run both ways to check it. None: the normal call."""
        if path.failed or self.cache.recurrent_states is not None:  # a hybrid's states are not checked: normal call
            return None
        if not direct_calls_supported(self.device):
            return None
        call = path.call
        if call is None:
            with watching_graph_calls() as seen:
                outputs = cast(Sequence[torch.Tensor], step(self.model, **inputs))
            if not seen:  # no graph admitted the step: it ran eager, and says so; no recipe to make
                self.last_path = "eager"
                return outputs
            self.last_path = "compiled"
            path.call = DirectCall.of(step, *seen[0], roles) if len(seen) == 1 else None
            if path.call is None:
                path.tries += 1
                path.failed = path.tries >= DIRECT_TRIES
            return outputs
        if call.roles != len(roles) or not call.admits(self.model, inputs):
            return None
        if path.checked < DIRECT_CHECKS:
            self.last_path = "compiled"  # the normal call's answer (its guards are the direct call's: it ran a graph)
            return self._checked_direct(path, call, step, roles, inputs)
        self.last_path = "direct"
        return call(roles)

    def _checked_direct(
        self,
        path: DirectPath,
        call: DirectCall,
        step: Callable[..., object],
        roles: list[torch.Tensor],
        inputs: dict[str, Any],
    ) -> Sequence[torch.Tensor]:
        """Run the step through `torch.compile`, then directly over the same inputs with the cache slots it wrote
        overwritten with NaN: the direct call must give the same outputs (and no more: more would be what dynamo
        does after the graph) and write the same slots. Else the direct call is dropped for good."""
        normal = cast(Sequence[torch.Tensor], step(self.model, **inputs))
        slots = self.cache.plan.slots
        pools = [pool.view(pool.shape[0], -1, pool.shape[-1]) for pool in self.cache.pools()]
        written = [pool[:, slots].clone() for pool in pools]
        for pool in pools:
            pool[:, slots] = float("nan")
        try:
            direct = call(roles)
            same = len(direct) == len(normal) == 2 and all(map(torch.equal, direct, normal))
            same = same and all(torch.equal(pool[:, slots], kept) for pool, kept in zip(pools, written, strict=True))
        except Exception as exc:  # any failure means: not this way
            logger.debug("direct graph call failed", exc_info=exc)
            same = False
        if not same:
            for pool, kept in zip(pools, written, strict=True):
                pool[:, slots] = kept
            path.failed = True
            logger.warning("a compiled graph called directly disagreed with its normal call: normal calls from now on")
        else:
            path.checked += 1
        return normal

    def _decode(self, tokens: list[int], positions: list[int], slots: list[int]) -> torch.Tensor:
        """A decode step: compiled when the graph is ready, else eager (and the graph is made meanwhile); a step the
        graph's guards refuse runs eager and the graph is made again for its shape in the background."""
        compiler = self.compiler
        if compiler is not None:
            bucket = compiler.bucket(len(tokens), max(self.cache.lengths[: len(tokens)]) + 1)
            step = compiler.step()
            if step is not None:
                states = self.cache.recurrent_states
                kept = states.kept(len(tokens)) if states is not None else None
                try:
                    logits = self._decode_with(tokens, positions, slots, step, bucket)
                except Exception as exc:  # e.g. a guard failed and dynamo could not re-trace: no request pays for it
                    # Rerunning eager is safe: the cache's lengths move only after a step, and its writes repeat;
                    # a hybrid's states, which the step advances, are put back as they were before it.
                    compiler.fail(exc, "a compiled decode step failed")
                    if states is not None and kept is not None:
                        states.restore(kept)
                    self.last_path = "eager"
                else:
                    if self.last_path == "eager":
                        compiler.missed(bucket)
                    else:
                        self.compiled_steps += 1
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
        the bucket's, which the graph keeps symbolic. On a GPU the compiled step is replayed from the bucket's CUDA
        graph once captured (`cuda_graphs`: the buckets there are every slot and columns in steps of 256).
        """
        cache, rows = self.cache, len(tokens)
        graphs = self.graphs if step is not None and not trace and self.graphs is not None else None
        if graphs is not None and not graphs.failed:
            bucket = graphs.bucket(max(cache.lengths[:rows]) + 1)
        else:
            graphs = None
        padded_rows, padded_len = (rows, max(cache.lengths[:rows]) + 1) if step is None or bucket is None else bucket
        pad = padded_rows - rows
        # The step's inputs as nested lists: input ids, position ids, write slots, write columns, tables, first columns.
        values: list[list[Any]] = [
            [tokens + [self.pad_token_id] * pad],
            [positions + [0] * pad],
            slots + [cache.scratch_block * cache.pool.block_size] * pad,
            cache.lengths[:rows] + [0] * pad,
            cache.tables(padded_rows, cache.pool.blocks_for(padded_len)),
            cache.padding[:rows] + [0] * pad,
        ]
        if graphs is not None and bucket is not None:
            captured = graphs.replay(bucket, values)
            if captured is not None:
                cache.plan, plan = captured.plans
                self._describe_decode(plan, rows)
                self.last_path = "direct"  # its CUDA graph replayed: no torch.compile entry
                return self._graph_answer(captured.outputs, rows)
        device = self.device
        input_ids, position_ids, write_slots, write_columns, tables, first = (
            torch.tensor(value, device=device) for value in values
        )
        paged = self.reads_through_tables and paged_decode.ready()
        cache.plan = StepPlan(slots=write_slots, write_columns=write_columns, tables=tables, paged=paged)
        mask = RowMask(write_columns[:, None, None, None], first[:, None, None, None], self.model.dtype)
        if trace:
            # Blocks and (with more than two slots) rows stay symbolic: one graph for every decode step. With two
            # slots or fewer every compiled step has all of them (one row is padded to two). Only the step that makes
            # the graph marks them (50 us a step): the graph's own guards accept every size of a symbolic dimension.
            torch._dynamo.mark_dynamic(tables, 1)
            for pool in cache.pools():  # any pool size: the scratch pool is smaller than a batcher's
                torch._dynamo.mark_dynamic(pool, 1)
            if cache.capacity > 2:
                # Rows may be specialised after all: a hybrid's mixers take rows as their batch, and inductor's
                # linear fusion compares the batch with the sizes of a parameter added to a projection (Qwen3.5's
                # dt_bias: its head count), which guards the count off that size, or on it when they are equal
                # while tracing. `_warm_bucket` then makes a graph for every count the first graph refuses.
                by_row = [(input_ids, 1), (position_ids, 1), (write_slots, 0), (write_columns, 0), (tables, 0)]
                for tensor, dim in [*by_row, (mask.query_columns, 0), (mask.first_columns, 0)]:
                    torch._dynamo.maybe_mark_dynamic(tensor, dim)
        plan = PackedPlan(
            padded_rows, None, None, mask, [], tables.shape[1] * cache.pool.block_size, tables if paged else None
        )
        self._describe_decode(plan, rows)
        if cache.recurrent_states is not None:
            cache.recurrent_states.plan = StatePlan(None)  # rows are the batch, in order, padding rows included
        inputs = {
            "input_ids": input_ids,
            "position_ids": position_ids,
            "attention_mask": self._placeholder_mask,
            self.cache_kwarg: cache,
            "use_cache": True,
            "logits_to_keep": 0,
            PLAN_KWARG: plan,
        }
        if graphs is not None and bucket is not None and step is not None:
            compiled = step
            with watching_graph_calls() as seen:  # none seen: the graphs' guards refused the step, it ran eager
                outputs = graphs.capture(
                    bucket,
                    [input_ids, position_ids, write_slots, write_columns, tables, first],
                    (cache.plan, plan),
                    lambda: cast(Outputs, compiled(self.model, **inputs)),
                    cache.pools(),
                    write_slots,
                )
            self.last_path = "compiled" if seen else "eager"
            return self._graph_answer(outputs, rows)
        roles = [input_ids, position_ids, write_slots, write_columns, tables, first, mask.query_columns]
        roles += [mask.first_columns, self._placeholder_mask]
        return self._call(step, rows, self.compiler, roles + self.cache.pools(), **inputs)

    def _describe_decode(self, plan: PackedPlan, rows: int) -> None:
        """`last_mask` for a decode step, when the batcher asks: the real rows only (a compiled step's padding rows
        are free cache rows)."""
        if self.describe_masks:
            singles = [(row, row) for row in range(rows)]
            cache = self.cache
            self.last_mask = describe_step(
                plan, singles, cache.lengths, cache.padding, self.windows, self.recurrent_layers
            )

    def _graph_answer(self, outputs: Outputs, rows: int) -> torch.Tensor:
        """A graph's outputs as a compiled call's: greedy choices kept, the first `rows` rows' logits in float32, a
        copy (the graph's next replay overwrites its outputs)."""
        logits, greedy = outputs
        self.last_greedy = greedy_list(greedy[:rows])
        return logits[:rows].to(torch.float32, copy=True)

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


def _tensors_of(plan: object) -> list[torch.Tensor]:
    """The tensors a step's plan holds (its dataclass fields, nested plans and lists of them)."""
    found: list[torch.Tensor] = []
    stack = [plan]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            stack += [getattr(item, spec.name) for spec in dataclasses.fields(item)]
        elif isinstance(item, list | tuple):
            stack += list(item)
    return found


def _scratch_runner(
    model_ref: weakref.ref[PreTrainedModel],
    capacity: int,
    max_len: int,
    pad_token_id: int,
    block_size: int,
    rows: int,
    columns: int,
) -> ModelRunner:
    """A runner of the batcher's shape on a pool of its own, `rows` rows holding `columns` columns of blocks and
    its cache allocated (one eager step), so a graph is made while the real batchers go on stepping on theirs."""
    model = model_ref()
    if model is None:
        raise RuntimeError("the model was unloaded before its graph was made")
    pool = BlockPool(rows * -(-columns // block_size), block_size, prefix_caching=False)
    scratch = ModelRunner(model, capacity, max_len, pad_token_id, pool)
    for row in range(rows):
        scratch.claim(f"warm{row}")
        pool.grow(f"warm{row}", columns)
    scratch.forward([[pad_token_id]] * rows)  # allocates the scratch cache, eager
    return scratch


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
    """Run one decode step of this shape through the compiled forward on a scratch runner, which makes its graph;
    then one of every smaller row count a decode step may have (2 up: one row is padded to two), so a count the
    graph's guards refuse gets a graph of its own now, never in a step. Most models' first graph takes them all."""
    rows, columns = bucket
    scratch = _scratch_runner(model_ref, capacity, max_len, pad_token_id, block_size, rows, columns)
    if scratch.reads_through_tables:
        paged_decode.load()  # before the graph is traced: the graph calls the operator from then on
    scratch.cache.lengths[:rows] = [columns - 1] * rows
    slots = [scratch.cache.slots(row, columns - 1, 1)[0] for row in range(rows)]
    scratch._decode_with([pad_token_id] * rows, [0] * rows, slots, forward, bucket, trace=True)
    for count in range(2, rows):
        scratch._decode_with([pad_token_id] * count, [0] * count, slots[:count], forward, (count, columns))


@torch.inference_mode()
def _warm_mixed(
    model_ref: weakref.ref[PreTrainedModel],
    capacity: int,
    max_len: int,
    pad_token_id: int,
    block_size: int,
    forward: Callable[..., object],
    bucket: Bucket,
) -> None:
    """Run one step with prompt chunks through the compiled forward on a scratch runner: single-token rows beside
    a later chunk and a first one, every count distinct, so no two sizes are traced equal."""
    _, columns = bucket
    scratch = _scratch_runner(model_ref, capacity, max_len, pad_token_id, block_size, capacity, columns)
    if scratch.reads_through_tables:
        paged_decode.load()  # before the graph is traced, as for the decode graph
    history = columns // 2
    scratch.cache.lengths[:capacity] = [history] * capacity
    row_tokens: list[list[int]] = [[pad_token_id]] * max(min(capacity - 2, 3), 0) + [[pad_token_id] * 7]
    if capacity > 1:
        row_tokens.append([pad_token_id] * 5)
        scratch.cache.lengths[len(row_tokens) - 1] = 0  # a first chunk
    row_tokens += [[] for _ in range(capacity - len(row_tokens))]
    scratch._grouped_with(forward, scratch._pack(row_tokens), trace=True)
