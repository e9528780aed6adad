"""Each server's own figures in a sweep, on hand-made windows: "not reported" never shown as a zero (in the text, the
tables and the charts' titles), a fleet's spread in words, and each replica its own line and colour."""

from __future__ import annotations

from batching.remote.window import WindowFigures
from utils.charts.sweep import series_scale, server_chart, server_scale
from utils.metrics.sweep_servers import ServerPoint, server_frame, shown, source, spread_lines

OURS = WindowFigures("Batchscope", 4, 2.5, 4, 0.5, 2, 0.01, 0.0123, 0, 12)
TGI = WindowFigures("TGI", 4, 3.0, 5, 1.0, 3)


def test_a_figure_the_server_does_not_report_reads_not_reported_and_says_where_each_came_from() -> None:
    assert shown(None, "cache_usage_peak") == "not reported" and shown(0.0, "preemptions") == "0"
    assert shown(0.0123, "cache_usage_peak") == "1.2%" and shown(2.5, "running_mean") == "2.5"
    assert source(None) == "not reported by this server" and source(0.0) == "read from the server's /metrics"


def test_a_fleets_spread_is_each_replicas_requests_and_share_and_none_when_a_replica_counts_nothing() -> None:
    points = [
        ServerPoint("fleet", "a:1", 4.0, OURS),
        ServerPoint("fleet", "b:2", 4.0, WindowFigures("Batchscope", 4, finished=4)),
        ServerPoint("solo", "solo", 4.0, OURS),  # one server: no spread to speak of
        ServerPoint("mixed", "a:1", 8.0, OURS),
        ServerPoint("mixed", "t:3", 8.0, TGI),
    ]
    assert spread_lines(points) == [
        "spread fleet at 4/s: a:1 12 (75%), b:2 4 (25%); fewest/most 0.33",
        "spread mixed at 8/s: not reported (a replica's metrics count no requests)",
    ]


def test_a_server_chart_names_who_does_not_report_and_gives_each_replica_its_own_line_and_colour() -> None:
    frame = server_frame(
        [
            ServerPoint("ours", "ours", 2.0, OURS),
            ServerPoint("tgi", "tgi", 2.0, TGI),
            ServerPoint("fleet", "a:1", 2.0, OURS),
            ServerPoint("fleet", "b:2", 2.0, OURS),
        ]
    )
    chart = server_chart(frame, "cache_usage_peak").to_dict()
    assert chart["title"] == "Server's KV-cache use (peak), from its /metrics (not reported: tgi)"
    drawn = next(iter(chart["datasets"].values()))
    assert [row["who"] for row in drawn] == ["ours", "fleet · a:1", "fleet · b:2"]  # tgi has no point at all
    scale = server_scale(frame)
    colours = dict(zip(scale.domain, scale.range, strict=True))
    assert (colours["ours"], colours["tgi"]) == tuple(
        series_scale(["ours", "tgi", "fleet"]).range[:2]
    )  # as on the client's charts
    assert len({colours["fleet · a:1"], colours["fleet · b:2"], colours["ours"], colours["tgi"]}) == 4
