"""A remote server's own telemetry as frames, a chart and one line saying what it reported (and what it did not)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import altair as alt
import pandas as pd

from batching.remote.telemetry import FIGURES, TelemetrySample

RUNNING = "running on the server"
WAITING = "waiting on the server"
_SERIES = {"running": RUNNING, "waiting": WAITING}
_COLORS = ["#3b82f6", "#f59e0b"]
FIGURE_NAMES = {
    "running": "requests running",
    "waiting": "requests waiting",
    "cache_usage": "KV-cache use",
    "preemptions": "preemptions",
}
CAPTION = (
    "The server's own view, read from its telemetry a few times a second: requests it is running (its batch) and "
    "requests waiting in its queue, from every client, not only this page."
)


def telemetry_table(samples: Sequence[TelemetrySample], start: float) -> pd.DataFrame:
    """One row per reading: seconds since the run started and each figure (empty where not reported)."""
    rows = [
        {
            "time_s": sample.time - start,
            "engine": sample.telemetry.engine,
            **{name: getattr(sample.telemetry, name) for name in FIGURES},
            "slots_busy": sample.telemetry.slots_busy,
            "slots_total": sample.telemetry.slots_total,
        }
        for sample in samples
    ]
    return pd.DataFrame(rows, columns=["time_s", "engine", *FIGURES, "slots_busy", "slots_total"])


def telemetry_frame(samples: Sequence[TelemetrySample], start: float) -> pd.DataFrame:
    """Long format for the chart: (time_s, series, requests), reported figures only."""
    table = telemetry_table(samples, start)
    frames = [
        pd.DataFrame({"time_s": table["time_s"], "series": label, "requests": table[name]}).dropna()
        for name, label in _SERIES.items()
    ]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["time_s", "series", "requests"])


def telemetry_chart(frame: pd.DataFrame, title: str = "The server's batch", x_max: float | None = None) -> alt.Chart:
    """Running and waiting requests over time, as steps (a gauge holds its value until the next reading)."""
    x_scale = alt.Scale(domain=[0, x_max]) if x_max else alt.Undefined
    return (
        alt.Chart(frame)
        .mark_line(interpolate="step-after", point=True)
        .encode(
            x=alt.X("time_s:Q", title="seconds since the run started", scale=x_scale),
            y=alt.Y("requests:Q", title="requests", axis=alt.Axis(tickMinStep=1, format="d")),
            color=alt.Color(
                "series:N",
                title=None,
                scale=alt.Scale(domain=list(_SERIES.values()), range=_COLORS),
                legend=alt.Legend(orient="bottom", labelLimit=400),
            ),
            tooltip=[alt.Tooltip("time_s:Q", title="s", format=".2f"), "series:N", "requests:Q"],
        )
        .properties(title=title, height=260)
    )


def cache_chart(
    samples: Sequence[TelemetrySample], start: float, title: str = "KV-cache use", x_max: float | None = None
) -> alt.Chart:
    """The server's KV-cache use over time (0 to 1), as steps; its readings that report none are left out."""
    table = telemetry_table(samples, start).dropna(subset=["cache_usage"])
    x_scale = alt.Scale(domain=[0, x_max]) if x_max else alt.Undefined
    return (
        alt.Chart(table[["time_s", "cache_usage"]])
        .mark_line(interpolate="step-after", point=True, color="#10b981")
        .encode(
            x=alt.X("time_s:Q", title="seconds since the run started", scale=x_scale),
            y=alt.Y("cache_usage:Q", title="KV-cache use", axis=alt.Axis(format="%")),
            tooltip=[
                alt.Tooltip("time_s:Q", title="s", format=".2f"),
                alt.Tooltip("cache_usage:Q", title="KV-cache use", format=".1%"),
            ],
        )
        .properties(title=title, height=200)
    )


def reported_line(samples: Sequence[TelemetrySample], sources: Mapping[str, bool]) -> str:
    """Which engine the telemetry looked like, each figure's peak or "not reported", and where it was read."""
    read = [path for path, available in sources.items() if available]
    if not samples:
        where = ", ".join(read) if read else "neither /metrics nor /slots"
        return f"Server telemetry: not reported (read {where}; nothing answered in a known format)."
    engine = next((s.telemetry.engine for s in reversed(samples) if s.telemetry.engine), None) or "unknown engine"
    parts = []
    for name in FIGURES:
        values = [getattr(s.telemetry, name) for s in samples if getattr(s.telemetry, name) is not None]
        if not values:
            parts.append(f"{FIGURE_NAMES[name]}: not reported")
        elif name == "cache_usage":
            parts.append(f"{FIGURE_NAMES[name]}: peak {max(values):.0%}")
        elif name == "preemptions":
            parts.append(f"{FIGURE_NAMES[name]}: {max(values) - min(values):g} during the run")
        else:
            parts.append(f"{FIGURE_NAMES[name]}: peak {max(values):g}")
    return f"Server telemetry ({engine}, {len(samples)} readings from {', '.join(read) or 'the server'}): " + (
        " · ".join(parts)
    )
