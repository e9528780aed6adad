"""Attention for a packed step: every row's new tokens in one sequence, each row attending to its own cache row.

Registered with transformers' `AttentionInterface`, so the model's own classes run unchanged: the linear layers
see only the real new tokens (no padding to the longest prompt chunk), and attention is split per row here.
Single-token rows (decode steps) share one batched call over their rows' blocks (gathered in table order by the
cache); each prompt chunk gets its own call over its row. Without a plan (e.g. `model.generate`) it is plain SDPA.

Everything the model's attention module passes is honoured: `scaling`, a per-layer `sliding_window` (a key is
seen when its column is within the last `window` columns up to the query, as in transformers' masks), values with
a head size other than the keys', and the two things SDPA cannot express, logit soft-capping (`softcap`) and
attention sinks (`s_aux`), which take an eager matmul + softmax path used only by the layers that pass them. A
layer of chunked local attention (Llama 4's, which passes nothing: its layer type says it, `layer_chunk`) sees the
keys of its own chunk of positions only, a mask rule like the window's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn.functional import scaled_dot_product_attention
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from batching.engine.paged_decode import paged_decode

ATTENTION_NAME = "batchscope_packed"
PLAN_KWARG = "batchscope_plan"


@dataclass(frozen=True)
class Chunk:
    """Chunked local attention (Llama 4's): positions are cut into chunks of `size`, and a query sees the keys of its
    own chunk up to itself. Where a layer's sliding window (an int) or None (full attention) would be."""

    size: int


# What a layer adds to causal attention over its own row: a sliding window, a chunk, or nothing (None).
Locality = int | Chunk | None
# Set by `use_packed_attention` on the attention modules of chunked layers: their `Chunk`.
CHUNK_ATTRIBUTE = "batchscope_chunk"


def layer_chunk(module: torch.nn.Module) -> Chunk | None:
    """The chunk of a layer whose type is "chunked_attention" (read through the layer's own config: the size may
    differ per layer), None for any other layer. Its attention function is passed no size: the layer type is all."""
    config, index = getattr(module, "config", None), getattr(module, "layer_idx", None)
    kinds = getattr(config, "layer_types", None)
    if config is None or index is None or not kinds or kinds[index] != "chunked_attention":
        return None
    return Chunk(int(config.per_layer_config[index].attention_chunk_size))


@dataclass
class RowMask:
    """Which key columns each query may see: up to its own column, never a padding column (a padding query sees
    itself only, so no softmax row is empty), and within a sliding window where the layer has one. Built as
    additive masks once per step and window, over however many key columns the step's gathered blocks hold."""

    query_columns: torch.Tensor  # [rows, 1, queries, 1]: the column each query sits at in its own row
    first_columns: torch.Tensor  # [rows, 1, 1, 1]: columns before it hold left padding
    dtype: torch.dtype
    _additive: dict[Locality, torch.Tensor] = field(default_factory=dict)

    def allowed(self, kv_len: int) -> torch.Tensor:
        """`[rows, 1, queries, kv_len]` booleans: True where a query attends."""
        columns = torch.arange(kv_len, device=self.query_columns.device)
        own = self.query_columns
        return (columns <= own) & ((columns >= self.first_columns) | (columns == own))

    def forget(self) -> None:
        """Drop the masks built so far: a step called again over the same inputs builds them again. Through a
        compiled graph the built mask is stored here after the call, and a call that finds one stored is refused by
        the graph's guards (they saw none) and runs eager, reading the stored mask as a constant."""
        self._additive.clear()

    def additive(self, window: Locality, kv_len: int) -> torch.Tensor:
        """The additive mask (0 = attend, dtype min = blocked); a window also hides keys `window` or more back, a
        chunk the keys of earlier chunks.

        Built once per step and window (or chunk), then shared by every layer that asks for it.
        """
        mask = self._additive.get(window)
        if mask is None:
            allowed = self.allowed(kv_len)
            columns = torch.arange(kv_len, device=allowed.device)
            if isinstance(window, Chunk):
                # transformers' chunked overlay: chunks count from a row's first real position (after its padding).
                first = self.first_columns
                allowed = allowed & ((columns - first) // window.size == (self.query_columns - first) // window.size)
            elif window is not None:
                # Matches transformers' sliding-window overlay: the query itself and the `window - 1` keys before it.
                allowed = allowed & (columns > self.query_columns - window)
            mask = torch.zeros(allowed.shape, dtype=self.dtype, device=allowed.device)
            mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
            self._additive[window] = mask
        return mask


@dataclass
class ChunkPlan:
    """One row's prompt chunk: its tokens are `[start, end)` of the packed sequence; it reads its row's first
    `kv_len` columns."""

    row: int
    start: int
    end: int
    kv_len: int
    mask: RowMask  # one row, end - start queries


@dataclass
class PackedPlan:
    """How this step's packed tokens map onto cache rows; built once per step, read by every layer."""

    rows: int
    single_rows: torch.Tensor | None  # rows with exactly one new token (None: every row, in order)
    single_tokens: torch.Tensor | None  # their positions in the packed sequence
    single_mask: RowMask | None  # every row in use, one query each
    chunks: list[ChunkPlan]
    single_kv_len: int = 1  # the key columns the single-token rows' call reads: their gathered blocks' positions
    # Set: keys and values are the pools, read through these tables (`paged_decode`): one query row per new token
    # (a decode row's one, or each of a prompt chunk's).
    tables: torch.Tensor | None = None

    def forget_masks(self) -> None:
        """Drop every mask built for the step (`RowMask.forget`), before the step is called again."""
        for mask in [self.single_mask, *(chunk.mask for chunk in self.chunks)]:
            if mask is not None:
                mask.forget()


@dataclass
class QueryGroup:
    """Rows whose new tokens attend in one batched call, each row's queries padded to the group's longest.

    `sources[i, q]` is the packed index of row i's q-th new token, `targets[i, q]` where its output goes: the
    step's one extra token past the last for a padding query (its output is dropped). Row i of the group reads
    row `first + i` of the step's gathered blocks (see `GroupedPlan`).
    """

    sources: torch.Tensor  # [rows, queries]
    targets: torch.Tensor  # [rows, queries]
    mask: RowMask  # query_columns [rows, 1, queries, 1], first_columns [rows, 1, 1, 1]


@dataclass
class GroupedPlan:
    """A step as two groups of whole rows, in the order the runner laid out the step's tables: the single-token
    rows, then the prompt chunks' rows, each group padded with rows that read the scratch block.

    Every size is read from a tensor, so a compiled step keeps them all symbolic: tokens, rows of each group, the
    longest chunk and the columns (see `compiled`): one graph for every step with a prompt chunk.
    """

    singles: QueryGroup  # one query per row
    chunks: QueryGroup


def attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    scaling: float | None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of `query` [b, heads, q, d] over `key` [kv_heads, b, s, d] / `value` [kv_heads, b, s, dv] (heads
    first, as `gather_blocks` lays them out); `mask` is additive, [b, 1, q, s].

    SDPA for prompt chunks; one query per row (decode) takes the grouped matmul + softmax below, which beat SDPA's
    CPU kernel for one query at every length measured (docs/benchmarks.md). Soft-capped logits and sinks
    also take that eager path, as the models' own eager functions define it (soft-cap before the mask; a sink logit
    per head joins the softmax and is then dropped).
    """
    if softcap is None and sinks is None and query.shape[2] > 1:
        gqa = key.shape[0] != query.shape[1]
        return scaled_dot_product_attention(
            query, key.transpose(0, 1), value.transpose(0, 1), attn_mask=mask, scale=scaling, enable_gqa=gqa
        )
    batch, heads, queries, dim = query.shape
    kv_heads, kv_len = key.shape[0], key.shape[2]
    groups = heads // kv_heads
    # Grouped-query heads share their key head: fold the group into the query axis rather than repeat K/V.
    grouped = query.reshape(batch, kv_heads, groups * queries, dim).transpose(0, 1)
    scores = torch.matmul(grouped, key.transpose(2, 3)).view(kv_heads, batch, groups, queries, kv_len)
    scores = scores * (dim**-0.5 if scaling is None else scaling)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores + mask.unsqueeze(0)
    if sinks is None:
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    else:
        sink = sinks.reshape(kv_heads, 1, groups, 1, 1).to(scores.dtype).expand(*scores.shape[:-1], 1)
        combined = torch.cat([scores, sink], dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values
        probs = torch.softmax(combined, dim=-1, dtype=combined.dtype)[..., :-1].to(value.dtype)
    out = torch.matmul(probs.reshape(kv_heads, batch, groups * queries, kv_len), value)
    return out.transpose(0, 1).reshape(batch, heads, queries, value.shape[-1])


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """`query` is `[1, heads, tokens, dim]`; `key`/`value` are every row's gathered blocks, `[rows, kv_heads, columns,
    dim]` (see `PagedLayer.update`), taken heads-first here."""
    plan, window, softcap, sinks = _step_arguments(module, kwargs)
    if plan is None:
        return _unplanned(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    if isinstance(plan, GroupedPlan):
        return _grouped_attention(plan, query, key, value, scaling, window, softcap, sinks), None
    heads, total = query.shape[1], query.shape[2]  # sizes read from tensors, so a compiled step keeps them symbolic
    output = query.new_empty((1, total, heads, value.shape[3]))
    if plan.tables is not None and plan.single_mask is not None:
        if softcap is not None or sinks is not None or isinstance(window, Chunk):  # see `paged_decode.supports`
            raise ValueError(
                "paged decode attention has no soft-capping, sinks or chunks: the model must gather blocks"
            )
        scale = query.shape[3] ** -0.5 if scaling is None else scaling
        own, first = plan.single_mask.query_columns.view(-1), plan.single_mask.first_columns.view(-1)
        output[0] = paged_decode(query[0].transpose(0, 1), key, value, plan.tables, own, first, window, scale)
        return output, None
    if plan.single_mask is not None:
        tokens = query[0].transpose(0, 1)  # [tokens, heads, dim], a view
        if plan.single_rows is None:  # every row decodes, in row order: one token per row
            rows = total
            single_query = tokens.unsqueeze(2)
        else:
            rows = plan.rows
            single_query = query.new_zeros((rows, heads, 1, query.shape[3]))
            single_query[plan.single_rows, :, 0] = tokens[plan.single_tokens]
        mask = plan.single_mask.additive(window, key.shape[2])
        attended = attend(
            single_query, key[:rows].transpose(0, 1), value[:rows].transpose(0, 1), mask, scaling, softcap, sinks
        )
        if plan.single_rows is None:
            output[0] = attended[:, :, 0]
        else:
            output[0, plan.single_tokens] = attended[plan.single_rows, :, 0]
    for chunk in plan.chunks:
        attended = attend(
            query[:, :, chunk.start : chunk.end],
            key[chunk.row : chunk.row + 1, :, : chunk.kv_len].transpose(0, 1),
            value[chunk.row : chunk.row + 1, :, : chunk.kv_len].transpose(0, 1),
            chunk.mask.additive(window, chunk.kv_len),
            scaling,
            softcap,
            sinks,
        )
        output[0, chunk.start : chunk.end] = attended[0].transpose(0, 1)
    return output, None


def _step_arguments(
    module: torch.nn.Module, kwargs: dict[str, Any]
) -> tuple[PackedPlan | GroupedPlan | None, Locality, float | None, torch.Tensor | None]:
    """What transformers passes beside the tensors: the step's plan, and the layer's window (or its chunk, read from
    the module), soft-cap and sinks."""
    window: Locality = kwargs.get("sliding_window")
    if window is None:
        window = getattr(module, CHUNK_ATTRIBUTE, None)
    return kwargs.get(PLAN_KWARG), window, kwargs.get("softcap"), kwargs.get("s_aux")


def _grouped_attention(  # noqa: PLR0913  (attention's own arguments, and the plan)
    plan: GroupedPlan,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float | None,
    window: Locality,
    softcap: float | None,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """Each group's queries gathered into `[rows, heads, queries, dim]`, attended over its rows' blocks (a view:
    the tables put them side by side), and written back to their packed places; padding queries write to the
    extra last token, then dropped."""
    heads, total = query.shape[1], query.shape[2]
    tokens = query[0].transpose(0, 1)  # [tokens, heads, dim], a view
    output = query.new_empty((total + 1, heads, value.shape[3]))
    first = 0
    for group in (plan.singles, plan.chunks):
        rows, queries = group.sources.shape
        grouped = tokens[group.sources].permute(0, 2, 1, 3)  # [rows, heads, queries, dim]
        own_key = key[first : first + rows].transpose(0, 1)
        own_value = value[first : first + rows].transpose(0, 1)
        mask = group.mask.additive(window, key.shape[2])
        attended = attend(grouped, own_key, own_value, mask, scaling, softcap, sinks)
        output[group.targets.reshape(-1)] = attended.transpose(1, 2).reshape(rows * queries, heads, value.shape[3])
        first = first + rows
    return output[:total].unsqueeze(0)


def _unplanned(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """A call outside a step (e.g. `generate` on the same model): SDPA, or the eager path when SDPA cannot do it."""
    softcap, sinks = kwargs.get("softcap"), kwargs.get("s_aux")
    if softcap is None and sinks is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    scaling = kwargs.get("scaling")
    queries, kv_len = query.shape[2], key.shape[2]
    if attention_mask is None:  # sdpa_mask leaves a plain causal mask to SDPA's is_causal
        columns = torch.arange(kv_len, device=query.device)
        rows = torch.arange(kv_len - queries, kv_len, device=query.device)[:, None]
        attention_mask = (columns <= rows)[None, None]
    if attention_mask.dtype == torch.bool:
        additive = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device)
        attention_mask = additive.masked_fill_(~attention_mask, torch.finfo(query.dtype).min)
    out = attend(query, key.transpose(0, 1), value.transpose(0, 1), attention_mask, scaling, softcap, sinks)
    return out.transpose(1, 2).contiguous(), None


def use_packed_attention(model: torch.nn.Module) -> None:
    """Route the model's attention through `packed_attention` (plain SDPA whenever no plan is passed); each chunked
    layer's attention module is marked with its chunk, read once here rather than at every call."""
    for module in model.modules():
        chunk = layer_chunk(module)
        if chunk is not None:
            setattr(module, CHUNK_ATTRIBUTE, chunk)
    AttentionInterface.register(ATTENTION_NAME, packed_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    model.set_attn_implementation(ATTENTION_NAME)  # type: ignore[operator]  # a method, typed as a module
