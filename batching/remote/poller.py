"""Reads a server's telemetry a few times a second in a thread of its own, while a remote run goes on.

`/metrics` (Prometheus, through the one reader: `prometheus.read_metrics`) and llama.cpp's `/slots` are each tried;
one that answers 404 (or is not in the expected format) is not asked again, and its absence is what the page reports.
Every request has a short timeout, so a server that hangs costs a reading, never the run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import httpx2

from batching.remote.endpoint import Endpoint
from batching.remote.prometheus import ABSENT, MetricsUnavailable, read_metrics
from batching.remote.telemetry import Telemetry, TelemetrySample, parse_slots, telemetry_of, with_slots

POLL_EVERY_S = 0.25
POLL_TIMEOUT_S = 1.0


class TelemetryPoller:
    """Polls `endpoint` every `every_s` until `stop()`; `samples()` are the readings so far, oldest first."""

    def __init__(
        self, endpoint: Endpoint, every_s: float = POLL_EVERY_S, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.endpoint = endpoint
        self.every_s = every_s
        self.clock = clock
        self.metrics_available = True
        self.slots_available = True
        self.last_problem: str | None = None
        self._samples: list[TelemetrySample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="batchscope-telemetry", daemon=True)

    def start(self) -> TelemetryPoller:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def samples(self) -> list[TelemetrySample]:
        return list(self._samples)

    def read_now(self) -> TelemetrySample | None:
        """One reading now, in the caller's thread, kept with the others: before `start()` or after `stop()` and
        `join()`, so a run's counters move from its first reading to its last whatever the thread caught."""
        with httpx2.Client(timeout=self._timeout(), headers=self.endpoint.headers()) as client:
            started = self.clock()
            reading = self.read(client)
        if reading is None:
            return None
        sample = TelemetrySample(started, reading)
        self._samples.append(sample)
        return sample

    def _timeout(self) -> httpx2.Timeout:
        return httpx2.Timeout(POLL_TIMEOUT_S, connect=min(POLL_TIMEOUT_S, self.endpoint.connect_timeout_s))

    def _run(self) -> None:
        with httpx2.Client(timeout=self._timeout(), headers=self.endpoint.headers()) as client:
            while not self._stop.is_set():
                started = self.clock()
                reading = self.read(client)
                if reading is not None:
                    self._samples.append(TelemetrySample(started, reading))
                if not (self.metrics_available or self.slots_available):
                    return  # nothing to read on this server
                self._stop.wait(max(0.0, self.every_s - (self.clock() - started)))

    def read(self, client: httpx2.Client) -> Telemetry | None:
        """One reading from whatever the server exposes, or None when nothing answered this time."""
        telemetry = self._metrics(client) if self.metrics_available else None
        if self.slots_available:
            answer = self._slots(client)
            if answer is not None:
                try:
                    busy, total = parse_slots(answer)
                except ValueError:
                    self.slots_available = False
                else:
                    telemetry = with_slots(telemetry or Telemetry(None), busy, total)
        return telemetry

    def _metrics(self, client: httpx2.Client) -> Telemetry | None:
        """The `/metrics` page as telemetry; None when it did not answer this time, or has none (not asked again)."""
        where = f"{self.endpoint.root}/metrics"
        try:
            return telemetry_of(read_metrics(self.endpoint.root, client))
        except MetricsUnavailable:
            self.metrics_available = False  # this server does not have it: stop asking
        except httpx2.HTTPStatusError as exc:
            self.last_problem = f"{where} answered HTTP {exc.response.status_code}"
        except httpx2.HTTPError as exc:
            self.last_problem = f"{where}: {type(exc).__name__}"
        except ValueError:
            self.metrics_available = False
            self.last_problem = f"{where} is not in Prometheus' text format"
        return None

    def _slots(self, client: httpx2.Client) -> object | None:
        """llama.cpp's `/slots` answer; None when it did not answer this time, or has none (not asked again)."""
        where = f"{self.endpoint.root}/slots"
        try:
            answer = client.get(where)
        except httpx2.HTTPError as exc:
            self.last_problem = f"{where}: {type(exc).__name__}"
            return None
        if answer.status_code in ABSENT or (answer.status_code == 200 and not answer.content):
            self.slots_available = False  # this server does not have it: stop asking
            return None
        if answer.status_code != 200:
            self.last_problem = f"{where} answered HTTP {answer.status_code}"
            return None
        try:
            return answer.json()
        except ValueError:
            self.slots_available = False
            return None
