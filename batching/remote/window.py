"""What a server said about itself over one window of time (one rate of a load sweep), from its own telemetry: the
mean and the peak of the requests it had running and waiting and of its KV-cache use, and how far its cumulative
counters (preemptions, requests finished) moved. A figure the server does not report stays None, which the CLI and
the page show as "not reported", never as a 0.

The readings are `TelemetryPoller`'s (the one `/metrics` reader): one before the window opens, the poller's own
while it is open, and one after it closes (`read_now`), so a counter's move counts the whole window; the gauges'
figures are the poller's own readings only (before and after, the server is idle).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType

from batching.remote.endpoint import Endpoint
from batching.remote.poller import POLL_EVERY_S, TelemetryPoller
from batching.remote.telemetry import Telemetry

GAUGES = ("running", "waiting", "cache_usage")
COUNTERS = ("preemptions", "finished")


@dataclass(frozen=True)
class WindowFigures:
    """One server over one window: which engine it looked like, how many readings were taken during it, each gauge's
    mean and peak over them, and each counter's move from before to after (None: not reported by this server)."""

    engine: str | None
    readings: int
    running_mean: float | None = None
    running_peak: float | None = None
    waiting_mean: float | None = None
    waiting_peak: float | None = None
    cache_usage_mean: float | None = None
    cache_usage_peak: float | None = None
    preemptions: float | None = None
    finished: float | None = None


def window_figures(during: Sequence[Telemetry], before: Telemetry | None, after: Telemetry | None) -> WindowFigures:
    """The figures of one window from its readings. A counter's move needs a reading after; one absent before is 0
    there (a labelled counter, such as ours by finish reason, has no sample until its first request)."""
    engine = next((reading.engine for reading in (*during, after) if reading is not None and reading.engine), None)
    figures: dict[str, float | None] = {}
    for name in GAUGES:
        values = [value for reading in during if (value := getattr(reading, name)) is not None]
        figures[f"{name}_mean"] = sum(values) / len(values) if values else None
        figures[f"{name}_peak"] = max(values) if values else None
    for name in COUNTERS:
        end = getattr(after, name) if after is not None else None
        start = getattr(before, name) if before is not None else None
        figures[name] = None if end is None else max(0.0, end - (start or 0.0))
    return WindowFigures(engine, len(during), **figures)


def load_shares(finished: Mapping[str, float | None]) -> dict[str, float] | None:
    """Each replica's share of the requests finished in a window (how evenly a router spread them), or None when a
    replica does not report its count or none finished."""
    counts = dict(finished)
    if not counts or any(count is None for count in counts.values()):
        return None
    total = sum(count or 0.0 for count in counts.values())
    return {name: (count or 0.0) / total for name, count in counts.items()} if total > 0 else None


class TelemetryWindow:
    """Reads one server's telemetry over a window: `with TelemetryWindow(endpoint) as window: ...`, then
    `window.figures`."""

    def __init__(
        self, endpoint: Endpoint, every_s: float = POLL_EVERY_S, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.endpoint = endpoint
        self.every_s = every_s
        self.clock = clock
        self.figures: WindowFigures | None = None
        self._poller: TelemetryPoller | None = None
        self._before: Telemetry | None = None

    def __enter__(self) -> TelemetryWindow:
        poller = TelemetryPoller(self.endpoint, self.every_s, self.clock)
        first = poller.read_now()
        self._before = first.telemetry if first is not None else None
        self._poller = poller.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        poller = self._poller
        assert poller is not None, "the window was never opened"
        poller.stop()
        poller.join()
        readings = poller.samples()
        last = poller.read_now()
        during = [sample.telemetry for sample in readings[1 if self._before is not None else 0 :]]
        self.figures = window_figures(during, self._before, last.telemetry if last is not None else None)
