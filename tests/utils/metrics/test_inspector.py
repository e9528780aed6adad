"""Inside a step: the rows each StepEvent carries are what the runner packed; the grid and the waste meters add up."""

from __future__ import annotations

import math

import pytest

from batching.arrivals import Schedule
from batching.engine.batcher import Batcher
from batching.engine.events import RowKind, StepEvent
from batching.engine.mask_view import ALLOWED, cell_kinds
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams
from batching.runs import RunRecord, ScheduledRun
from tests.engine.helpers import loaded
from utils.charts.inspector import mask_chart, token_grid_chart
from utils.metrics.attention_mask import mask_frame, padded_rectangle
from utils.metrics.inspector import IDLE, PADDING, grid_frame, packed_tokens, step_rows_frame, waste_meters


@pytest.fixture(scope="module")
def llama(tiny_model_dirs):
    return loaded(str(tiny_model_dirs["llama"]))


def _run(llama, mode: str, prompts: list[list[int]], caps: list[int], **options: int) -> tuple[RunRecord, list[int]]:
    """Run the queue; also return how many tokens the runner packed at each step (a spy on the real forward)."""
    batcher = Batcher(llama.model, llama.tokenizer, BatcherOptions(**options), mode=mode)
    packed: list[int] = []
    forward = batcher.runner.forward

    def counting(tokens, padding=None):
        packed.append(sum(len(row) for row in tokens))
        return forward(tokens, padding)

    batcher.runner.forward = counting

    def build(index: int, arrival: float):
        params = RequestParams(caps[index], ignore_eos=True)
        return batcher.builder.build(prompts[index], params, request_id=f"q{index}", arrival=arrival)

    return ScheduledRun(batcher, Schedule.at_once(len(prompts)), build).complete(), packed


PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12], [13, 14], [15, 16, 17, 18, 19, 20, 21], [22]]
CAPS = [2, 4, 7, 1, 3]


@pytest.mark.parametrize("mode", ["continuous", "static"])
def test_the_grid_cells_add_up_to_what_the_runner_packed(llama, mode: str) -> None:
    run, packed = _run(llama, mode, PROMPTS, CAPS, max_batch_size=2, max_batched_tokens=6)
    frame, width = grid_frame(run, {})
    assert width == 1 and len(frame) == len(run.steps) * 2
    per_step = frame.groupby("first_step")[["tokens", "padding"]].sum().sum(axis=1).tolist()
    assert per_step == packed
    for step in run.steps:
        assert sum(row.tokens + row.padding for row in step.rows) == packed[step.index]
        assert sum(row.tokens for row in step.rows if row.kind is RowKind.PREFILL) == step.prefill_tokens
        assert sum(row.tokens for row in step.rows if row.kind is RowKind.DECODE) == step.decode_tokens
    idle = frame[frame["kind"] == IDLE]
    assert (idle["tokens"] == 0).all() and (idle["padding"] == 0).all()


def test_rows_say_which_tokens_at_which_positions(llama) -> None:
    run, _ = _run(
        llama, "continuous", [[5, 6, 7, 8, 9, 10, 11], [12, 13]], [3, 2], max_batch_size=2, max_batched_tokens=4
    )
    first, second = run.steps[0].rows, run.steps[1].rows
    # a budget of 4: the first prompt's chunk takes it all, the second waits for a step
    assert [(r.kind, r.token_ids, r.first_position) for r in first] == [
        (RowKind.PREFILL, (5, 6, 7, 8), 0),
        (RowKind.WAITING, (), 0),
    ]
    assert [(r.kind, r.token_ids, r.first_position) for r in second] == [
        (RowKind.PREFILL, (9, 10, 11), 4),
        (RowKind.PREFILL, (12,), 0),
    ]
    decode = [row for step in run.steps for row in step.rows if row.kind is RowKind.DECODE and row.request_id == "q0"]
    assert [row.first_position for row in decode] == [7, 8]  # the last token fed sits after the prompt's 7
    assert all(step.token_budget == 4 for step in run.steps)


def test_static_padding_is_each_waves_left_padding_and_held_slots(llama) -> None:
    run, _ = _run(llama, "static", PROMPTS, CAPS, max_batch_size=2)
    prefills = [step for step in run.steps if any(row.kind is RowKind.PREFILL for row in step.rows)]
    waves = [PROMPTS[0:2], PROMPTS[2:4], PROMPTS[4:5]]
    assert len(prefills) == len(waves)
    for step, wave in zip(prefills, waves, strict=True):
        longest = max(len(prompt) for prompt in wave)
        assert [row.padding for row in step.rows] == [longest - len(prompt) for prompt in wave]
    held = [row for step in run.steps for row in step.rows if row.kind is RowKind.HELD]
    assert held and all(row.padding == 1 and row.tokens == 0 for row in held)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        # step 1 prefills both (3 + 5 tokens, 2 of padding for the shorter in static), step 2 decodes both,
        # steps 3-4 decode the second while the first is done: free (continuous) or held (static)
        ("continuous", {"steps": 4, "slot_steps": 8, "used": 6, "held": 0, "padding": 0, "tokens": [8, 2, 1, 1]}),
        ("static", {"steps": 4, "slot_steps": 8, "used": 6, "held": 2, "padding": 4, "tokens": [8, 2, 1, 1]}),
    ],
)
def test_the_waste_meters_match_hand_counts(llama, mode: str, expected: dict) -> None:
    run, _ = _run(llama, mode, [[5, 6, 7], [8, 9, 10, 11, 12]], [2, 4], max_batch_size=2, max_batched_tokens=64)
    meters = waste_meters(run)
    assert meters.steps == expected["steps"] and meters.slot_steps == expected["slot_steps"]
    assert meters.slot_steps_used == expected["used"] and meters.slot_steps_held == expected["held"]
    assert meters.padding_tokens == expected["padding"]
    tokens = expected["tokens"]
    assert meters.tokens_per_step_mean == sum(tokens) / len(tokens) and meters.tokens_per_step_max == max(tokens)
    assert math.isclose(meters.budget_fill_mean, sum(tokens) / len(tokens) / 64)
    assert meters.slot_use == expected["used"] / expected["slot_steps"]


