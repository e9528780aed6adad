"""The page's load sweep of servers already running (by URL, and a fleet behind a router): the CLI's sweep
(`batching.bench.sweep_remote.RemoteSweep`) in a thread of its own, followed by the page's script runs the way
`app.sweep.live_sweep.LiveSweep` is (a tick per poll, the newest script run holding the baton), with what it has
measured so far. Plain Python, tested without Streamlit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from app.common.baton import Baton, Follower
from app.sweep.live_sweep import Tick
from batching.bench.sweep_remote import RemoteSweep
from batching.sweep import SweepSpec
from utils.metrics.sweep import Slo, SweepPoint, goodputs, servers_headline
from utils.metrics.sweep_servers import ServerPoint


class LiveServerSweep:
    """A sweep of running servers as the page follows it: the points of the rates done, each server's own figures,
    and where the sweep stands."""

    def __init__(self, sweep: RemoteSweep, timer: Callable[[], float] = time.monotonic) -> None:
        self.sweep = sweep
        self.timer = timer
        self.baton = Baton()  # the script run that follows this sweep (app.common.baton)
        self.started = timer()
        self.wall_s: float | None = None  # seconds from Run to the sweep's end, once it is over
        self._drawn = 0  # points the follower has been told of
        self._thread = threading.Thread(target=self._run, name="batchscope-server-sweep", daemon=True)

    def begin(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        self.sweep.run()
        self.wall_s = self.timer() - self.started

    # --- following -----------------------------------------------------------------------------------------------
    def follow(self) -> Follower:
        return self.baton.take()

    def tick(self, follower: Follower, timeout: float) -> Tick:
        """Wait up to `timeout` for the sweep; `rate_done` when a point came in since the last tick."""
        with follower.following() as following:
            if not following:
                return Tick(superseded=True)
            self._thread.join(timeout)
            count = len(self.sweep.points)
            fresh, self._drawn = count > self._drawn, count
            return Tick(rate_done=fresh, done=self.done)

    def stop(self) -> None:
        """The Stop button: nothing more is sent; the rate on its way is left out, the rates done are kept."""
        self.sweep.stop()

    def close(self) -> None:
        """Let go (the person left): the sweep sends nothing more."""
        self.sweep.stop()

    # --- what the page shows ----------------------------------------------------------------------------------
    @property
    def spec(self) -> SweepSpec:
        return self.sweep.spec

    @property
    def slo(self) -> Slo:
        return self.sweep.slo

    @property
    def points(self) -> list[SweepPoint]:
        return list(self.sweep.points)

    @property
    def servers(self) -> list[ServerPoint]:
        return list(self.sweep.servers)

    @property
    def capacities(self) -> dict[str, float]:
        return dict(self.sweep.capacities)

    @property
    def stopped(self) -> bool:
        return self.sweep.stopping.is_set()

    @property
    def error(self) -> str | None:
        return self.sweep.error

    @property
    def done(self) -> bool:
        return self.sweep.done.is_set() and not self._thread.is_alive()  # its end's time is kept too

    @property
    def rates_done(self) -> int:
        """Rates every server has run."""
        return len(self.sweep.points) // max(1, len(self.sweep.targets))

    @property
    def completed(self) -> bool:
        """Every rate ran on every server: the headline is the whole sweep's."""
        return self.done and not self.stopped and self.error is None and self.rates_done == len(self.spec.rates)

    def headline_text(self) -> str:
        return servers_headline(goodputs(self.points), self.slo)

    def progress(self) -> float:
        return self.sweep.progress()

    def progress_line(self) -> str:
        """Where the sweep stands, in words."""
        count = len(self.spec.rates)
        swept = f"{self.rates_done} of {count} rates" if count else "no rate (they were still being picked)"
        if self.error is not None:
            return f"Stopped by an error after {swept}: {self.error}"
        if self.done:
            verb = "Stopped" if self.stopped else "Done"
            took = f" in {self.wall_s:.0f} s" if self.wall_s is not None else ""
            return (
                f"{verb}: {swept} swept on {len(self.sweep.targets)} servers, {self.spec.requests} requests each{took}."
            )
        return f"Now: {self.sweep.phase} · {self.sweep.finished_requests} requests answered so far"

    def rates_line(self) -> str | None:
        return self.sweep.rates_line()
