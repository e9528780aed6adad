"""What each server said about itself at each rate of a sweep (its `/metrics`, beside the client's timings), and how
evenly a router spread a fleet's requests over its replicas. Every figure says where it came from: measured by our
client, read from the server's metrics, or not reported by that server (never a blank that reads as a zero).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import pandas as pd

from batching.remote.window import WindowFigures, load_shares

CLIENT = "measured by this client"
METRICS = "read from the server's /metrics"
NOT_REPORTED = "not reported by this server"
# The server figures a sweep keeps, with their words (a rate's mean and peak of a gauge; a counter's move)
SERVER_FIGURES = {
    "running_mean": "running (mean)",
    "running_peak": "running (peak)",
    "waiting_mean": "waiting (mean)",
    "waiting_peak": "waiting (peak)",
    "cache_usage_mean": "KV use (mean)",
    "cache_usage_peak": "KV use (peak)",
    "preemptions": "preemptions",
    "finished": "requests finished",
}


@dataclass(frozen=True)
class ServerPoint:
    """One server (a replica, in a fleet) of one series at one rate: what its metrics said over that rate."""

    series: str
    server: str
    rate: float
    figures: WindowFigures

    def as_dict(self) -> dict:
        return {"series": self.series, "server": self.server, "rate": self.rate, **asdict(self.figures)}


def server_frame(points: Iterable[ServerPoint]) -> pd.DataFrame:
    """One row per (series, server, rate): every figure, None where the server did not report it."""
    rows = [point.as_dict() for point in points]
    columns = ["series", "server", "rate", "engine", "readings", *SERVER_FIGURES]
    return pd.DataFrame(rows, columns=columns)


def source(value: float | None) -> str:
    """Where a server figure came from: its metrics, or nowhere (that server does not report it)."""
    return METRICS if value is not None else NOT_REPORTED


def shown(value: float | None, name: str) -> str:
    """A server figure as text: KV use in percent, counts as numbers, "not reported" when the server has none."""
    if value is None:
        return "not reported"
    if name.startswith("cache_usage"):
        return f"{value:.1%}"
    return f"{value:.1f}" if name.endswith("_mean") else f"{value:.0f}"


def shares(points: Sequence[ServerPoint]) -> dict[tuple[str, float], dict[str, float] | None]:
    """For each fleet (a series with several servers) at each rate: each replica's share of the requests finished
    (None when a replica reports no count)."""
    grouped: dict[tuple[str, float], dict[str, float | None]] = {}
    for point in points:
        grouped.setdefault((point.series, point.rate), {})[point.server] = point.figures.finished
    return {key: load_shares(counts) for key, counts in grouped.items() if len(counts) > 1}


def spread_lines(points: Sequence[ServerPoint]) -> list[str]:
    """One line per fleet and rate: each replica's requests and share, and the fewest over the most (1: even)."""
    lines = []
    for (series, rate), found in shares(points).items():
        if found is None:
            lines.append(f"spread {series} at {rate:g}/s: not reported (a replica's metrics count no requests)")
            continue
        counts = {p.server: p.figures.finished for p in points if p.series == series and p.rate == rate}
        parts = ", ".join(f"{server} {counts[server]:.0f} ({share:.0%})" for server, share in found.items())
        evenness = min(found.values()) / max(found.values())
        lines.append(f"spread {series} at {rate:g}/s: {parts}; fewest/most {evenness:.2f}")
    return lines
