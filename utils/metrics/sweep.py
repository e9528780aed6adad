"""A load sweep's figures: per-request latencies as `vllm bench serve` defines them, SLO attainment, goodput (the
highest rate meeting the target, DistServe's definition), each curve's knee, and the headline in words.

The definitions (docs/benchmarks.md#load-sweep has them once, for every reader):

- TTFT: from the request's arrival (its scheduled send time) to its first token (first streamed chunk).
- E2E: from its arrival to its last token (vLLM's `latency`).
- TPOT: (E2E - TTFT) / (output tokens - 1), the first token excluded; only requests with 2 or more tokens count in
  its percentiles, and for the target a one-token answer's TPOT is 0 (as vLLM's goodput takes it).
- ITL: the gaps between one request's consecutive chunks, over every request (ours stream one token per chunk).
- Throughput: output tokens (requests) over the run's duration, from the first arrival to the last answer's end.

Percentiles interpolate linearly between ranks (numpy's default, which vLLM uses). Nothing here reads a clock: the
page, the CLI and the tests all feed it records.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

import pandas as pd

from batching.engine.request import FinishReason
from batching.runs import RunRecord
from utils.metrics.run import percentile

ATTAINMENT_GOAL = 0.9  # DistServe's goodput: the highest rate at which 90% of requests meet the target
PERCENTILES = (50, 90, 99)
METRICS = ("ttft", "tpot", "itl", "e2e")
# A knee: the bend (Kneedle's difference curve, on the chart's log-rate axis) reaches this far from the chord, and a
# latency curve at least doubles over the sweep; below either, the curve is called straight.
KNEE_MIN_BEND = 0.1
KNEE_MIN_RISE = 2.0
_NOT_SERVED = (FinishReason.ERROR, FinishReason.CANCELLED)


@dataclass(frozen=True)
class RequestTiming:
    """One request as a load generator sees it (vLLM's `RequestFuncOutput`): when it arrived, when each streamed
    chunk of its answer came (our engine streams one token per chunk), how many tokens it got, and whether it was
    served."""

    arrival: float
    chunks: tuple[float, ...]
    output_tokens: int
    ok: bool = True

    @property
    def served(self) -> bool:
        """vLLM counts a request only when it succeeded and a first chunk came (else there is no TTFT)."""
        return self.ok and bool(self.chunks)

    @property
    def ttft(self) -> float:
        return self.chunks[0] - self.arrival

    @property
    def e2e(self) -> float:
        return self.chunks[-1] - self.arrival

    @property
    def itl(self) -> tuple[float, ...]:
        return tuple(later - earlier for earlier, later in itertools.pairwise(self.chunks))

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first; None for an answer of one token."""
        if self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


def record_timings(record: RunRecord) -> list[RequestTiming]:
    """Each finished request of an engine run, its token events as its chunks (times on the run's clock)."""
    chunks: dict[str, list[float]] = {}
    for token in record.tokens:
        chunks.setdefault(token.request_id, []).append(token.time)
    return [
        RequestTiming(
            arrival=event.arrival,
            chunks=tuple(sorted(chunks.get(event.request_id, ()))),
            output_tokens=event.output_tokens,
            ok=event.reason not in _NOT_SERVED,
        )
        for event in record.finished
    ]


@dataclass(frozen=True)
class Slo:
    """The latency target: a request meets it when its TTFT and its TPOT are both within their bounds."""

    ttft_s: float
    tpot_s: float

    def __post_init__(self) -> None:
        for name, value in (("TTFT", self.ttft_s), ("TPOT", self.tpot_s)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"the {name} target {value} s is not allowed: must be above 0")

    def met(self, timing: RequestTiming) -> bool:
        if not timing.served:
            return False
        return timing.ttft <= self.ttft_s and (timing.tpot or 0.0) <= self.tpot_s

    def words(self) -> str:
        return f"TTFT p90 ≤ {_duration(self.ttft_s)} and TPOT p90 ≤ {_duration(self.tpot_s)}"


@dataclass(frozen=True)
class SweepPoint:
    """One series (a schedule, or a server) at one request rate: counts, throughput, latency percentiles (seconds),
    and how many requests met the target."""

    series: str
    rate: float
    requests: int
    completed: int
    duration_s: float
    output_tokens: int
    good: int
    ttft_p50: float
    ttft_p90: float
    ttft_p99: float
    tpot_p50: float
    tpot_p90: float
    tpot_p99: float
    itl_p50: float
    itl_p90: float
    itl_p99: float
    e2e_p50: float
    e2e_p90: float
    e2e_p99: float

    @property
    def failed(self) -> int:
        return self.requests - self.completed

    @property
    def attainment(self) -> float:
        """The share of the requests sent that were served within the target (a failed one never is)."""
        return self.good / self.requests if self.requests else math.nan

    @property
    def request_throughput(self) -> float:
        return self.completed / self.duration_s if self.duration_s > 0 else math.nan

    @property
    def output_throughput(self) -> float:
        return self.output_tokens / self.duration_s if self.duration_s > 0 else math.nan

    def as_dict(self) -> dict:
        """Every field, with the derived figures beside them."""
        return {
            **asdict(self),
            "failed": self.failed,
            "attainment": self.attainment,
            "request_throughput": self.request_throughput,
            "output_throughput": self.output_throughput,
        }


def sweep_point(
    series: str, rate: float, timings: Sequence[RequestTiming], duration_s: float, slo: Slo, sent: int | None = None
) -> SweepPoint:
    """The figures of one series at one rate, from its requests' timings (`sent`: requests sent, default all)."""
    served = [timing for timing in timings if timing.served]
    samples = {
        "ttft": [timing.ttft for timing in served],
        "tpot": [tpot for timing in served if (tpot := timing.tpot) is not None],
        "itl": [gap for timing in served for gap in timing.itl],
        "e2e": [timing.e2e for timing in served],
    }
    figures = {f"{name}_p{q}": percentile(samples[name], q) for name in METRICS for q in PERCENTILES}
    return SweepPoint(
        series=series,
        rate=rate,
        requests=len(timings) if sent is None else sent,
        completed=len(served),
        duration_s=duration_s,
        output_tokens=sum(timing.output_tokens for timing in served),
        good=sum(slo.met(timing) for timing in timings),
        **figures,
    )


def record_point(series: str, rate: float, record: RunRecord, slo: Slo, sent: int | None = None) -> SweepPoint:
    """The figures of one engine run (a race lane) at one rate; its duration is the run's wall time on its clock."""
    return sweep_point(series, rate, record_timings(record), record.wall_s, slo, sent)


# --- goodput and knees ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Goodput:
    """The load a series sustains (DistServe's goodput): the highest rate at which `ATTAINMENT_GOAL` of its requests
    met the target.

    `swept` is the highest swept rate that met it; `rate` is where attainment crosses the goal between it and the
    next swept rate (which missed), read off the straight line between the two on the chart's log-rate axis: one
    request more or less meeting the target near the goal then moves the figure by a fraction of the gap between
    two rates, not by the whole gap. Both are None when no rate met it; `whole_sweep` says the highest rate met it
    (the rate is then a lower bound: the series may sustain more than the sweep asked of it).
    """

    series: str
    rate: float | None
    swept: float | None
    lowest: float
    highest: float

    @property
    def whole_sweep(self) -> bool:
        return self.swept is not None and self.swept >= self.highest


def goodput(points: Iterable[SweepPoint], series: str, goal: float = ATTAINMENT_GOAL) -> Goodput:
    """The highest rate at which `series` met `goal` (see `Goodput`). A rate below it that missed by a request or
    two does not lower it: static batching's first-token waits at light load sit near a tight target (a request
    arriving during a wave waits for its longest member), and one request more over it at the lowest rate would
    otherwise say static sustains nothing."""
    ordered = sorted((point for point in points if point.series == series), key=lambda point: point.rate)
    if not ordered:
        raise ValueError(f"no sweep point of {series!r}")
    passed = [index for index, point in enumerate(ordered) if point.attainment >= goal]
    met = passed[-1] + 1 if passed else 0
    lowest, highest = ordered[0].rate, ordered[-1].rate
    if met == 0:
        return Goodput(series, None, None, lowest, highest)
    last = ordered[met - 1]
    if met == len(ordered):
        return Goodput(series, last.rate, last.rate, lowest, highest)
    miss = ordered[met]
    share = (last.attainment - goal) / (last.attainment - miss.attainment)
    crossing = math.exp(math.log(last.rate) + share * (math.log(miss.rate) - math.log(last.rate)))
    return Goodput(series, crossing, last.rate, lowest, highest)


def knee(rates: Sequence[float], values: Sequence[float], saturating: bool = False) -> float | None:
    """The rate at which a curve bends most (Kneedle: the farthest point from the chord, rates on a log axis), or
    None when it is straight or too short (3 points at least).

    A latency curve rises slowly and then steeply (convex): its knee is the last rate before it takes off, and it
    must at least double. A throughput curve follows the rate and then flattens (`saturating`): its knee is where
    it stops following.
    """
    pairs = [(rate, value) for rate, value in zip(rates, values, strict=True) if math.isfinite(value) and rate > 0]
    if len(pairs) < 3:
        return None
    xs = [math.log(rate) for rate, _ in pairs]
    ys = [value for _, value in pairs]
    x_span, y_low, y_span = xs[-1] - xs[0], min(ys), max(ys) - min(ys)
    if x_span <= 0 or y_span <= 0:
        return None
    if not saturating and not max(ys) >= KNEE_MIN_RISE * y_low:
        return None
    bends = []
    for x, y in zip(xs, ys, strict=True):
        x_n, y_n = (x - xs[0]) / x_span, (y - y_low) / y_span
        bends.append(y_n - x_n if saturating else x_n - y_n)
    best = max(range(len(bends)), key=bends.__getitem__)
    return pairs[best][0] if bends[best] >= KNEE_MIN_BEND else None


# --- words ---------------------------------------------------------------------------------------------------------
def _duration(seconds: float) -> str:
    return f"{seconds * 1000:g} ms" if seconds < 1 else f"{seconds:g} s"


def _rate(rate: float) -> str:
    return f"{rate:.3g}"


def headline(continuous: Goodput, static: Goodput, slo: Slo) -> str:
    """The sweep in one sentence: what each schedule sustains at the target, and the ratio when there is one."""
    target = f"At {slo.words()}"
    if continuous.rate is None and static.rate is None:
        return (
            f"{target}, neither schedule met the target at any rate swept (not even {_rate(continuous.lowest)} "
            "requests/s): try lower rates or a looser target."
        )
    if continuous.whole_sweep and static.whole_sweep:
        return (
            f"{target}, both schedules met the target at every rate swept (up to {_rate(continuous.highest)} "
            "requests/s): add higher rates to find where each breaks."
        )
    if static.rate is None:
        assert continuous.rate is not None
        return (
            f"{target}, continuous sustains {_words(continuous)}; static met it at no rate swept (not even "
            f"{_rate(static.lowest)} requests/s) — over {continuous.rate / static.lowest:.1f}× the load."
        )
    if continuous.rate is None:
        return (
            f"{target}, static sustains {_words(static)}; continuous met it at no rate swept (not even "
            f"{_rate(continuous.lowest)} requests/s)."
        )
    bound = "at least " if continuous.whole_sweep else "at most " if static.whole_sweep else ""
    return (
        f"{target}, continuous sustains {_words(continuous)}, static {_words(static, unit=False)} — "
        f"{bound}{continuous.rate / static.rate:.1f}× the load."
    )


def servers_headline(found: Mapping[str, Goodput], slo: Slo) -> str:
    """Servers swept side by side in one sentence: what each sustains at the target, best first, and the winner
    with its ratio over the next (none when the best two both met the target at every rate swept)."""
    target = f"At {slo.words()}"
    ranked = sorted(found.values(), key=lambda each: -(each.rate or 0.0))
    met = [each for each in ranked if each.rate is not None]
    if not met:
        lowest = min(each.lowest for each in ranked)
        return (
            f"{target}, no server met the target at any rate swept (not even {_rate(lowest)} requests/s): try lower "
            "rates or a looser target."
        )
    parts = [f"{met[0].series} sustains {_words(met[0])}"]
    parts += [f"{each.series} {_words(each, unit=False)}" for each in met[1:]]
    parts += [f"{each.series} met it at no rate swept" for each in ranked if each.rate is None]
    sentence = f"{target}, " + ", ".join(parts)
    if len(ranked) == 1:
        return sentence + "."
    best, second = ranked[0], ranked[1]
    if best.whole_sweep and second.whole_sweep:
        return sentence + f" — {best.series} and {second.series} both held to the highest rate: add higher rates."
    assert best.rate is not None
    if second.rate is None:
        return sentence + f" — {best.series} the most."
    bound = "at least " if best.whole_sweep else ""
    return sentence + f" — {best.series} the most, {bound}{best.rate / second.rate:.1f}× {second.series}."


def _words(goodput: Goodput, unit: bool = True) -> str:
    assert goodput.rate is not None
    prefix = "at least " if goodput.whole_sweep else ""
    return f"{prefix}{_rate(goodput.rate)}" + (" requests/s" if unit else "")


def goodput_ratio(continuous: Goodput, static: Goodput) -> float:
    """Continuous's goodput over static's (NaN unless both met the target somewhere)."""
    if continuous.rate is None or static.rate is None:
        return math.nan
    return continuous.rate / static.rate


# --- frames --------------------------------------------------------------------------------------------------------
def points_frame(points: Iterable[SweepPoint]) -> pd.DataFrame:
    """One row per (series, rate): every figure of `SweepPoint.as_dict`, seconds as they are."""
    rows = [point.as_dict() for point in points]
    frame = pd.DataFrame(rows)
    return frame.sort_values(["series", "rate"]).reset_index(drop=True) if rows else frame


def readable_frame(points: Iterable[SweepPoint]) -> pd.DataFrame:
    """The points for reading: one row per series and rate, latencies in milliseconds, in the order they ran."""
    rows = [
        {
            "series": point.series,
            "rate (req/s)": point.rate,
            "served": f"{point.completed}/{point.requests}",
            "done (req/s)": round(point.request_throughput, 2),
            "output tok/s": round(point.output_throughput, 1),
            **{
                f"{name.upper()} p{q} (ms)": round(getattr(point, f"{name}_p{q}") * 1000, 1)
                for name in METRICS
                for q in PERCENTILES
            },
            "met the target": f"{point.attainment:.0%}",
        }
        for point in points
    ]
    return pd.DataFrame(rows)


def knees(points: Sequence[SweepPoint], columns: Sequence[str]) -> dict[tuple[str, str], float | None]:
    """Each series' knee on each of `columns` (a `SweepPoint` field); throughput columns saturate, latencies rise."""
    found: dict[tuple[str, str], float | None] = {}
    for series in dict.fromkeys(point.series for point in points):
        mine = sorted((point for point in points if point.series == series), key=lambda point: point.rate)
        for column in columns:
            values = [float(point.as_dict()[column]) for point in mine]
            saturating = column.endswith("throughput")
            found[(series, column)] = knee([point.rate for point in mine], values, saturating)
    return found


def goodputs(points: Sequence[SweepPoint], goal: float = ATTAINMENT_GOAL) -> Mapping[str, Goodput]:
    return {series: goodput(points, series, goal) for series in dict.fromkeys(point.series for point in points)}
