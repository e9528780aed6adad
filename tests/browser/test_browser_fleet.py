"""Running servers and a fleet in Debian's chromium: the Load sweep view sweeping two of our servers and a fleet of
them behind a real `vllm-router` (one line per server on the same charts, the headline, each server's own figures,
the spread), and the remote view pointed at the router, each replica's batch and KV use side by side.

The README's screenshots are taken only when their variable names a file, and the sweep's is then of ours against
vLLM's CPU build (the session's vLLM, tests/conftest.py) at auto rates:
`BATCHSCOPE_SERVERS_SWEEP_SCREENSHOT=docs/sweep-servers.png BATCHSCOPE_FLEET_SCREENSHOT=docs/fleet.png
python -m pytest tests/browser/test_browser_fleet.py`. The suite never writes a tracked file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.browser.helpers import BROWSER_MARKS, IDLE, new_page, open_view
from tests.serve.helpers import two_eager_servers
from tests.serve.routers import Router, running_router

pytestmark = BROWSER_MARKS


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    with two_eager_servers(tmp_path_factory.mktemp("browser-fleet")) as urls:
        yield urls


@pytest.fixture(scope="module")
def router(servers: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    with running_router("vllm-router", servers, tmp_path_factory.mktemp("browser-router")) as running:
        yield running


def _fill(page, label: str, text: str) -> None:
    """Type into a text box or area and commit it (a click elsewhere blurs it), then wait for the rerun."""
    box = page.get_by_label(label, exact=True)
    box.fill(text)
    box.press("Tab")
    page.wait_for_timeout(300)
    page.wait_for_selector(IDLE)


@pytest.mark.long
def test_a_sweep_of_running_servers_and_a_fleet_draws_each_on_the_same_charts(
    app_url: str, chromium, servers: tuple[str, str], router: Router, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    page = new_page(chromium, app_url)
    open_view(page, "Load sweep")
    main = page.get_by_test_id("stMain")
    main.get_by_text("servers already running, by URL (and a fleet behind a router)").click()
    page.wait_for_selector(IDLE)
    screenshot = os.environ.get("BATCHSCOPE_SERVERS_SWEEP_SCREENSHOT")
    if screenshot:  # the README's: ours against vLLM's CPU build, at the rates a probe picks
        vllm = request.getfixturevalue("vllm")
        _fill(page, "Servers, one per line (NAME=URL, or the URL alone)", f"batchscope={servers[0]}\nvllm={vllm.url}")
        series = 2
    else:
        _fill(page, "Servers, one per line (NAME=URL, or the URL alone)", f"A={servers[0]}\nB={servers[1]}")
        _fill(page, "A fleet's router (optional: [NAME=]URL)", router.url)
        _fill(page, "Request rates (requests/s)", "4, 16")
        _fill(page, "Requests per rate", "6")
        series = 3
    main.get_by_role("button", name="Run sweep").click()
    main.get_by_test_id("stProgress").wait_for(timeout=30_000)
    main.get_by_text(re.compile(rf"Done: (\d+) of \1 rates swept on {series} servers")).wait_for(timeout=900_000)
    main.get_by_text("3 · Every point").wait_for(timeout=60_000)
    page.wait_for_selector(IDLE)
    headline = main.get_by_test_id("stAlertContentSuccess")
    assert headline.count() == 1 and headline.inner_text().startswith("At TTFT p90 ≤ 200 ms and TPOT p90 ≤ 100 ms, ")
    assert main.get_by_test_id("stVegaLiteChart").count() == 5 + 4  # the client's, then each server's own
    assert main.get_by_text("What each server said about itself").count() == 1
    assert main.get_by_text(re.compile("^Every latency, throughput and attainment above is measured")).count() == 1
    assert main.get_by_test_id("stDataFrame").count() == 2
    if not screenshot:
        assert main.get_by_text(re.compile("^How evenly the router spread the requests · fleet at 4/s")).count() == 1
    page.set_viewport_size({"width": 1440, "height": 3600})
    page.wait_for_timeout(1000)
    top = main.get_by_text("2 · The sweep").bounding_box()
    bottom = main.get_by_text("3 · Every point").bounding_box()
    clip = {"x": 300, "y": top["y"] - 10, "width": 1140, "height": bottom["y"] - top["y"]}
    page.screenshot(path=screenshot or str(tmp_path / "sweep-servers.png"), clip=clip)


@pytest.mark.long
def test_the_remote_view_through_the_router_draws_each_replica_side_by_side(
    app_url: str, chromium, servers: tuple[str, str], router: Router, tmp_path: Path
) -> None:
    page = new_page(chromium, app_url)
    open_view(page, "Remote server")
    sidebar = page.get_by_test_id("stSidebar")
    _fill(page, "Server URL", router.url)
    sidebar.get_by_text("A router in front of replicas (a fleet)").click()
    page.wait_for_selector(IDLE)
    sidebar.get_by_text("Through the router to 2 replicas:").wait_for()
    main = page.get_by_test_id("stMain")
    main.get_by_role("button", name="Load example").click()
    page.wait_for_selector(IDLE)
    main.get_by_role("button", name="Generate").click()
    main.get_by_text("4 · The fleet's replicas").wait_for(timeout=60_000)
    page.get_by_text("Same queue, same server, same N:").wait_for(timeout=300_000)
    page.wait_for_selector(IDLE)
    for url in servers:
        assert main.get_by_text(url.removeprefix("http://"), exact=True).count() == 1  # each replica's heading
    assert main.get_by_text(re.compile(r"^How evenly the router spread the requests \(finished on each")).count() == 1
    batches = main.get_by_test_id("stVegaLiteChart")
    assert batches.count() >= 2 * 4 + 2 * 2  # the client's and the server's per mode, then each replica's two
    page.set_viewport_size({"width": 1440, "height": 1800})
    heading = main.get_by_text("4 · The fleet's replicas")
    heading.scroll_into_view_if_needed()  # the page scrolls inside stMain: bring the section to the top
    page.wait_for_timeout(1000)
    section = heading.bounding_box()
    clip = {"x": 300, "y": section["y"] - 10, "width": 1140, "height": min(1150, 1800 - section["y"])}
    page.screenshot(path=os.environ.get("BATCHSCOPE_FLEET_SCREENSHOT") or str(tmp_path / "fleet.png"), clip=clip)
