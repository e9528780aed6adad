"""6 · Export: per-request and per-step CSVs and one JSON of every run on the built-in engine."""

from __future__ import annotations

import streamlit as st

from app.common.live_run import LiveRun
from batching.runs import RunRecord
from utils import export


def export_section(runs: dict[str, RunRecord], run: LiveRun, setup: dict) -> None:
    """Per-request and per-step CSVs and one JSON of every run (`run` gives the prompts and their labels)."""
    labels = run.labels()
    prompts = {view.request_id: view.prompt for view in run.views if view.request_id}
    st.header("6 · Export")
    requests_csv = export.to_csv(export.requests_table(runs, labels, prompts))
    steps_csv = export.to_csv(export.steps_table(runs, labels))
    json_doc = export.to_json(runs, labels, prompts, setup)
    c1, c2, c3 = st.columns(3)
    c1.download_button("Requests (CSV)", requests_csv, "batchscope-requests.csv", "text/csv", on_click="ignore")
    c2.download_button("Steps (CSV)", steps_csv, "batchscope-steps.csv", "text/csv", on_click="ignore")
    c3.download_button("Everything (JSON)", json_doc, "batchscope-run.json", "application/json", on_click="ignore")
