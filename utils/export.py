"""A run's figures as tables and files: the comparison table, and CSV/JSON downloads of requests and steps."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping

import pandas as pd

from batching.runs import RunRecord
from model.prompting import extract_answer
from utils.metrics.inspector import WasteMeters, waste_meters
from utils.metrics.run import RunSummary, requests_frame, steps_frame, summarize

# (row label, RunSummary attribute, how to show it)
_FIGURES = (
    ("wall time (s)", "wall_s", "{:.2f}"),
    ("output tokens / s", "tokens_per_s", "{:.1f}"),
    ("mean occupancy", "mean_occupancy", "{:.0%}"),
    ("time to first token p50 (s)", "ttft_p50", "{:.2f}"),
    ("time to first token p99 (s)", "ttft_p99", "{:.2f}"),
    ("latency p50 (s)", "e2e_p50", "{:.2f}"),
    ("latency p99 (s)", "e2e_p99", "{:.2f}"),
    ("output tokens", "output_tokens", "{:d}"),
    ("engine steps", "steps", "{:d}"),
)


# (row label, WasteMeters attribute, how to show it): what of the compute was useful
_WASTE = (
    ("slot-steps doing work", "slot_use", "{:.0%}"),
    ("slot-steps held by finished requests", "slot_steps_held", "{:d}"),
    ("padding tokens computed", "padding_tokens", "{:d}"),
    ("tokens per step (mean)", "tokens_per_step_mean", "{:.1f}"),
    ("token budget filled (mean)", "budget_fill_mean", "{:.1%}"),
    ("KV reserved but never used (position-steps)", "kv_reserved_unused", "{:,d}"),
    ("KV reserved but never used (share)", "kv_unused_share", "{:.0%}"),
)


def comparison_frame(
    summaries: Mapping[str, RunSummary], meters: Mapping[str, WasteMeters] | None = None
) -> pd.DataFrame:
    """One row per figure, one column per run (e.g. continuous, static), values formatted for reading; the waste
    meters below the timings when given (a run recorded without step rows shows them as –)."""
    figures: list[tuple[str, Mapping[str, object], str, str]] = [
        (label, summaries, attribute, form) for label, attribute, form in _FIGURES
    ]
    if meters is not None:
        figures += [(label, meters, attribute, form) for label, attribute, form in _WASTE]
    table = {
        mode: [
            _show(getattr(source[mode], attribute), form) if mode in source else "–"
            for _, source, attribute, form in figures
        ]
        for mode in summaries
    }
    return pd.DataFrame(table, index=pd.Index([label for label, *_ in figures], name="figure"))


def _show(value: float, form: str) -> str:
    return "–" if isinstance(value, float) and math.isnan(value) else form.format(value)


def speedup(continuous: RunSummary, static: RunSummary) -> float:
    """How many times faster the continuous run finished the same queue (static wall time / continuous)."""
    if continuous.wall_s <= 0 or math.isnan(continuous.wall_s) or math.isnan(static.wall_s):
        return math.nan
    return static.wall_s / continuous.wall_s


def speedup_sentence(factor: float) -> str:
    if math.isnan(factor):
        return "no comparison: a run has no duration"
    if factor >= 1:
        return f"continuous finished {factor:.1f}× faster"
    return f"static finished {1 / factor:.1f}× faster"


def requests_table(
    runs: Mapping[str, RunRecord], labels: Mapping[str, str], prompts: Mapping[str, str]
) -> pd.DataFrame:
    """Every finished request of every run: run, request label, prompt, answer, tokens, latencies."""
    frames = []
    for mode, run in runs.items():
        frame = requests_frame(run)
        frame.insert(0, "run", mode)
        frame.insert(1, "request", [labels.get(rid, rid) for rid in frame["request_id"]])
        frame.insert(2, "prompt", [prompts.get(rid, "") for rid in frame["request_id"]])
        frame["answer"] = [extract_answer(text) for text in frame["text"]]
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def steps_table(runs: Mapping[str, RunRecord], labels: Mapping[str, str]) -> pd.DataFrame:
    """Every step of every run, with who sat in each slot (`-` for an empty slot, `other` for others' requests)."""
    frames = []
    for mode, run in runs.items():
        frame = steps_frame(run)
        frame.insert(0, "run", mode)
        frame["slot_contents"] = [
            " | ".join("-" if rid is None else labels.get(rid, "other") for rid in step.slots) for step in run.steps
        ]
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


# A cell starting with one of these is run as a formula by spreadsheets (OWASP, "CSV Injection").
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def neutralise_cell(value: object) -> object:
    """A text cell a spreadsheet would run as a formula gets a leading `'` (shown as text); others are unchanged."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def to_csv(frame: pd.DataFrame) -> bytes:
    """The frame as UTF-8 CSV, as OWASP advises against formula injection: every text cell quoted, and one a
    spreadsheet would run prefixed with `'`. The only CSV writer we have; the JSON export keeps the text exact."""
    safe = frame.copy()
    for column in safe.columns:
        if safe[column].dtype == object or pd.api.types.is_string_dtype(safe[column]):
            safe[column] = safe[column].map(neutralise_cell)
    safe.columns = [neutralise_cell(str(column)) for column in safe.columns]
    return safe.to_csv(index=False, quoting=csv.QUOTE_NONNUMERIC).encode("utf-8")


def to_json(
    runs: Mapping[str, RunRecord], labels: Mapping[str, str], prompts: Mapping[str, str], setup: Mapping[str, object]
) -> bytes:
    """Setup, summary, requests and steps of each run in one document (NaN written as null)."""
    requests = requests_table(runs, labels, prompts)
    steps = steps_table(runs, labels)
    document: dict[str, object] = {"setup": dict(setup)}
    per_run: dict[str, object] = {}
    document["runs"] = per_run
    for mode, run in runs.items():
        per_run[mode] = {
            "summary": json_safe(summarize(run).as_dict()),
            "waste": json_safe(waste_meters(run).as_dict()),
            "requests": _records(requests[requests["run"] == mode]),
            "steps": _records(steps[steps["run"] == mode]),
        }
    if "continuous" in runs and "static" in runs:
        document["speedup"] = json_safe(speedup(summarize(runs["continuous"]), summarize(runs["static"])))
    return json.dumps(document, indent=1, ensure_ascii=False).encode("utf-8")


def _records(frame: pd.DataFrame) -> list[dict]:
    return json.loads(frame.drop(columns="run").to_json(orient="records", force_ascii=False))


def json_safe(value: object) -> object:
    """NaN and infinity become null, so the file is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value
