"""Turn "these rows get these new tokens" into one forward pass of a transformers model over the paged cache.

The runner dispatches: it packs the rows' new tokens (`step_builder`), picks the step's kind (every row decoding,
or prompt chunks beside them) and the way to run it (eager, or a ready compiled graph: `step_call`), and falls back
to eager for a step a graph fails or refuses. Graphs are made off the serving path (`warmup`).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Sequence
from functools import partial

import torch
from transformers import PreTrainedModel

import batching.engine.paged_decode as paged_decode
from batching.engine.attention import use_packed_attention
from batching.engine.blocks import DEFAULT_BLOCK_SIZE, BlockPool
from batching.engine.compiled import Bucket, StepCompiler, fits_prompt_graph, step_compiler, templates_beside
from batching.engine.cuda_graphs import DecodeGraphs
from batching.engine.events import StepPath
from batching.engine.graph_choice import Graph, GraphChoice
from batching.engine.kv_cache import PagedKVCache
from batching.engine.mask_view import StepMask
from batching.engine.model_support import check_supported, kv_layers
from batching.engine.recurrent import cache_kwarg, recurrent_layout, split_mixers
from batching.engine.step_builder import StepBuilder
from batching.engine.step_call import DIRECT_CHECKS, StepAnswer, StepCaller
from batching.engine.step_inputs import PackedStep
from batching.engine.warmup import warm_decode, warm_mixed

__all__ = ["DIRECT_CHECKS", "ModelRunner"]


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
        # A finished static row computing padding would otherwise run past the context: learned position tables
        # end there, and a length-dependent rope would pick its factors for the whole step from that row.
        max_position = max_len - 1 if max_position is None else max_position
        # Without a pool of its own choosing, every row gets its whole `max_len` (a slot cache's memory).
        pool = pool or BlockPool(capacity * -(-max_len // DEFAULT_BLOCK_SIZE), DEFAULT_BLOCK_SIZE, prefix_caching=False)
        # A hybrid model's conv and SSM states live beside the blocks, and its mixers run per request.
        layout = recurrent_layout(model)
        if layout is not None:
            split_mixers(layout)
        # Steps read keys and values through the tables once the operator is loaded (the compile thread loads it
        # before it traces the decode graph); until then, and for other models, they gather blocks.
        self.reads_through_tables = paged_decode.supports(model)
        # Inference tensors whoever builds the runner: a compiled step's guards check it, and the scratch runner
        # that makes the graphs is built in inference mode.
        with torch.inference_mode():
            num_layers = model.config.get_text_config().num_hidden_layers
            self.cache = PagedKVCache(num_layers, capacity, max_len, pool, self.device, layout)
            if self.reads_through_tables:
                # The pools are allocated now, each layer's as the probe saw it write, so the first step (every
                # request's first chunk) may take a compiled graph, which cannot allocate them.
                self.cache.allocate(kv_layers(model), model.dtype)
            recurrent_layers = len(layout.layers) if layout is not None else 0
            self.builder = StepBuilder(model, self.cache, max_len, max_position, pad_token_id, recurrent_layers)
            self.caller = StepCaller(model, self.cache, cache_kwarg(model))
        self.compiler: StepCompiler | None = None
        self.mixed_compiler: StepCompiler | None = None  # steps with prompt chunks (`fits_prompt_graph`)
        # A second decode graph, from the C++ GEMM templates alone, where a model has one (`templates_beside`), and
        # which of the two each row count's steps take (`graph_choice`).
        self.templates_compiler: StepCompiler | None = None
        self.graph_choice = GraphChoice()
        self.graphs: DecodeGraphs | None = None  # on a GPU: compiled decode steps replayed (`cuda_graphs`)
        if compile_steps:
            # A hybrid's mixers run each prompt chunk on its own: eager.
            prompt_steps = compile_prompt_steps and layout is None
            self._make_compilers(capacity, max_len, pad_token_id, pool.block_size, compile_autotune, prompt_steps)
            if cuda_graphs and self.device.type == "cuda" and layout is None:  # a hybrid's states are not checked
                compiler = self.compiler
                assert compiler is not None
                self.graphs = DecodeGraphs(capacity, compiler.column_step, compiler.columns(max_len))
        use_packed_attention(model)
        self.compiled_steps = 0  # steps a compiled graph answered: what shows it served them
        self.last_mask: StepMask | None = None  # the last step's masks, with `describe_masks`
        self.last_path: StepPath = "eager"  # how the last step ran: eager, through a graph, or its direct call
        self.last_greedy: list[int | None] | None = None  # the last step's greedy choices, when its graph made them

    def _make_compilers(
        self, capacity: int, max_len: int, pad_token_id: int, block_size: int, autotune: bool, prompt_steps: bool
    ) -> None:
        """The compilers of this shape's decode steps (and with `prompt_steps`, of steps with prompt chunks), each
        making its graphs on a scratch runner of the same shape."""
        # A weak reference: the compiler is a value of a weak dictionary keyed by this model.
        make = partial(_scratch_runner, weakref.ref(self.model), capacity, max_len, pad_token_id, block_size)
        warm = partial(warm_decode, make)
        self.compiler = step_compiler(self.model, capacity, block_size, autotune, warm)
        if templates_beside(self.model, autotune, "decode"):
            self.templates_compiler = step_compiler(self.model, capacity, block_size, autotune, warm, templates=True)
        if prompt_steps:
            warm = partial(warm_mixed, make, capacity, max_len)
            self.mixed_compiler = step_compiler(self.model, capacity, block_size, autotune, warm, kind="mixed")

    def compilers(self) -> list[StepCompiler]:
        """Every compiler this runner's steps go through: what a server makes before it listens."""
        compilers = (self.compiler, self.templates_compiler, self.mixed_compiler)
        return [compiler for compiler in compilers if compiler is not None]

    @property
    def describe_masks(self) -> bool:
        """Whether each step's masks are described (`last_mask`): the batcher turns it on with step detail."""
        return self.builder.describe

    @describe_masks.setter
    def describe_masks(self, describe: bool) -> None:
        self.builder.describe = describe

    def _reading_tables(self) -> bool:
        """Whether this step's attention reads the pools through the block tables (`paged_decode`, once loaded)."""
        return self.reads_through_tables and paged_decode.ready()

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

    # --- steps ------------------------------------------------------------------------------------------------
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
        packed = self.builder.pack(row_tokens)
        decoding = len(packed.singles) == rows and not packed.chunks
        answer = self._decode(packed) if decoding else self._mixed(packed)
        self.last_path, self.last_greedy = answer.path, answer.greedy
        for row, tokens in enumerate(row_tokens):
            cache.lengths[row] += len(tokens)
        return answer.logits

    def _decode(self, packed: PackedStep) -> StepAnswer:
        """A decode step: compiled when the graph is ready, else eager (and the graph is made meanwhile); a step the
        graph's guards refuse runs eager and the graph is made again for its shape in the background. Where the model
        has a second decode graph (`templates_compiler`), the step takes the one its row count runs faster on."""
        tokens, positions, slots = packed.input_ids, packed.positions, packed.write_slots
        compiler, graph = self._decode_graph(len(tokens))
        if compiler is None:
            return self.decode_with(tokens, positions, slots, None, None)
        bucket = compiler.bucket(len(tokens), max(self.cache.lengths[: len(tokens)]) + 1)
        step = compiler.step()
        if step is None:
            return self.decode_with(tokens, positions, slots, None, None)
        states = self.cache.recurrent_states
        kept = states.kept(len(tokens)) if states is not None else None
        start = time.perf_counter()
        try:
            answer = self.decode_with(tokens, positions, slots, step, bucket, compiler)
        except Exception as exc:  # e.g. a guard failed and dynamo could not re-trace: no request pays for it
            # Rerunning eager is safe: the cache's lengths move only after a step, and its writes repeat; a hybrid's
            # states, which the step advances, are put back as they were before it.
            compiler.fail(exc, f"a compiled {compiler.what} failed")
            if states is not None and kept is not None:
                states.restore(kept)
            return self.decode_with(tokens, positions, slots, None, None)
        if answer.path == "eager":
            compiler.missed(bucket)
        else:
            self.compiled_steps += 1
            if graph is not None:
                self.graph_choice.record(len(tokens), graph, time.perf_counter() - start)
        return answer

    def _decode_graph(self, rows: int) -> tuple[StepCompiler | None, Graph | None]:
        """The compiler of a decode step of `rows` rows, and which of two graphs it is when there are two and both
        are ready (else None): the one `graph_choice` picks. The second graph is made once the main one is."""
        main, second = self.compiler, self.templates_compiler
        if main is None or second is None or second.failed or not main.ready:
            return main, None
        if not second.ready:
            second.start()
            return main, None
        graph = self.graph_choice.pick(rows)
        return (second if graph == "templates" else main), graph

    def decode_with(
        self,
        tokens: list[int],
        positions: list[int],
        slots: list[int],
        step: Callable[..., object] | None,
        bucket: Bucket | None,
        compiler: StepCompiler | None = None,
        trace: bool = False,
    ) -> StepAnswer:
        """A step where every row decodes one token: eager, rows exact and reading the longest row's blocks;
        through `step`, padded to `bucket` (rows and columns, which the graph keeps symbolic), called directly once
        `compiler`'s direct call is made (default: the main decode graph's); on a GPU, replayed from the bucket's
        CUDA graph once captured (`cuda_graphs`: buckets of every slot count and 256 columns)."""
        cache, rows = self.cache, len(tokens)
        graphs = self.graphs if step is not None and not trace and self.graphs is not None else None
        if graphs is not None and not graphs.failed:
            bucket = graphs.bucket(max(cache.lengths[:rows]) + 1)
        else:
            graphs = None
        padded = (rows, max(cache.lengths[:rows]) + 1) if step is None or bucket is None else bucket
        values = self.builder.decode_values(tokens, positions, slots, *padded)
        if graphs is not None and bucket is not None:
            replayed = self.caller.replay(graphs, bucket, values, rows)
            if replayed is not None:
                answer, plan = replayed
                self.last_mask = self.builder.describe_decode(plan, rows)
                return answer
        inputs, sources = self.builder.decode(values, rows, self._reading_tables(), trace)
        self.last_mask = inputs.mask
        if graphs is not None and bucket is not None and step is not None:
            return self.caller.capture(graphs, bucket, inputs, sources, step)
        return self.caller(inputs, step, compiler or self.compiler, trace)

    def _mixed(self, packed: PackedStep) -> StepAnswer:
        """A step with prompt chunks: through the prompt graph when it is ready and the step is one it wins on
        (`fits_prompt_graph`; else eager, the graph made meanwhile once the decode graph is ready: decode steps are
        most steps); eager for good if the graph fails, eager this once (the graph made again) if its guards refuse
        the step."""
        step = self._prompt_graph(packed)
        if step is None:
            return self._mixed_eager(packed)
        compiler = self.mixed_compiler
        assert compiler is not None
        try:
            answer = self.mixed_with(step, packed)
        except Exception as exc:  # as a decode step's: the step reruns eager, no request pays for it
            compiler.fail(exc, "a compiled prompt step failed")
            return self._mixed_eager(packed)
        if answer.path == "eager":
            compiler.missed(None)
        else:
            self.compiled_steps += 1
        return answer

    def _prompt_graph(self, packed: PackedStep) -> Callable[..., object] | None:
        """The prompt graph's compiled forward for this step, or None (eager)."""
        compiler = self.mixed_compiler
        if compiler is None or self.compiler is None or not self.compiler.ready or not packed.chunks:
            return None
        if not fits_prompt_graph(len(packed.input_ids), packed.longest_chunk, self._reading_tables()):
            return None
        if not self.cache.initialized_layers():  # a first step that allocates the cache: eager
            return None
        return compiler.step()

    def _mixed_eager(self, packed: PackedStep) -> StepAnswer:
        """A step with prompt chunks, eager: through the tables once the operator is loaded, else gathered."""
        inputs = self.builder.through_tables(packed) if self._reading_tables() else self.builder.gathered(packed)
        self.last_mask = inputs.mask
        return self.caller(inputs)

    def mixed_with(self, step: Callable[..., object], packed: PackedStep, trace: bool = False) -> StepAnswer:
        """A step with prompt chunks through `step`, laid out for the prompt graph: through the tables (the columns
        rounded up to the graph's step) once the operator is loaded, else as two padded groups."""
        reach = self.builder.reach(packed)
        columns = self.mixed_compiler.columns(reach) if self.mixed_compiler is not None else reach
        if self._reading_tables():
            inputs = self.builder.through_tables(packed, columns)
        else:
            inputs = self.builder.grouped(packed, columns)
        self.last_mask = inputs.mask
        return self.caller(inputs, step, self.mixed_compiler, trace)


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
