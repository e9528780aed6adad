"""5 · The numbers: the speed-up in one sentence, every run's figures side by side, and what they count, for the
built-in engine's runs (a race's lanes, or the shared engine's replays and live run)."""

from __future__ import annotations

from typing import Protocol

import streamlit as st

from batching.runs import RunRecord
from utils import export
from utils.metrics.inspector import WasteMeters
from utils.metrics.run import steps_kind, summarize, wait_reasons_frame

RACE_CLOCKS = (
    "Both lanes ran the same prompts, caps, sampling and arrival times in the engine process, which steps them in "
    "turn, always the lane that is behind, so they never compete for the CPU. Each lane's clock counts only its "
    "own steps (and jumps over idle gaps to the next arrival), so the speed-up is the ratio of the two clocks; "
    "slow-motion pauses are on neither clock."
)


class RaceOutcome(Protocol):
    """What the numbers read of a race (`app.race.lanes.RaceRun`): whether every prompt ran to its end on both lanes,
    so the speed-up is a fair one."""

    @property
    def completed(self) -> bool: ...


def numbers_section(
    runs: dict[str, RunRecord],
    meters: dict[str, WasteMeters],
    others_seen: bool,
    race: RaceOutcome | None = None,
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
