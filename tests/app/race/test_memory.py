"""The race's KV memory in AppTest: both lanes' block pools side by side on the same budget (the sidebar's KV
memory), their positions over the steps and block tables, and the waste meter "KV reserved but never used"."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from streamlit.dataframe_util import convert_arrow_bytes_to_pandas_df
from streamlit.testing.v1 import AppTest

from app.race.memory import HEADER, TABLES_PEAK
from batching.engine.events import WaitReason
from tests.app.test_app import add, generate, open_app, race_run, tiny_env  # noqa: F401 (a fixture)
from utils.charts.memory import STEPS_TITLE
from utils.metrics.memory import BLOCK_STATES, HOLDING, RESERVED, memory_numbers

WAIT_STATES = {reason.value for reason in WaitReason}
WAIT_TABLE = "why requests waited (request-steps)"

BLOCK = 16  # the settings' block size


def charts(at: AppTest) -> list[tuple[dict, pd.DataFrame]]:
    found = []
    for element in at.get("vega_lite_chart"):
        frames = [convert_arrow_bytes_to_pandas_df(dataset.data.data) for dataset in element.proto.datasets]
        found.append((json.loads(element.proto.spec), pd.concat(frames, ignore_index=True)))
    return found


def race_on(at: AppTest, kv_tokens: int) -> None:
    at.slider(key="batch_size").set_value(3).run()
    at.number_input(key="kv_memory").set_value(kv_tokens).run()
    for index, cap in enumerate([6, 2, 8, 3, 5]):
        add(at, f"memory prompt {index}", cap)
    generate(at, "race")


def test_a_race_shows_both_lanes_pools_on_the_sidebars_kv_memory(tiny_env: Path) -> None:  # noqa: F811
    at = open_app()
    assert at.number_input(key="kv_memory").value == 1024  # the settings' default
    race_on(at, 640)  # 40 blocks: tight enough that a static wave cannot hold every slot's whole reservation
    race = race_run(at)
    assert race.completed
    assert any(header.value == HEADER for header in at.subheader)
    pools = {spec["title"]: frame for spec, frame in charts(at) if str(spec.get("title", "")).endswith("the pool now")}
    assert set(pools) == {"continuous: the pool now", "static: the pool now"}
    for mode, frame in zip(("continuous", "static"), pools.values(), strict=True):
        assert len(frame) == 640 // BLOCK  # the same budget on both lanes, one square per block
        assert set(frame["state"]) <= set(BLOCK_STATES)
        numbers = memory_numbers(race.runs()[mode])
        assert numbers is not None and numbers.blocks == 40 and numbers.peak_in_use > 0
        assert numbers.in_use == 0  # the race is over: every block came back (free or cached)
    assert at.session_state.race_run.setup["engine"]["kv_cache_tokens"] == 640  # what the lanes ran on
    lines = [frame for spec, frame in charts(at) if spec.get("title") == STEPS_TITLE]
    assert len(lines) == 2  # continuous, then static
    for frame in lines:
        assert frame[frame["kind"] == RESERVED]["positions"].max() > 0
        assert frame[frame["kind"] == HOLDING]["positions"].max() > 0
    continuous = lines[0]
    reserved = continuous[continuous["kind"] == RESERVED]["positions"].to_numpy()
    holding = continuous[continuous["kind"] == HOLDING]["positions"].to_numpy()
    assert (reserved >= holding).all()  # continuous: whole blocks around the tokens it holds
    runs = race.runs()
    static_peak = max(e.memory.reserved for e in runs["static"].steps if e.memory)
    continuous_tokens = max(e.memory.tokens for e in runs["continuous"].steps if e.memory)
    assert static_peak > continuous_tokens  # static reserves up front what continuous takes as tokens arrive
    assert sum(caption.value == TABLES_PEAK for caption in at.caption) == 2
    tables = [frame.value for frame in at.dataframe if "table" in frame.value.columns]
    assert len(tables) == 2 and all(len(table) > 0 for table in tables)


def test_the_waste_meters_count_kv_reserved_but_never_used(tiny_env: Path) -> None:  # noqa: F811
    at = open_app()
    race_on(at, 1024)
    metrics = {metric.label: metric.value for metric in at.metric}
    assert metrics["KV reserved, never used"].endswith("%")
    table = next(frame.value for frame in at.dataframe if "KV reserved but never used (share)" in frame.value.index)
    assert table.columns.tolist() == ["continuous", "static"]
    shares = [float(value.rstrip("%")) for value in table.loc["KV reserved but never used (share)"]]
    assert shares[1] > shares[0]  # static's waves reserve far more than they fill


def test_the_scheduler_knobs_reach_the_lanes_and_the_strip_names_why_each_request_waited(
    tiny_env: Path,  # noqa: F811
) -> None:
    at = open_app()
    at.slider(key="token_budget").set_value(20).run()
    at.select_slider(key="block_size").set_value(8).run()
    at.radio(key="admission").set_value("reserve").run()
    race_on(at, 160)  # 20 blocks of 8
    race = race_run(at)
    assert race.completed
    engine = at.session_state.race_run.setup["engine"]
    assert (engine["max_batched_tokens"], engine["block_size"], engine["admission"]) == (20, 8, "reserve")
    runs = race.runs()
    assert all(step.memory and step.memory.preemptions == 0 for step in runs["continuous"].steps)
    strips = [frame for spec, frame in charts(at) if spec.get("title") == "What each request did, step by step"]
    assert len(strips) == 2  # continuous, then static
    for strip, mode in zip(strips, ("continuous", "static"), strict=True):
        waited = {(row.step, row.request_id) for row in strip.itertuples() if row.state in WAIT_STATES}
        want = {(n, w.request_id) for n, step in enumerate(runs[mode].steps, start=1) for w in step.waiting}
        assert waited == want and want, mode
    table = next(frame.value for frame in at.table if frame.value.index.name == WAIT_TABLE)
    assert table.columns.tolist() == ["continuous", "static"]
    assert table.loc["static wave running", "static"] > 0 and table.loc["static wave running", "continuous"] == 0
