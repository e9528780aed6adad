"""KV memory as the page shows it: the pool by state, block tables, positions holding tokens against reserved,
preemptions and prefix hits, and the waste meter "KV reserved but never used"."""

from __future__ import annotations

import math

import pytest

from batching.engine.batcher import Batcher
from batching.engine.blocks import PoolUsage
from batching.engine.events import MemoryView, StepEvent
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams
from batching.runs import RunRecord
from tests.engine.helpers import loaded
from utils.charts.inspector import token_grid_chart
from utils.charts.memory import memory_steps_chart, pool_chart
from utils.metrics.inspector import PREFIX_HIT, RECOMPUTED, grid_frame, waste_meters
from utils.metrics.memory import (
    CACHED,
    FREE,
    HOLDING,
    IN_USE,
    RESERVED,
    SHARED,
    block_tables_frame,
    holding,
    last_memory,
    memory_numbers,
    memory_steps_frame,
    peak_memory,
    pool_frame,
    unused,
)


@pytest.fixture(scope="module")
def llama(tiny_model_dirs):
    return loaded(str(tiny_model_dirs["llama"]))


def _view(in_use: int, tokens: int, shared: int = 0, cached: int = 0, total: int = 10, tables=()) -> MemoryView:
    usage = PoolUsage(total, in_use, shared, cached, total - in_use - cached)
    return MemoryView(4, usage, tokens, tables)


def _record(*views: MemoryView) -> RunRecord:
    record = RunRecord("continuous", 0.0)
    for index, view in enumerate(views):
        record.add(StepEvent(index, float(index), index + 0.5, ("a",), 1, 0, memory=view))
    return record


def _run(llama, mode: str, prompts: list[list[int]], caps: list[int], options: BatcherOptions) -> RunRecord:
    batcher = Batcher(llama.model, llama.tokenizer, options, mode=mode)
    for prompt, cap in zip(prompts, caps, strict=True):
        batcher.add(prompt, RequestParams(cap, ignore_eos=True))
    record = RunRecord(mode, 0.0)
    record.extend(batcher.run())
    return record


def test_the_pool_waffle_has_one_square_per_block_by_state() -> None:
    frame = pool_frame(_view(in_use=5, tokens=17, shared=2, cached=3, total=12), columns=4)
    assert len(frame) == 12 and frame["block"].tolist() == list(range(12))
    assert frame["state"].tolist() == [SHARED] * 2 + [IN_USE] * 3 + [CACHED] * 3 + [FREE] * 4
    assert frame["row"].tolist() == [n // 4 for n in range(12)] and frame["column"].tolist() == [
        n % 4 for n in range(12)
    ]
    assert pool_chart(frame).to_dict()["mark"]["type"] == "square"


def test_block_tables_list_each_requests_blocks_and_count_those_another_request_holds() -> None:
    view = _view(in_use=4, tokens=12, shared=1, tables=(("r1", (0, 1)), ("r2", (0, 2, 3)), ("elsewhere", (5,))))
    frame = block_tables_frame(view, {"r1": "#1", "r2": "#2"})
    assert frame.to_dict("records") == [
        {"request": "#1", "blocks": 2, "shared": 1, "table": "0 1"},
        {"request": "#2", "blocks": 3, "shared": 1, "table": "0 2 3"},
        {"request": "other user", "blocks": 1, "shared": 0, "table": "5"},
    ]


def test_positions_over_steps_put_holding_next_to_reserved() -> None:
    record = _record(_view(in_use=2, tokens=5), _view(in_use=3, tokens=10))
    frame = memory_steps_frame(record)
    assert frame.to_dict("records") == [
        {"step": 1, "kind": HOLDING, "positions": 5},
        {"step": 1, "kind": RESERVED, "positions": 8},
        {"step": 2, "kind": HOLDING, "positions": 10},
        {"step": 2, "kind": RESERVED, "positions": 12},
    ]
    assert memory_steps_chart(frame, x_max=4).to_dict()["encoding"]["x"]["scale"]["domain"] == [1, 4]


def test_numbers_read_the_latest_step_and_the_peak() -> None:
    record = _record(_view(in_use=2, tokens=5), _view(in_use=7, tokens=20), _view(in_use=1, tokens=3))
    numbers = memory_numbers(record)
    assert numbers is not None
    assert (numbers.blocks, numbers.in_use, numbers.peak_in_use) == (10, 1, 7)
    assert peak_memory(record) is record.steps[1].memory and last_memory(record) is record.steps[2].memory
    assert "1 of 10 blocks held" in numbers.line() and "peak 7" in numbers.line()
    assert memory_numbers(RunRecord("static", 0.0)) is None


def test_kv_reserved_but_never_used_sums_reserved_minus_holding_over_steps() -> None:
    # blocks of 4: 8 reserved, 5 holding (3 unused); then 12 reserved, 10 holding (2 unused)
    meters = waste_meters(_record(_view(in_use=2, tokens=5), _view(in_use=3, tokens=10)))
    assert meters.kv_reserved == 20 and meters.kv_reserved_unused == 5
    assert meters.kv_unused_share == 0.25 and meters.as_dict()["kv_unused_share"] == 0.25
    assert math.isnan(waste_meters(RunRecord("static", 0.0)).kv_unused_share)


