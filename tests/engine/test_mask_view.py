"""The attention mask a StepEvent describes is the mask attention really received, row by row and window by window."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from transformers import AttentionInterface

import batching.engine.paged_decode as paged_decode
from batching.engine.attention import ATTENTION_NAME, CHUNK_ATTRIBUTE, Chunk, Locality, PackedPlan, packed_attention
from batching.engine.batcher import Batcher
from batching.engine.events import StepEvent
from batching.engine.mask_view import (
    ALLOWED,
    FUTURE,
    OTHER_ROW,
    OUTSIDE_CHUNK,
    OUTSIDE_WINDOW,
    PADDING,
    MaskRow,
    cell_kinds,
    row_cells,
)
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams
from tests.engine.families import FAMILIES, WINDOW
from tests.engine.helpers import loaded
from tests.tiny_models import save_tiny_models
from utils.metrics.attention_mask import mask_frame

# Per forward pass: for each window a layer passed, the allowed cells of every packed row as attention got them.
Seen = list[dict[Locality, list[torch.Tensor]]]


@pytest.fixture(scope="module")
def llama(tiny_model_dirs):
    """Llama reads through the block tables (the operator loaded here, whatever ran before); Cohere2 gathers."""
    assert paged_decode.load()
    return loaded(str(tiny_model_dirs["llama"]))


def _family_model(tmp_path_factory, name: str):
    family = next(family for family in FAMILIES if family.name == name)
    folders = save_tiny_models(tmp_path_factory.mktemp("mask-models"), {family.name: family.config()})
    return loaded(str(folders[family.name]))


@pytest.fixture(scope="module")
def windowed(tmp_path_factory):
    """Cohere2's tiny config: a window of 8 on the first layer, full attention on the second."""
    return _family_model(tmp_path_factory, "cohere2")


@pytest.fixture(scope="module")
def chunked(tmp_path_factory):
    """Llama 4's tiny config: chunked attention in chunks of 8 on the first layer, full attention on the second."""
    return _family_model(tmp_path_factory, "llama4")


def _packed_rows(plan: PackedPlan, window: Locality) -> list[torch.Tensor]:
    """Each packed row's allowed cells `[queries, kv_len]`, read from the additive masks the plan handed attention.

    A step read through the block tables has one query row per token (a chunk's tokens too): see `_by_request_row`."""
    rows: list[tuple[int, torch.Tensor]] = []
    if plan.single_mask is not None:
        additive = plan.single_mask.additive(window, plan.single_kv_len)  # memoised: the very tensor the layer used
        if plan.single_rows is None:
            pairs = [(row, row) for row in range(plan.rows)]
        else:
            pairs = list(zip(plan.single_rows.tolist(), plan.single_tokens.tolist(), strict=True))
        rows += [(index, additive[row, 0] == 0) for row, index in pairs]
    rows += [(chunk.start, chunk.mask.additive(window, chunk.kv_len)[0, 0] == 0) for chunk in plan.chunks]
    return [allowed for _, allowed in sorted(rows, key=lambda item: item[0])]


