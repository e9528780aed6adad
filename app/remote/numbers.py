"""5 · The numbers of a remote server's passes, as its client measured them, and the requests that failed."""

from __future__ import annotations

import streamlit as st

from batching.remote import RemoteRun
from utils import export
from utils.metrics.run import summarize
from utils.plain_text import escape_markdown


def remote_failures(runs: dict[str, RemoteRun]) -> None:
    """One message per kind of failure (with how many requests it hit); the other requests went on. The message,
    often the server's own text, shows as text."""
    for mode, remote in runs.items():
        errors: dict[str, int] = {}
        for event in remote.record.finished:
            if event.error:
                errors[event.error] = errors.get(event.error, 0) + 1
        for message, count in errors.items():
            st.error(f"{mode}: {count} of {len(remote.record.finished)} requests failed: {escape_markdown(message)}")


def remote_numbers_section(runs: dict[str, RemoteRun]) -> None:
    """A remote server's passes, as its client measured them (the server's steps are not visible)."""
    summaries = {mode: summarize(remote.record) for mode, remote in runs.items()}
    st.header("5 · The numbers")
    if "static" in summaries:
        factor = export.speedup(summaries["continuous"], summaries["static"])
        st.subheader(f"Same queue, same server, same N: {export.speedup_sentence(factor)}")
    table = export.comparison_frame(summaries).drop(index="engine steps")
    st.dataframe(table.rename(index={"mean occupancy": "mean requests in flight ÷ N"}), width="content")
    st.caption(
        "Measured by this page's client: latency counts from when a request was due; output tokens are the "
        "server's own counts when it reports usage. The times include the network and the server's other load."
    )
