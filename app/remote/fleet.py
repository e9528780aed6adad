"""The remote view's fleet: each replica behind the router side by side, live, from its own `/metrics` (what it is
running and has waiting, its KV-cache use), and how evenly the router spread the run's requests over them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from batching.remote import TelemetryPoller
from batching.remote.window import load_shares, window_figures
from utils.charts.telemetry import cache_chart, reported_line, telemetry_chart, telemetry_frame
from utils.plain_text import escape_markdown

PER_ROW = 3
FLEET_NOTE = (
    "The queue went through the router; each replica's own figures are read from its /metrics a few times a second "
    "(from every client it serves, not only this page). A figure a replica does not report says so under its charts "
    "and is not drawn: never a line at zero."
)


@dataclass(frozen=True)
class FleetLayout:
    """One slot per replica (rows of `PER_ROW`), and one for the spread."""

    replicas: tuple[DeltaGenerator, ...]
    spread: DeltaGenerator


def fleet_layout(names: Sequence[str]) -> FleetLayout:
    st.header("4 · The fleet's replicas")
    st.caption(FLEET_NOTE)
    slots: list[DeltaGenerator] = []
    width = min(PER_ROW, len(names))
    for first in range(0, len(names), width):
        slots += [column.empty() for column in st.columns(width, gap="large")][: len(names) - first]
    return FleetLayout(tuple(slots), st.empty())


def draw_fleet(layout: FleetLayout, pollers: Mapping[str, TelemetryPoller], start: float) -> None:
    """Each replica's batch and KV use so far on shared time axes, what it did not report, and the spread."""
    readings = {name: poller.samples() for name, poller in pollers.items()}
    x_max = max((sample.time - start for samples in readings.values() for sample in samples), default=None)
    for slot, (name, poller) in zip(layout.replicas, pollers.items(), strict=True):
        samples = readings[name]
        with slot.container():
            st.markdown(f"**{escape_markdown(name)}**")
            if samples:
                batch = telemetry_chart(
                    telemetry_frame(samples, start), title="Requests running and waiting", x_max=x_max
                )
                st.altair_chart(batch, width="stretch")
                if any(sample.telemetry.cache_usage is not None for sample in samples):
                    st.altair_chart(cache_chart(samples, start, x_max=x_max), width="stretch")
            sources = {"/metrics": poller.metrics_available, "/slots": poller.slots_available}
            st.caption(reported_line(samples, sources))
    layout.spread.caption(escape_markdown(spread_line(readings)))


def spread_line(readings: Mapping[str, Sequence]) -> str:
    """How many requests each replica finished since the run started (its counter's move), and each one's share."""
    moved = {}
    for name, samples in readings.items():
        telemetry = [sample.telemetry for sample in samples]
        moved[name] = window_figures(telemetry, telemetry[0], telemetry[-1]).finished if telemetry else None
    shares = load_shares(moved)
    if shares is None:
        silent = [name for name, count in moved.items() if count is None]
        why = f"not reported by {', '.join(silent)}" if silent else "no request finished yet"
        return f"How evenly the router spread the requests: {why}."
    parts = ", ".join(f"{name} {moved[name]:.0f} ({share:.0%})" for name, share in shares.items())
    return f"How evenly the router spread the requests (finished on each, from its /metrics): {parts}."