@contextmanager
def recording_attention() -> Iterator[Seen]:
    """Wrap the engine's attention function: after each layer's call, keep the masks it was given for its window."""
    seen: Seen = []
    plans: list[PackedPlan] = []

    def record(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        output = packed_attention(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
        plan = kwargs["batchscope_plan"]
        if not plans or plans[-1] is not plan:
            plans.append(plan)
            seen.append({})
        window = kwargs.get("sliding_window") or getattr(module, CHUNK_ATTRIBUTE, None)
        seen[-1][window] = _packed_rows(plan, window)
        return output

    AttentionInterface.register(ATTENTION_NAME, record)
    try:
        yield seen
    finally:
        AttentionInterface.register(ATTENTION_NAME, packed_attention)


def _by_request_row(rows: list[torch.Tensor], described: tuple[MaskRow, ...]) -> list[torch.Tensor]:
    """Per-token query rows (a step read through the block tables: each token attends on its own, over every
    column of the step's tables) joined into the described rows, each cut to its described columns: the columns
    cut off are never allowed."""
    if len(rows) == len(described):
        return rows
    assert sum(row.queries for row in described) == len(rows)
    joined, token = [], 0
    for row in described:
        cells = torch.cat(rows[token : token + row.queries])
        token += row.queries
        assert not cells[:, row.kv_len :].any()
        joined.append(cells[:, : row.kv_len])
    return joined


def _steps(
    loaded_model, mode: str, prompts: list[list[int]], caps: list[int], **options: int
) -> tuple[list[StepEvent], Seen]:
    """Run the queue to the end; also return what attention received at every step."""
    batcher = Batcher(loaded_model.model, loaded_model.tokenizer, BatcherOptions(**options), mode=mode)
    for number, (prompt, cap) in enumerate(zip(prompts, caps, strict=True)):
        batcher.add(prompt, RequestParams(cap, ignore_eos=True), request_id=f"q{number}")
    with recording_attention() as seen:  # after the batcher registered its attention function
        steps = [event for event in batcher.run() if isinstance(event, StepEvent)]
    return steps, seen


def _assert_described_masks_are_the_real_ones(steps: list[StepEvent], seen: Seen) -> None:
    assert len(steps) == len(seen)
    for step, real in zip(steps, seen, strict=True):
        mask = step.mask
        assert mask is not None
        assert set(mask.windows) == set(real)  # every window a layer used, and no other
        with_tokens = [row for row in step.rows if row.tokens + row.padding]
        assert [row.tokens + row.padding for row in with_tokens] == [row.queries for row in mask.rows]
        for window, rows in real.items():
            rows = _by_request_row(rows, mask.rows)
            assert len(rows) == len(mask.rows)
            for described, allowed in zip(mask.rows, rows, strict=True):
                assert torch.equal(row_cells(described, window) == ALLOWED, allowed), (step.index, window, described)
            dense = torch.block_diag(*rows)  # another row's keys are never allowed
            kinds = cell_kinds(mask, window)
            assert torch.equal(kinds == ALLOWED, dense)
            for stride in (2, 3):  # a sampled picture computes only its own cells: the same ones
                assert torch.equal(cell_kinds(mask, window, stride), kinds[::stride, ::stride])


PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [14, 15], [16, 17, 18, 19, 20], [21], [22, 23, 24, 25, 26, 27, 28], [29]]
CAPS = [6, 3, 9, 2, 4, 5]


def test_continuous_steps_describe_their_chunk_and_decode_masks_exactly(llama) -> None:
    steps, seen = _steps(llama, "continuous", PROMPTS, CAPS, max_batch_size=3, max_batched_tokens=6)
    _assert_described_masks_are_the_real_ones(steps, seen)
    mixed = [s for s in steps if s.mask and {r.batched for r in s.mask.rows} == {True, False}]
    assert mixed, "no step packed a prompt chunk next to decode rows"
    assert any(row.first_column > 0 for step in mixed for row in step.mask.rows if not row.batched)  # a later chunk


def test_static_steps_describe_their_padding_exactly(llama) -> None:
    steps, seen = _steps(llama, "static", PROMPTS, CAPS, max_batch_size=3)
    _assert_described_masks_are_the_real_ones(steps, seen)
    assert any(row.padding for step in steps for row in step.mask.rows)


@pytest.mark.parametrize("mode", ["continuous", "static"])
def test_a_sliding_window_models_masks_are_described_per_window(windowed, mode: str) -> None:
    prompts = [list(range(5, 5 + 14)), list(range(30, 30 + 3)), list(range(40, 40 + 11))]
    steps, seen = _steps(windowed, mode, prompts, [12, 15, 4], max_batch_size=2, max_batched_tokens=5)
    _assert_described_masks_are_the_real_ones(steps, seen)
    assert steps[0].mask.windows == (WINDOW, None)
    cut = [step for step in steps if (cell_kinds(step.mask, WINDOW) == OUTSIDE_WINDOW).any()]
    assert cut, "no step reached past the window"
    kinds = {window: set(mask_frame(cut[0], {}, window)[0]["kind"]) for window in (WINDOW, None)}
    assert "outside the window" in kinds[WINDOW] and "outside the window" not in kinds[None]


@pytest.mark.parametrize("mode", ["continuous", "static"])
def test_a_chunked_attention_models_masks_are_described_per_chunk(chunked, mode: str) -> None:
    prompts = [list(range(5, 5 + 14)), list(range(30, 30 + 3)), list(range(40, 40 + 11))]
    steps, seen = _steps(chunked, mode, prompts, [12, 15, 4], max_batch_size=2, max_batched_tokens=5)
    _assert_described_masks_are_the_real_ones(steps, seen)
    assert steps[0].mask.windows == (Chunk(WINDOW), None)
    cut = [step for step in steps if (cell_kinds(step.mask, Chunk(WINDOW)) == OUTSIDE_CHUNK).any()]
    assert cut, "no step reached a second chunk"
    kinds = {window: set(mask_frame(cut[0], {}, window)[0]["kind"]) for window in (Chunk(WINDOW), None)}
    assert "an earlier chunk" in kinds[Chunk(WINDOW)] and "an earlier chunk" not in kinds[None]


def test_a_chunked_rows_chunks_count_from_its_first_real_position() -> None:
    # A static wave's row with 3 columns of left padding, at columns 3-12 (positions 0-9), chunks of 4 positions:
    # the query at column 12 (position 9) sees positions 8-9 only (columns 11-12).
    row = MaskRow(0, 12, 1, 13, 3, True)
    a, p, c = ALLOWED, PADDING, OUTSIDE_CHUNK
    assert row_cells(row, Chunk(4)).tolist() == [[p, p, p, c, c, c, c, c, c, c, c, a, a]]


def test_a_static_prefill_mask_by_hand(llama) -> None:
    # Blocks of two positions: a batched call reads its rows' whole blocks, here exactly the 6 columns in use.
    steps, _ = _steps(llama, "static", [[5, 6, 7], [8, 9, 10, 11, 12]], [2, 1], max_batch_size=2, block_size=2)
    first = steps[0].mask
    assert first.rows == (MaskRow(0, 0, 5, 5, 2, False), MaskRow(1, 0, 5, 5, 0, False))
    a, f, o, p = ALLOWED, FUTURE, OTHER_ROW, PADDING
    assert cell_kinds(first, None).tolist() == [
        [a, f, f, f, f, o, o, o, o, o],  # a padding query sees itself only
        [p, a, f, f, f, o, o, o, o, o],
        [p, p, a, f, f, o, o, o, o, o],  # the first real token: padding hidden
        [p, p, a, a, f, o, o, o, o, o],
        [p, p, a, a, a, o, o, o, o, o],
        [o, o, o, o, o, a, f, f, f, f],
        [o, o, o, o, o, a, a, f, f, f],
        [o, o, o, o, o, a, a, a, f, f],
        [o, o, o, o, o, a, a, a, a, f],
        [o, o, o, o, o, a, a, a, a, a],
    ]
    # the next step decodes both in one batched call over 6 columns; the first row's padding stays hidden
    assert steps[1].mask.rows == (MaskRow(0, 5, 1, 6, 2, True), MaskRow(1, 5, 1, 6, 0, True))
    assert cell_kinds(steps[1].mask, None, stride=1).tolist() == [
        [p, p, a, a, a, a, o, o, o, o, o, o],
        [o, o, o, o, o, o, a, a, a, a, a, a],
    ]


def test_no_mask_is_described_without_step_detail(llama) -> None:
    batcher = Batcher(llama.model, llama.tokenizer, BatcherOptions(step_detail=False))
    batcher.add([5, 6, 7], RequestParams(3))
    steps = [event for event in batcher.run() if isinstance(event, StepEvent)]
    assert steps and all(step.mask is None for step in steps)
