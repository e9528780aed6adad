"""The load sweep view in AppTest: its defaults, bad input said inline, a sweep of the queue run to the end with its
headline, charts, table and downloads, and the queue as an empty mix refused."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from streamlit.dataframe_util import convert_arrow_bytes_to_pandas_df
from streamlit.testing.v1 import AppTest

from app.sweep.run import QUEUE
from tests.app.test_app import add, button, open_app, tiny_env  # noqa: F401 (a fixture)

SWEEP = "app/sweep/page.py"


def open_sweep() -> AppTest:
    at = open_app()
    at.switch_page(SWEEP).run()
    assert not at.exception, at.exception
    return at


def charts(at: AppTest) -> dict[str, pd.DataFrame]:
    """Each chart's data by its title."""
    found = {}
    for element in at.get("vega_lite_chart"):
        spec = json.loads(element.proto.spec)
        frames = [convert_arrow_bytes_to_pandas_df(dataset.data.data) for dataset in element.proto.datasets]
        title = spec.get("title")
        found[title if isinstance(title, str) else str(title)] = pd.concat(frames, ignore_index=True)
    return found


def test_the_sweep_view_opens_on_its_defaults_with_nothing_run(tiny_env: Path) -> None:  # noqa: F811
    at = open_sweep()
    assert at.text_input(key="sweep_rates").value == "auto"
    assert at.number_input(key="sweep_requests").value == 48
    assert (at.number_input(key="sweep_ttft").value, at.number_input(key="sweep_tpot").value) == (200, 100)
    assert at.selectbox(key="sweep_mix").value == "seed-lab"
    assert not button(at, "Run sweep").disabled and button(at, "Stop").disabled
    assert not at.get("vega_lite_chart") and "sweep_run" not in at.session_state


def test_a_bad_rate_list_is_said_inline_and_run_is_off(tiny_env: Path) -> None:  # noqa: F811
    at = open_sweep()
    at.text_input(key="sweep_rates").set_value("2, fast").run()
    assert [error.value for error in at.error] == ["request rate 'fast' is not a number: write rates like 2, 4, 8"]
    assert button(at, "Run sweep").disabled


def test_a_sweep_of_the_queue_runs_every_rate_on_both_lanes_and_draws_the_headline_and_charts(
    tiny_env: Path,  # noqa: F811
) -> None:
    at = open_app()
    for index in range(3):
        add(at, f"sweep prompt {index}")
    at.switch_page(SWEEP).run()
    at.selectbox(key="sweep_mix").set_value(QUEUE)
    at.text_input(key="sweep_rates").set_value("500, 5")
    at.number_input(key="sweep_requests").set_value(6).run()
    button(at, "Run sweep").click().run()
    assert not at.exception, at.exception
    sweep = at.session_state.sweep_run.run
    assert sweep.completed and sweep.spec.rates == (5.0, 500.0)
    assert [(p.series, p.rate, p.completed) for p in sweep.points] == [
        ("continuous", 5.0, 6),
        ("static", 5.0, 6),
        ("continuous", 500.0, 6),
        ("static", 500.0, 6),
    ]
    (headline,) = [element.value for element in at.success]
    assert headline.startswith("At TTFT p90 ≤ 200 ms and TPOT p90 ≤ 100 ms, ")
    drawn = charts(at)
    assert set(drawn) == {
        "TTFT (p50, p90, p99) against the request rate",
        "TPOT (p90) against the request rate",
        "E2E latency (p90) against the request rate",
        "Output tokens/s against the request rate",
        "SLO attainment against the request rate",
    }
    ttft = drawn["TTFT (p50, p90, p99) against the request rate"]
    lines = ttft.dropna(subset=["stat"])
    assert set(zip(lines["series"], lines["rate"], strict=True)) == {
        (mode, rate) for mode in ("continuous", "static") for rate in (5.0, 500.0)
    }
    assert set(lines["stat"]) == {"p50", "p90", "p99"}
    (table,) = [frame.value for frame in at.dataframe]
    assert len(table) == 4 and table["served"].tolist() == ["6/6"] * 4
    assert [b.label for b in at.get("download_button")] == ["Points (CSV)", "Everything (JSON)"]
    assert at.session_state.sweep_run.setup["mix"] == QUEUE
    assert not button(at, "Run sweep").disabled and button(at, "Stop").disabled


def test_the_queue_as_the_mix_when_it_is_empty_is_refused_and_nothing_runs(tiny_env: Path) -> None:  # noqa: F811
    at = open_sweep()
    at.selectbox(key="sweep_mix").set_value(QUEUE).run()
    button(at, "Run sweep").click().run()
    assert any("the prompt mix is empty" in error.value for error in at.error)
    assert "sweep_run" not in at.session_state
