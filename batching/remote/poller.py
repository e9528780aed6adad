"""Reads a server's telemetry a few times a second in a thread of its own, while a remote run goes on.

`/metrics` (Prometheus) and llama.cpp's `/slots` are each tried; one that answers 404 (or is not in the expected
format) is not asked again, and its absence is what the page reports. Every request has a short timeout, so a
server that hangs costs a reading, never the run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import httpx2

from batching.remote.endpoint import Endpoint
from batching.remote.telemetry import Telemetry, TelemetrySample, parse_metrics, parse_slots, with_slots

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
        telemetry: Telemetry | None = None
        if self.metrics_available:
            text = self._get(client, "/metrics", "metrics_available")
            if isinstance(text, str):
                try:
                    telemetry = parse_metrics(text)
                except ValueError:
                    self.metrics_available = False
                    self.last_problem = f"{self.endpoint.root}/metrics is not in Prometheus' text format"
        if self.slots_available:
            answer = self._get(client, "/slots", "slots_available", json=True)
            if answer is not None:
                try:
                    busy, total = parse_slots(answer)
                except ValueError:
                    self.slots_available = False
                else:
                    telemetry = with_slots(telemetry or Telemetry(None), busy, total)
        return telemetry

    def _get(self, client: httpx2.Client, path: str, flag: str, json: bool = False) -> object | None:
        try:
            answer = client.get(self.endpoint.root + path)
        except httpx2.HTTPError as exc:
            self.last_problem = f"{self.endpoint.root}{path}: {type(exc).__name__}"
            return None
        if answer.status_code in (404, 405, 501) or (answer.status_code == 200 and not answer.content):
            setattr(self, flag, False)  # this server does not have it: stop asking
            return None
        if answer.status_code != 200:
            self.last_problem = f"{self.endpoint.root}{path} answered HTTP {answer.status_code}"
            return None
        if not json:
            return answer.text
        try:
            return answer.json()
        except ValueError:
            setattr(self, flag, False)
            return None
