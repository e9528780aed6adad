"""The load sweep against servers that are already running, by URL, and against a fleet behind a router.

Every target is driven alone (the others get no traffic meanwhile), with the same prompts (the mix's text in the
settings' template: this process has no tokenizer of theirs) on the same seeded Poisson arrivals, streamed and timed
by the sweep's one client (`batching.bench.sweep_client`). First, one short untimed request per server (per replica
of a fleet) warms each up and finds a wrong address, key or model before anything is timed. With `auto` rates, a
probe of every request at once measures what each target serves flat out, and the rates span from 0.4 of the lowest
capacity to 4 times the highest, as the in-process sweep picks them. Then rate by rate, each target in turn: while
its requests run, its `/metrics` (each replica's, in a fleet: the requests go through the router) are read by the
one telemetry reader (`batching.remote.window`), so each rate has what the client measured beside what each server
said about itself.

The CLI (`python -m batching.bench sweep --url ...`) runs it to the end; the page runs it in a thread and draws what
it has so far.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from batching.arrivals import Schedule
from batching.bench.sweep_client import greedy_request, run_remote_rate
from batching.remote.dispatch import RunSetup
from batching.remote.endpoint import Endpoint, RemoteError, fetch_model, parse_url
from batching.remote.fleet import replica_endpoints, replica_name
from batching.remote.poller import POLL_EVERY_S
from batching.remote.warmup import WARM_UP_QUESTION, warm_up
from batching.remote.window import TelemetryWindow
from batching.sweep import AUTO_POINTS, SweepSpec, auto_rates, format_rates
from utils.metrics.sweep import RequestTiming, Slo, SweepPoint, sweep_point
from utils.metrics.sweep_servers import ServerPoint

FLEET = "fleet"


@dataclass(frozen=True)
class Target:
    """One series of the sweep: where its requests go (a server, or a router), the model they name, and in a fleet
    each replica, whose own `/metrics` are read."""

    name: str
    endpoint: Endpoint
    model: str
    replicas: tuple[Endpoint, ...] = ()

    @property
    def watched(self) -> tuple[tuple[str, Endpoint], ...]:
        """Whose metrics are read, by name: the server itself, or each replica (by host:port)."""
        if not self.replicas:
            return ((self.name, self.endpoint),)
        return tuple((replica_name(replica.root), replica) for replica in self.replicas)


def named_url(text: str) -> tuple[str | None, str]:
    """`NAME=URL` or a bare `URL` (no name: the caller names it by its host and port)."""
    name, equals, url = text.partition("=")
    if equals and "://" not in name:
        return name.strip() or None, url.strip()
    return None, text.strip()


def server_target(text: str, endpoint_of: Callable[[str], Endpoint], model: str | None = None) -> Target:
    """A running server from `NAME=URL`; its model is `model`, else the first it lists (RemoteError: why not)."""
    name, url = named_url(text)
    endpoint = endpoint_of(url)
    return Target(name or replica_name(endpoint.root), endpoint, model or fetch_model(endpoint))


def fleet_target(
    text: str, replicas: Sequence[str], endpoint_of: Callable[[str], Endpoint], model: str | None = None
) -> Target:
    """A router from `NAME=URL` (default name "fleet") and its replicas: given, or read from the router's own list.
    Its model is `model`, else the first replica's (a router may list "unknown", which a replica would refuse)."""
    name, url = named_url(text)
    router = endpoint_of(url)
    found = replica_endpoints(router, [parse_url(replica) for replica in replicas])
    return Target(name or FLEET, router, model or fetch_model(found[0]), found)


def check_names(targets: Sequence[Target]) -> None:
    """Every series needs its own name (the charts' legend): ValueError naming the one given twice."""
    seen: set[str] = set()
    for target in targets:
        if target.name in seen:
            raise ValueError(f"two servers are named {target.name!r}: name each one, e.g. --url A=http://host:8000")
        seen.add(target.name)


