"""The page's sweep of running servers (`app.sweep.live_server_sweep.LiveServerSweep`) against our real server: it
runs in its own thread while the page ticks; a point per rate; Stop leaving the rate on its way out; a newer follower
taking over. Counts and order of events, never speed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.common.baton import Follower
from app.sweep.live_server_sweep import LiveServerSweep
from batching.bench.sweep_remote import RemoteSweep, Target
from batching.remote import Endpoint
from batching.sweep import SweepSpec
from tests.serve.helpers import our_server
from utils.metrics.sweep import Slo

PROMPTS = [("Q: How do I track my order?\nA:", 4), ("Q: Hello\nA:", 2), ("Q: Paris?\nA:", 3)]


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with our_server(tmp_path_factory.mktemp("sweep-view"), args=("--no-compile",)) as (served, _):
        yield served


def sweep_of(url: str, rates: tuple[float, ...]) -> LiveServerSweep:
    target = Target("ours", Endpoint(url), "builtin")
    return LiveServerSweep(RemoteSweep([target], PROMPTS, SweepSpec(rates, len(PROMPTS), 0), Slo(1.0, 0.1)))


def follow_to_the_end(sweep: LiveServerSweep, follower: Follower | None = None) -> list[int]:
    """Tick until the sweep is over; how many points there were at each tick that said a rate was done."""
    follower = follower or sweep.follow()
    seen = []
    while not (tick := sweep.tick(follower, 0.05)).done:
        if tick.rate_done:
            seen.append(len(sweep.points))
    return seen


def test_a_sweep_of_a_running_server_gives_a_point_per_rate_and_its_own_figures(url: str) -> None:
    sweep = sweep_of(url, (5.0, 50.0))
    assert sweep.progress_line().startswith("Now: ") and sweep.rates_done == 0
    sweep.begin()
    seen = follow_to_the_end(sweep)
    assert seen == sorted(seen) and set(seen) <= {1, 2}
    assert sweep.completed and [(p.series, p.rate, p.completed) for p in sweep.points] == [
        ("ours", 5.0, 3),
        ("ours", 50.0, 3),
    ]
    assert [(s.server, s.rate, s.figures.finished) for s in sweep.servers] == [("ours", 5.0, 3), ("ours", 50.0, 3)]
    assert sweep.progress() == 1.0 and sweep.progress_line().startswith("Done: 2 of 2 rates swept on 1 servers")
    assert sweep.headline_text().startswith("At TTFT p90 ≤ 1 s and TPOT p90 ≤ 100 ms, ours sustains ")


def test_stop_leaves_the_rate_on_its_way_out_and_keeps_the_rates_done(url: str) -> None:
    sweep = sweep_of(url, (5.0, 6.0, 7.0, 8.0))
    sweep.begin()
    follower = sweep.follow()
    while not sweep.tick(follower, 0.05).rate_done:
        pass
    sweep.stop()
    follow_to_the_end(sweep)
    assert sweep.stopped and not sweep.completed and sweep.error is None
    assert 1 <= len(sweep.points) < 4 and [p.rate for p in sweep.points] == [5.0, 6.0, 7.0][: len(sweep.points)]
    assert sweep.progress_line().startswith(f"Stopped: {len(sweep.points)} of 4 rates swept")


def test_a_newer_follower_takes_the_sweep_over_and_the_older_one_stops(url: str) -> None:
    sweep = sweep_of(url, (50.0,))
    older = sweep.follow()
    newer = sweep.follow()
    sweep.begin()
    assert sweep.tick(older, 0.01).superseded
    follow_to_the_end(sweep, newer)
    assert not sweep.tick(newer, 0.01).superseded and sweep.completed
