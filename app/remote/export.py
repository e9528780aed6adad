"""6 · Export of a remote server's passes: requests, the client's samples, the server's telemetry, and one JSON."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from batching.remote import RemoteRun
from utils import export
from utils.charts.telemetry import telemetry_table


def remote_export_section(
    runs: dict[str, RemoteRun], labels: dict[str, str], prompts: dict[str, str], setup: dict
) -> None:
    """A remote server's passes: requests, the client's samples, the server's telemetry, and one JSON of them."""
    st.header("6 · Export")
    records = {mode: remote.record for mode, remote in runs.items()}
    telemetry = [
        telemetry_table(remote.telemetry(), remote.record.start).assign(run=mode) for mode, remote in runs.items()
    ]
    c1, c2, c3, c4 = st.columns(4)
    c1.download_button(
        "Requests (CSV)",
        export.to_csv(export.requests_table(records, labels, prompts)),
        "batchscope-requests.csv",
        "text/csv",
        on_click="ignore",
    )
    c2.download_button(
        "Client samples (CSV)",
        export.to_csv(export.steps_table(records, labels)),
        "batchscope-steps.csv",
        "text/csv",
        on_click="ignore",
    )
    c3.download_button(
        "Server telemetry (CSV)",
        export.to_csv(pd.concat(telemetry, ignore_index=True)),
        "batchscope-telemetry.csv",
        "text/csv",
        on_click="ignore",
    )
    c4.download_button(
        "Everything (JSON)",
        export.to_json(records, labels, prompts, setup),
        "batchscope-run.json",
        "application/json",
        on_click="ignore",
    )