@dataclass
class RemoteSweep:
    """A sweep of running targets: `run()` does it all; meanwhile `points`, `servers`, `capacities` and `phase`
    say how far it got (the page reads them from another thread)."""

    targets: Sequence[Target]
    prompts: Sequence[tuple[str, int]]  # one rate's requests in arrival order: (text, cap)
    spec: SweepSpec
    slo: Slo
    ignore_eos: bool = False
    warm_up_prompt: str = WARM_UP_QUESTION  # the caller formats it as the prompts are
    telemetry_every_s: float = POLL_EVERY_S
    points: list[SweepPoint] = field(default_factory=list)
    servers: list[ServerPoint] = field(default_factory=list)
    capacities: dict[str, float] = field(default_factory=dict)
    warm_ups: dict[str, float] = field(default_factory=dict)  # server (replica) -> its warm-up's seconds
    phase: str = "not started"
    error: str | None = None
    finished_requests: int = 0

    def __post_init__(self) -> None:
        if len(self.prompts) != self.spec.requests:
            raise ValueError(f"{len(self.prompts)} prompts for {self.spec.requests} requests per rate")
        check_names(self.targets)
        self.stopping = threading.Event()
        self.done = threading.Event()

    def run(self, on_finished: Callable[[], object] = lambda: None) -> None:
        """Warm-ups, the probe with `auto` rates, then every rate on each target in turn; an error ends it with its
        one line in `error` (the rates done are kept)."""

        def counted() -> None:
            self.finished_requests += 1
            on_finished()

        try:
            self._warm_up()
            if self.spec.auto:
                self._probe(counted)
            for rate in self.spec.rates:
                for target in self.targets:
                    if self.stopping.is_set():
                        return
                    self._rate(target, rate, counted)
        except (RemoteError, ValueError) as exc:
            self.error = str(exc)
        finally:
            self.phase = "stopped" if self.stopping.is_set() else "failed" if self.error else "done"
            self.done.set()

    def stop(self) -> None:
        """Send nothing more: the requests on their way finish, the rate they belong to is left out."""
        self.stopping.set()

    def _warm_up(self) -> None:
        """One short request to each target, and to each replica of a fleet directly (the router may send them all
        to one): its seconds are kept, and a refusal (address, key, model) ends the sweep before anything is timed."""
        for target in self.targets:
            for name, endpoint in dict(((target.name, target.endpoint), *target.watched)).items():
                self.phase = f"warming {name} up"
                setup = RunSetup(endpoint, target.model, 1)
                self.warm_ups[name] = warm_up(setup, self.warm_up_prompt, WARM_UP_QUESTION).seconds

    def _probe(self, counted: Callable[[], object]) -> None:
        """Every request at once on each target: the requests per second it serves flat out picks the rates."""
        for target in self.targets:
            self.phase = f"probing {target.name}: every request at once"
            timings, duration = self._send(target, Schedule.at_once(self.spec.requests), counted)
            served = sum(timing.served for timing in timings)
            self.capacities[target.name] = served / duration if duration > 0 else math.nan
            if self.stopping.is_set():
                return
        try:
            self.spec = replace(self.spec, rates=auto_rates(*self.capacities.values()))
        except ValueError:
            raise ValueError("the capacity probe served nothing on any server: give the rates yourself") from None

    def _rate(self, target: Target, rate: float, counted: Callable[[], object]) -> None:
        self.phase = f"{target.name} at {rate:g} requests/s"
        with contextlib.ExitStack() as stack:
            windows = {
                name: stack.enter_context(TelemetryWindow(endpoint, self.telemetry_every_s))
                for name, endpoint in target.watched
            }
            timings, duration = self._send(target, self.spec.schedule(rate), counted)
        if self.stopping.is_set():
            return  # a rate cut short is left out
        self.points.append(sweep_point(target.name, rate, timings, duration, self.slo, self.spec.requests))
        for name, window in windows.items():
            assert window.figures is not None
            self.servers.append(ServerPoint(target.name, name, rate, window.figures))

    def _send(
        self, target: Target, schedule: Schedule, counted: Callable[[], object]
    ) -> tuple[list[RequestTiming], float]:
        requests = [greedy_request(text, cap, self.ignore_eos) for text, cap in self.prompts]
        return run_remote_rate(target.endpoint, target.model, requests, schedule, counted, stop=self.stopping)

    # --- where it stands ---------------------------------------------------------------------------------------
    def total_requests(self) -> int:
        """Requests the whole sweep sends (with `auto`, the probe and as many rates as it may pick)."""
        probe = 1 if self.spec.auto or self.capacities else 0
        rates = AUTO_POINTS if self.spec.auto else len(self.spec.rates)
        return (probe + rates) * self.spec.requests * len(self.targets)

    def progress(self) -> float:
        if self.done.is_set() and self.error is None and not self.stopping.is_set():
            return 1.0
        return min(1.0, self.finished_requests / max(1, self.total_requests()))

    def rates_line(self) -> str | None:
        """How `auto` picked the rates, once it has."""
        if not self.capacities or self.spec.auto:
            return None
        served = ", ".join(f"{name} {rate:.3g}" for name, rate in self.capacities.items())
        return (
            f"Rates picked by a probe of every request at once: {format_rates(self.spec.rates)} requests/s, from 0.4 "
            f"of the lowest to 4 times the highest capacity ({served} requests/s)."
        )
