"""The load sweep's charts (altair): latency percentiles, throughput and SLO attainment against the request rate, one
line per series (a schedule, or a server), each curve's knee ringed, the target and the goal drawn as dashed rules.

Each builder takes `utils.metrics.sweep.points_frame`'s frame; the page and the CLI's PNG draw the same charts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import altair as alt
import pandas as pd

from utils.metrics.sweep import ATTAINMENT_GOAL, Goodput, Slo

SERIES_COLORS = {"continuous": "#3b82f6", "static": "#f59e0b"}
_OTHER_COLORS = ["#10b981", "#a855f7", "#ef4444", "#64748b"]
STATS = {"p50": [2, 2], "p90": [1, 0], "p99": [6, 3]}  # the line's dash per percentile: p90 (the target's) solid
LATENCIES = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E latency", "itl": "ITL"}
CAPTIONS = {
    "latency": (
        "Each point is one rate of the sweep; the rings are each curve's knee, where its latency takes off. "
        "The dashed grey line is the target."
    ),
    "throughput": (
        "Output tokens per second of the lane's own clock. A schedule keeps up while its line follows the offered "
        "load; its ring marks where it stops (saturation)."
    ),
    "attainment": (
        "The share of requests whose TTFT and TPOT both met the target. Goodput (DistServe's) is the highest rate "
        "at which 90% did (the dashed line): the ring, where the line last crosses it."
    ),
}
KNEE = "knee"
CHART_HEIGHT = 340  # the whole chart: title, plot, axes and legends


def series_scale(series: Sequence[str]) -> alt.Scale:
    """continuous blue and static amber everywhere; other series (servers) in the colours after them."""
    others = iter(_OTHER_COLORS * (1 + len(series) // len(_OTHER_COLORS)))
    colours = [SERIES_COLORS.get(name) or next(others) for name in series]
    return alt.Scale(domain=list(series), range=colours)


def _x(rates: Sequence[float]) -> alt.X:
    return alt.X(
        "rate:Q",
        title="request rate (requests/s, log scale)",
        scale=alt.Scale(type="log", domain=[min(rates), max(rates)], nice=False),
        axis=alt.Axis(values=list(rates), format="~g"),
    )


def _colour(frame: pd.DataFrame) -> alt.Color:
    series = list(dict.fromkeys(frame["series"]))
    return alt.Color("series:N", title=None, scale=series_scale(series), legend=alt.Legend(orient="bottom"))


def latency_long(points: pd.DataFrame, metric: str, stats: Sequence[str]) -> pd.DataFrame:
    """One row per (series, rate, percentile) of `metric` (ttft, tpot, itl, e2e), in milliseconds."""
    rows = [
        {"series": row["series"], "rate": row["rate"], "stat": stat, "ms": row[f"{metric}_{stat}"] * 1000}
        for _, row in points.iterrows()
        for stat in stats
    ]
    return pd.DataFrame(rows, columns=["series", "rate", "stat", "ms"])


def knee_frame(
    points: pd.DataFrame, knees: Mapping[tuple[str, str], float | None], column: str, scale: float = 1.0
) -> pd.DataFrame:
    """The knee of each series on `column`, as points to ring: (series, rate, value * scale)."""
    rows = []
    for (series, name), rate in knees.items():
        if name != column or rate is None:
            continue
        match = points[(points["series"] == series) & (points["rate"] == rate)]
        if len(match):
            rows.append({"series": series, "rate": rate, "value": float(match[column].iloc[0]) * scale, "what": KNEE})
    return pd.DataFrame(rows, columns=["series", "rate", "value", "what"])


def _knee_layer(frame: pd.DataFrame, colour: alt.Color, x: alt.X) -> alt.Chart:
    return (
        alt.Chart(frame)
        .mark_point(shape="circle", size=320, filled=False, strokeWidth=2.5)
        .encode(
            x=x,
            y=alt.Y("value:Q"),
            color=colour,
            tooltip=[
                alt.Tooltip("series:N"),
                alt.Tooltip("what:N", title="mark"),
                alt.Tooltip("rate:Q", title="rate (requests/s)", format="~g"),
            ],
        )
    )


def _rule(value: float, label: str, below: bool = False) -> alt.LayerChart:
    """A dashed grey line at `value`, labelled at its left end (under the line when `below`)."""
    frame = pd.DataFrame({"value": [value], "label": [label]})
    base = alt.Chart(frame)
    rule = base.mark_rule(strokeDash=[6, 4], color="gray", strokeWidth=1.5).encode(y="value:Q")
    text = base.mark_text(align="left", dx=4, dy=10 if below else -6, color="gray", fontSize=11).encode(
        y="value:Q", x=alt.value(0), text="label:N"
    )
    return alt.layer(rule, text)


def latency_chart(
    points: pd.DataFrame,
    metric: str,
    stats: Sequence[str],
    knees: Mapping[tuple[str, str], float | None],
    target_s: float | None = None,
    title: str | None = None,
) -> alt.LayerChart:
    """`metric`'s percentiles (`stats`) against the rate, one colour per series and one dash per percentile; the
    knee of its p90 ringed (p50 when p90 is not drawn) and the target, when given, as a dashed line."""
    rates = sorted(set(points["rate"]))
    frame = latency_long(points, metric, stats)
    colour = _colour(points)
    x = _x(rates)
    name = LATENCIES[metric]
    dashes = [STATS[stat] for stat in stats]
    base = alt.Chart(frame).encode(
        x=x,
        y=alt.Y("ms:Q", title=f"{name} (ms)"),
        color=colour,
        detail="stat:N",
        tooltip=[
            alt.Tooltip("series:N"),
            alt.Tooltip("rate:Q", title="rate (requests/s)", format="~g"),
            alt.Tooltip("stat:N", title="percentile"),
            alt.Tooltip("ms:Q", title=f"{name} (ms)", format=",.1f"),
        ],
    )
    # The dots are a layer of their own: a line's point overlay would turn the dash legend into dots.
    lines = base.mark_line().encode(
        strokeDash=alt.StrokeDash(
            "stat:N",
            title=None,
            scale=alt.Scale(domain=list(stats), range=dashes),
            legend=alt.Legend(orient="bottom", symbolType="stroke", symbolStrokeColor="gray", symbolStrokeWidth=2),
        )
    )
    dots = base.mark_point(filled=True, size=30)
    marked = f"{metric}_p90" if "p90" in stats else f"{metric}_{stats[0]}"
    ringed = _knee_layer(knee_frame(points, knees, marked, 1000), colour, x)
    layers: list[alt.Chart | alt.LayerChart] = [lines, dots, ringed]
    if target_s is not None:
        layers.append(_rule(target_s * 1000, f"target {target_s * 1000:g} ms"))
    heading = title or f"{name} ({', '.join(stats)}) against the request rate"
    return alt.layer(*layers).properties(title=heading, height=CHART_HEIGHT)


def _series_lines(points: pd.DataFrame, x: alt.X, colour: alt.Color, y: alt.Y, *tooltips: alt.Tooltip) -> alt.Chart:
    """One line with its points per series against the rate; the tooltip names the series and the rate first."""
    rate = alt.Tooltip("rate:Q", title="rate (requests/s)", format="~g")
    return (
        alt.Chart(points)
        .mark_line(point=True)
        .encode(x=x, y=y, color=colour, tooltip=[alt.Tooltip("series:N"), rate, *tooltips])
    )


def throughput_chart(points: pd.DataFrame, knees: Mapping[tuple[str, str], float | None]) -> alt.LayerChart:
    """Output tokens per second against the rate, one line per series, each knee (saturation) ringed."""
    colour, x = _colour(points), _x(sorted(set(points["rate"])))
    lines = _series_lines(
        points,
        x,
        colour,
        alt.Y("output_throughput:Q", title="output tokens/s"),
        alt.Tooltip("output_throughput:Q", title="output tokens/s", format=",.0f"),
        alt.Tooltip("request_throughput:Q", title="requests/s done", format=",.2f"),
    )
    ringed = _knee_layer(knee_frame(points, knees, "output_throughput"), colour, x)
    return alt.layer(lines, ringed).properties(title="Output tokens/s against the request rate", height=CHART_HEIGHT)


def goodput_frame(points: pd.DataFrame, goodputs: Mapping[str, Goodput], goal: float = ATTAINMENT_GOAL) -> pd.DataFrame:
    """Each series' goodput as a point to ring: where its attainment crosses the goal, or its highest rate when
    every rate met it."""
    rows = []
    for series, found in goodputs.items():
        if found.rate is None:
            continue
        value = goal
        if found.whole_sweep:
            match = points[(points["series"] == series) & (points["rate"] == found.rate)]
            value = float(match["attainment"].iloc[0])
        rows.append({"series": series, "rate": found.rate, "value": value, "what": "goodput"})
    return pd.DataFrame(rows, columns=["series", "rate", "value", "what"])


def attainment_chart(
    points: pd.DataFrame, goodputs: Mapping[str, Goodput], goal: float = ATTAINMENT_GOAL
) -> alt.LayerChart:
    """The share of requests meeting the target against the rate; the goal as a dashed line, each series' goodput
    ringed."""
    colour, x = _colour(points), _x(sorted(set(points["rate"])))
    y = alt.Y(
        "attainment:Q",
        title="met the target",  # short: a rotated title longer than the plot pushes the chart's title out
        axis=alt.Axis(format="%", values=[0, 0.25, 0.5, 0.75, 1]),
        scale=alt.Scale(domain=[0, 1.06]),  # room above 100% for its points and rings
    )
    lines = _series_lines(points, x, colour, y, alt.Tooltip("attainment:Q", title="met the target", format=".0%"))
    ringed = _knee_layer(goodput_frame(points, goodputs, goal), colour, x)
    layers = [lines, ringed, _rule(goal, f"goal {goal:.0%}", below=True)]
    return alt.layer(*layers).properties(title="SLO attainment against the request rate", height=CHART_HEIGHT)


# What each server said at each rate, drawn beside the client's figures (utils.metrics.sweep_servers)
SERVER_CHARTS = {
    "running_mean": ("requests running (mean)", ",.1f"),
    "waiting_peak": ("requests waiting (peak)", ",.0f"),
    "cache_usage_peak": ("KV-cache use (peak)", ".0%"),
    "preemptions": ("preemptions during the rate", ",.0f"),
}


def server_who(frame: pd.DataFrame) -> pd.Series:
    """A line's name: the series, or "series · replica" for each replica of a fleet."""
    return frame["series"].where(frame["series"] == frame["server"], frame["series"] + " · " + frame["server"])


