"""5 · The numbers: the speed-up in one sentence, every run's figures side by side, and what they count."""

from __future__ import annotations

import streamlit as st

from app.race_view import RaceRun
from batching.remote import RemoteRun
from batching.runs import RunRecord
from utils import export
from utils.metrics.inspector import WasteMeters
from utils.metrics.run import steps_kind, summarize, wait_reasons_frame
from utils.plain_text import escape_markdown

RACE_CLOCKS = (
    "Both lanes ran the same prompts, caps, sampling and arrival times in the engine process, which steps them in "
    "turn, always the lane that is behind, so they never compete for the CPU. Each lane's clock counts only its "
    "own steps (and jumps over idle gaps to the next arrival), so the speed-up is the ratio of the two clocks; "
    "slow-motion pauses are on neither clock."
)


def numbers_section(
    runs: dict[str, RunRecord],
    meters: dict[str, WasteMeters],
    others_seen: bool,
    race: RaceRun | None = None,
    weights: str = "",
) -> None:
    """The built-in engine's runs (a race's lanes, or the replays and the live run) and what their figures count."""
    summaries = {mode: summarize(record) for mode, record in runs.items()}
    st.header("5 · The numbers")
    if "static" in summaries and (race is None or race.completed):
        factor = export.speedup(summaries["continuous"], summaries["static"])
        st.subheader(f"Same queue, same model, same batch size: {export.speedup_sentence(factor)}")
    elif race is not None:
        st.info("No speed-up: the race was stopped or some prompts did not finish; the figures cover what ran.")
    st.dataframe(export.comparison_frame(summaries, meters), width="content")
    st.table(wait_reasons_frame(runs))
    notes = [
        "Latency counts from when a request arrived; occupancy is working slots ÷ batch size, averaged over steps."
    ]
    if race is not None:
        notes.append(RACE_CLOCKS)
    elif "static" in summaries:
        notes.append(
            "Continuous and static were measured the same way after your run: the same prompts, caps, sampling, "
            "arrival times and slots on private batchers, each twice (continuous, static, static, continuous), "
            "keeping the faster. The live column is the run you watched, which shared the machine with the page "
            "drawing it."
        )
    if weights:
        notes.append(f"Model: {weights} (the same weights on every lane).")
    kinds = "; ".join(f"{mode}: {steps_kind(record)}" for mode, record in runs.items())
    notes.append(f"Steps — {kinds} (no compile ran during any of them: the engine holds compiles while it works).")
    if others_seen:
        notes.append(
            "Other people's requests shared the engine during your live run (purple in the live charts), so its "
            "figures include their load."
        )
    st.caption(" ".join(notes))


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
