"""The comparison table, the speed-up and the CSV/JSON exports, on hand-made runs."""

from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import replace

import pandas as pd
import pytest

from batching.runs import RunRecord
from tests.helpers import ROOT
from utils import export
from utils.metrics.run import summarize


def test_comparison_table_shows_each_runs_figures(static_run: RunRecord, shared_run: RunRecord) -> None:
    summaries = {"continuous": summarize(shared_run), "static": summarize(static_run)}
    table = export.comparison_frame(summaries)
    assert table.loc["wall time (s)"].tolist() == ["0.20", "0.30"]
    assert table.loc["output tokens"].tolist() == ["2", "3"]
    assert table.loc["mean occupancy", "static"] == "67%"  # 2/2, then 1/2 twice
    assert table.loc["engine steps"].tolist() == ["2", "3"]


def test_speedup_is_static_wall_time_over_continuous(static_run: RunRecord, shared_run: RunRecord) -> None:
    factor = export.speedup(summarize(shared_run), summarize(static_run))
    assert factor == pytest.approx(1.5)
    assert export.speedup_sentence(factor) == "continuous finished 1.5× faster"
    assert export.speedup_sentence(0.5) == "static finished 2.0× faster"
    assert "no comparison" in export.speedup_sentence(math.nan)


def test_csv_exports_hold_every_request_and_step_of_both_runs(static_run: RunRecord, shared_run: RunRecord) -> None:
    runs = {"continuous": shared_run, "static": static_run}
    labels = {"s1/1": "#1", "s1/2": "#2", "a": "#1", "b": "#2"}
    requests = export.requests_table(runs, labels, {"s1/1": "first?", "a": "first?"})
    assert requests.groupby("run").size().to_dict() == {"continuous": 2, "static": 2}
    assert requests.loc[0, ["request", "prompt", "answer"]].tolist() == ["#1", "first?", "answer of s1/1"]
    steps = export.steps_table(runs, labels)
    assert steps["slot_contents"].tolist() == ["#1 | - | other", "#2 | - | other", "#1 | #2", "#1 | #2", "#1 | #2"]
    text = export.to_csv(requests).decode("utf-8")
    assert text.splitlines()[0].startswith('"run","request","prompt","request_id"')
    assert len(pd.read_csv(io.StringIO(text))) == 4


def test_json_export_is_valid_json_with_summaries_and_no_nan(static_run: RunRecord, shared_run: RunRecord) -> None:
    runs = {"continuous": shared_run, "static": static_run}
    document = json.loads(export.to_json(runs, {}, {}, {"batch_size": 2}))
    assert document["setup"] == {"batch_size": 2}
    assert set(document["runs"]) == {"continuous", "static"}
    assert document["runs"]["static"]["summary"]["output_tokens"] == 3
    assert document["runs"]["continuous"]["summary"]["tpot_s"]["p50"] is None  # NaN -> null
    assert len(document["runs"]["static"]["steps"]) == 3
    assert document["speedup"] == pytest.approx(1.5)


FORMULAS = ['=HYPERLINK("http://evil.example","click me")', "+1+2", "-3+4", "@SUM(A1:A9)", "\t=1", "\r=1"]


def test_csv_exports_neutralise_formulas_in_prompts_answers_and_steps_and_json_keeps_them(
    static_run: RunRecord,
) -> None:
    """OWASP's CSV-injection advice: a text cell starting with = + - @ tab or CR gets a leading ' in the CSV."""
    runs = {"static": static_run}
    static_run.finished[0] = replace(static_run.finished[0], text=" =1+1")  # an answer that looks like a formula
    labels = {"a": "#1", "b": "#2"}
    prompts = {"a": FORMULAS[0], "b": "fine, = inside is harmless"}
    for table in (export.requests_table(runs, labels, prompts), export.steps_table(runs, {"a": "-a"})):
        rows = list(csv.DictReader(io.StringIO(export.to_csv(table).decode("utf-8"))))
        for row, (_, source) in zip(rows, table.iterrows(), strict=True):
            for column, value in source.items():
                shown = row[column]
                if isinstance(value, str) and value[:1] in "=+-@\t\r":
                    assert shown == "'" + value, (column, value, shown)
                elif isinstance(value, str):
                    assert shown == value
    steps = list(csv.DictReader(io.StringIO(export.to_csv(export.steps_table(runs, {"a": "-a"})).decode())))
    assert steps[0]["slot_contents"] == "'-a | other"
    requests = list(csv.DictReader(io.StringIO(export.to_csv(export.requests_table(runs, labels, prompts)).decode())))
    assert requests[0]["prompt"] == "'" + FORMULAS[0] and requests[0]["answer"] == "'=1+1"
    assert requests[1]["prompt"] == "fine, = inside is harmless"
    document = json.loads(export.to_json(runs, labels, prompts, {}))
    assert document["runs"]["static"]["requests"][0]["prompt"] == FORMULAS[0]  # the JSON stays exact
    assert document["runs"]["static"]["requests"][0]["answer"] == "=1+1"


@pytest.mark.parametrize("cell", FORMULAS)
def test_each_formula_start_is_neutralised_and_numbers_are_left_alone(cell: str) -> None:
    text = export.to_csv(pd.DataFrame({"prompt": [cell], "slot": [-1]})).decode("utf-8")
    (row,) = csv.DictReader(io.StringIO(text))
    assert row == {"prompt": "'" + cell, "slot": "-1"}


def test_the_export_module_is_the_only_csv_writer_in_the_repository() -> None:
    """Every CSV the app or the CLI writes goes through export.to_csv, so the neutralisation covers them all."""
    sources = [ROOT / "streamlit_app.py"] + [
        path for folder in ("batching", "config", "model", "utils") for path in (ROOT / folder).rglob("*.py")
    ]
    assert len(sources) > 30
    writers = re.compile(r"(?<!export)\.to_csv\(|csv\.writer\(|csv\.DictWriter\(")
    found = sorted(str(path.relative_to(ROOT)) for path in sources if writers.search(path.read_text(encoding="utf-8")))
    assert found == ["utils/export.py"]