_REPLICA_COLORS = ["#0ea5e9", "#f43f5e", "#84cc16", "#eab308", "#14b8a6", "#8b5cf6"]


def server_scale(frame: pd.DataFrame) -> alt.Scale:
    """A server keeps its series' colour (`series_scale`); each replica of a fleet gets a colour of its own."""
    series = list(dict.fromkeys(frame["series"]))
    base = dict(zip(series, series_scale(series).range, strict=True))
    spare = iter(_REPLICA_COLORS * (1 + len(frame) // len(_REPLICA_COLORS)))
    names = list(dict.fromkeys(server_who(frame)))
    return alt.Scale(domain=names, range=[base.get(name) or next(spare) for name in names])


def server_chart(servers: pd.DataFrame, column: str) -> alt.Chart:
    """One of each server's own figures (`SERVER_CHARTS`) against the rate, one line per server or replica; the
    title names those that do not report it (their line is absent: no figure is drawn as a zero)."""
    frame = servers.assign(who=server_who(servers))
    words, number = SERVER_CHARTS[column]
    silent = sorted(set(frame[frame[column].isna()]["who"]))
    title = f"Server's {words}, from its /metrics" + (f" (not reported: {', '.join(silent)})" if silent else "")
    shown = frame[frame[column].notna()]
    rates = sorted(set(servers["rate"])) or [1.0]
    axis = alt.Axis(format="%") if number.endswith("%") else alt.Axis(format="d", tickMinStep=1)
    return (
        alt.Chart(shown)
        .mark_line(point=True)
        .encode(
            x=_x(rates),
            y=alt.Y(f"{column}:Q", title=words, axis=axis, scale=alt.Scale(zero=True)),
            color=alt.Color("who:N", title=None, scale=server_scale(servers), legend=alt.Legend(orient="bottom")),
            tooltip=[
                alt.Tooltip("who:N", title="server"),
                alt.Tooltip("rate:Q", title="rate (requests/s)", format="~g"),
                alt.Tooltip(f"{column}:Q", title=words, format=number),
            ],
        )
        .properties(title=title, height=CHART_HEIGHT)
    )


def sweep_chart(
    points: pd.DataFrame,
    slo: Slo,
    knees: Mapping[tuple[str, str], float | None],
    goodputs: Mapping[str, Goodput],
    title: str,
    servers: pd.DataFrame | None = None,
) -> alt.VConcatChart:
    """Every chart of the sweep, two to a row, for a file (the CLI's PNG); with `servers` (`server_frame`), what
    each server said at each rate in rows below."""
    width = 420
    ttft = latency_chart(points, "ttft", ("p50", "p90", "p99"), knees, slo.ttft_s).properties(width=width)
    tpot = latency_chart(points, "tpot", ("p90",), knees, slo.tpot_s).properties(width=width)
    e2e = latency_chart(points, "e2e", ("p90",), knees).properties(width=width)
    tokens = throughput_chart(points, knees).properties(width=width)
    attained = attainment_chart(points, goodputs).properties(width=width)
    rows = [alt.hconcat(ttft, tpot), alt.hconcat(e2e, tokens), alt.hconcat(attained)]
    client = alt.vconcat(*rows).resolve_scale(strokeDash="independent")
    if servers is None or not len(servers):
        return client.properties(title=title)
    charts = [server_chart(servers, column).properties(width=width) for column in SERVER_CHARTS]
    own = alt.vconcat(*(alt.hconcat(*charts[index : index + 2]) for index in range(0, len(charts), 2)))
    # a replica's line has a colour of its own: the two blocks' colour scales are apart
    return alt.vconcat(client, own).properties(title=title).resolve_scale(color="independent")


KNEE_COLUMNS = ("ttft_p90", "tpot_p90", "e2e_p90", "output_throughput")