def test_static_waves_reserve_more_than_they_use_and_continuous_takes_blocks_as_tokens_arrive(llama) -> None:
    prompts, caps = [[5, 6, 7], [8, 9, 10, 11, 12], [13, 14], [15, 16, 17, 18, 19, 20, 21]], [2, 12, 3, 9]
    runs = {
        mode: _run(llama, mode, prompts, caps, BatcherOptions(max_batch_size=4, block_size=4, kv_blocks=32))
        for mode in ("continuous", "static")
    }
    meters = {mode: waste_meters(run) for mode, run in runs.items()}
    assert meters["static"].kv_reserved_unused > meters["continuous"].kv_reserved_unused
    # continuous holds at most one partly filled block per request: at most block_size - 1 unused positions each
    for event in runs["continuous"].steps:
        assert event.memory is not None
        assert event.memory.reserved - event.memory.tokens <= 3 * len(event.memory.tables)
    for run in runs.values():  # the pool grows, then every block comes back
        numbers = memory_numbers(run)
        assert numbers is not None and numbers.peak_in_use > 0 and numbers.in_use == 0
        assert numbers.blocks == 32 and len(pool_frame(last_memory(run) or runs["static"].steps[0].memory)) == 32


def test_a_tight_pool_shows_preemptions(llama) -> None:
    options = BatcherOptions(max_batch_size=2, max_batched_tokens=16, block_size=4, kv_blocks=8)
    run = _run(llama, "continuous", [[5] * 6, [7] * 6], [20, 20], options)
    numbers = memory_numbers(run)
    assert numbers is not None and numbers.preemptions == len(run.preempted) >= 1
    assert "1 preemption" in numbers.line() or f"{numbers.preemptions} preemptions" in numbers.line()


def test_the_token_grid_marks_tokens_recomputed_after_a_preemption(llama) -> None:
    options = BatcherOptions(max_batch_size=2, max_batched_tokens=16, block_size=4, kv_blocks=8)
    run = _run(llama, "continuous", [[5] * 6, [7] * 6], [20, 20], options)
    frame, _ = grid_frame(run, {"r1": "#2"})
    marked = frame[frame["mark"] == RECOMPUTED]
    preempted = {event.request_id for event in run.preempted}
    assert len(marked) >= 1 and preempted
    # the marked cells are the returning request's chunks, starting below what it had computed (its own cached
    # full blocks are a hit: the rest is computed again)
    steps = {(row.request_id, row.first_position) for _, cell in marked.iterrows() for row in _rows(run, cell)}
    assert {request for request, _ in steps} == preempted
    assert min(position for _, position in steps) < min(event.recompute for event in run.preempted)
    assert (frame["mark"] != PREFIX_HIT).all()
    spec = token_grid_chart(frame, 2, 1).to_dict()
    assert spec["encoding"]["stroke"]["scale"]["domain"] == ["", RECOMPUTED, PREFIX_HIT]


def test_the_token_grid_marks_a_first_prompt_chunk_after_a_prefix_hit(llama) -> None:
    batcher = Batcher(llama.model, llama.tokenizer, BatcherOptions(max_batch_size=2, block_size=4), mode="continuous")
    shared = list(range(20, 33))  # 13 tokens: three full blocks of 4 are cached after the first request
    record = RunRecord("continuous", 0.0)
    batcher.add([*shared, 40], RequestParams(2, ignore_eos=True), request_id="first")
    record.extend(batcher.run())
    batcher.add([*shared, 41, 42], RequestParams(2, ignore_eos=True), request_id="second")
    record.extend(batcher.run())
    frame, _ = grid_frame(record, {})
    hits = frame[frame["mark"] == PREFIX_HIT]
    assert len(hits) == 1 and hits.iloc[0]["positions"].startswith("12–")  # positions 0-11 came from the cache
    assert (frame["mark"] != RECOMPUTED).all()


def _rows(run: RunRecord, cell) -> list:
    """The rows of the step and slot a grid cell stands for (one step per column here)."""
    step = run.steps[int(cell["first_step"])]
    return [row for row in step.rows if row.slot == int(cell["slot"]) - 1]


def test_a_block_shared_after_a_prefix_hit_holds_its_tokens_once() -> None:
    # blocks of 4: r1 and r2 share block 0 (full), each has one block of its own; 4 + 3 and 4 + 2 tokens in rows,
    # which the engine reports as 9 positions holding tokens (the shared block once)
    view = _view(in_use=3, tokens=9, shared=1, tables=(("r1", (0, 1)), ("r2", (0, 2))))
    assert view.reserved == 12 and holding(view) == 9 and unused(view) == 3
    assert memory_steps_frame(_record(view))["positions"].tolist() == [9, 12]
    assert waste_meters(_record(view)).kv_reserved_unused == 3