def test_long_runs_group_steps_into_at_most_the_columns_asked_for(llama) -> None:
    run, _ = _run(llama, "static", PROMPTS * 4, [12] * 20, max_batch_size=2)
    frame, width = grid_frame(run, {}, max_columns=10)
    assert width == math.ceil(len(run.steps) / 10) > 1
    assert frame["column"].nunique() <= 10
    assert frame["tokens"].sum() + frame["padding"].sum() == sum(
        r.tokens + r.padding for s in run.steps for r in s.rows
    )
    assert set(frame["kind"]) <= {"prefill", "decode", "held", PADDING, "waiting", IDLE}
    spec = token_grid_chart(frame, 2, width).to_dict()
    assert "per column" in spec["encoding"]["x"]["title"]


def test_one_steps_rows_and_packed_sequence_in_packed_order(llama) -> None:
    run, _ = _run(llama, "static", [[5, 6, 7], [8, 9, 10, 11, 12]], [2, 4], max_batch_size=2)
    labels = {"q0": "#1", "q1": "#2"}
    rows = step_rows_frame(run.steps[0], labels)
    assert rows.to_dict("records") == [
        {"request": "#1", "slot": 1, "kind": "prefill", "tokens": 3, "padding": 2, "positions": "0–2", "packed": "0–4"},
        {"request": "#2", "slot": 2, "kind": "prefill", "tokens": 5, "padding": 0, "positions": "0–4", "packed": "5–9"},
    ]
    sequence = packed_tokens(run.steps[0], labels, lambda ids: f"<{ids[0]}>")
    assert sequence[:3] == [("#1", "␣pad"), ("#1", "␣pad"), ("#1", "<5>")]
    assert [text for _, text in sequence[5:]] == ["<8>", "<9>", "<10>", "<11>", "<12>"]


def test_step_detail_can_be_switched_off(llama) -> None:
    batcher = Batcher(llama.model, llama.tokenizer, BatcherOptions(step_detail=False))
    batcher.add([5, 6, 7], RequestParams(3))
    steps = [event for event in batcher.run() if isinstance(event, StepEvent)]
    assert steps and all(step.rows == () for step in steps)


def test_the_benchmark_plot_gains_a_token_grid_per_mode(llama) -> None:
    from batching.bench.plot import bench_chart

    runs = {mode: _run(llama, mode, PROMPTS, CAPS, max_batch_size=2)[0] for mode in ("static", "continuous")}
    spec = bench_chart(runs, slots=2, title="grid").to_dict()
    titles = [row.get("title", {}) for row in spec["vconcat"]]
    assert len(spec["vconcat"]) == 4
    assert [title for title in titles if isinstance(title, str)] == [
        "static: what each slot did",
        "continuous: what each slot did",
    ]


def test_a_static_waves_padded_rectangle_counts_left_padding_and_held_padding(llama) -> None:
    run, _ = _run(llama, "static", [[5, 6, 7], [8, 9, 10, 11, 12]], [2, 4], max_batch_size=2)
    shapes = [padded_rectangle(run, number) for number in range(len(run.steps))]
    # 2 rows: 5 columns after the prefill (2 of them left padding), then one column per step; the first request
    # is done after 2 steps and computes a padding token in each of the last two
    assert [(r.rows, r.columns, r.padding) for r in shapes] == [(2, 5, 2), (2, 6, 2), (2, 7, 3), (2, 8, 4)]
    assert shapes[-1].padding == waste_meters(run).padding_tokens and shapes[0].padding_share == 0.2


def test_the_mask_frame_labels_queries_and_keys_and_samples_big_steps(llama) -> None:
    run, _ = _run(llama, "static", [[5, 6, 7], [8, 9, 10, 11, 12]], [2, 4], max_batch_size=2)
    labels = {"q0": "#1", "q1": "#2"}
    frame, stride = mask_frame(run.steps[0], labels, None)
    assert stride == 1 and len(frame) == 10 * 10
    first = frame[frame["query"] == 2].iloc[0]  # the first real token of #1, after 2 columns of padding
    assert first["query_token"] == "#1 · position 0" and first["kind"] == "padding"
    assert frame[frame["query"] == 0]["query_token"].iloc[0] == "#1 · padding"
    assert frame[(frame["query"] == 5) & (frame["key"] == 5)]["key_column"].iloc[0] == "#2 · column 0"
    kinds = cell_kinds(run.steps[0].mask, None)
    assert (frame["kind"] == "allowed").sum() == (kinds == ALLOWED).sum() == 2 + 6 + 15  # pads see themselves
    sampled, stride = mask_frame(run.steps[0], labels, None, limit=30)
    assert stride == 2 and len(sampled) == 5 * 5 <= 30
    every_other = ["#1 · padding", "#1 · position 0", "#1 · position 2", "#2 · position 1", "#2 · position 3"]
    assert sampled["query_token"].tolist()[::5] == every_other
    spec = mask_chart(sampled, stride).to_dict()
    assert "(1 in 2)" in spec["encoding"]["y"]["title"]
