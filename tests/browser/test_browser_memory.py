"""The race's KV memory in Debian's chromium: mid-race both lanes' block pools are drawn and change as steps stream
(blocks are taken, then given back), and every block is back once the race is over. The docs' mid-race screenshot
is taken only when BATCHSCOPE_MEMORY_SCREENSHOT names a file (`BATCHSCOPE_MEMORY_SCREENSHOT=docs/memory.png python
-m pytest tests/browser/test_browser_memory.py`): the suite never writes a tracked file.
"""

from __future__ import annotations

import os
import re

import pytest

from app.race.memory import HEADER
from tests.browser.helpers import BROWSER_MARKS, IDLE, new_page
from tests.browser.test_browser_race import set_slow_motion

pytestmark = BROWSER_MARKS

HELD = re.compile(r"(\d+) of (\d+) blocks held")


@pytest.fixture(scope="module")
def page(app_url: str, chromium):
    return new_page(chromium, app_url)


def blocks_held(page) -> list[tuple[int, int]]:
    """(blocks held, pool size) on each lane's line, continuous first."""
    lines = page.get_by_test_id("stMain").get_by_text(HELD).all_inner_texts()
    return [(int(match[1]), int(match[2])) for match in (HELD.search(line) for line in lines) if match]


@pytest.mark.long
def test_mid_race_both_lanes_pools_take_blocks_and_give_them_back(page, tmp_path) -> None:
    main = page.get_by_test_id("stMain")
    main.get_by_role("button", name="Load example").click()
    page.get_by_text("11 of 64 prompts").wait_for()
    page.wait_for_selector(IDLE)
    set_slow_motion(page, 5)  # 50 ms between steps: time to watch the pools change
    main.get_by_role("button", name="Generate").click()
    page.get_by_text("running ·").wait_for(timeout=30_000)
    main.get_by_text(HEADER).wait_for()
    page.get_by_text(HELD).first.wait_for(timeout=30_000)
    pools = main.get_by_test_id("stVegaLiteChart").filter(has_text="the pool now")
    seen: list[list[tuple[int, int]]] = []
    pictures: list[bytes] = []
    while page.get_by_text("running ·").count() and len(seen) < 200:
        seen.append(blocks_held(page))
        if len(pictures) < 2 or pictures[-1] == pictures[-2]:
            pictures.append(pools.first.screenshot())
        if len(seen) == 6:
            take_screenshot(page, tmp_path)
        page.wait_for_timeout(150)
    mid_race = [lanes for lanes in seen if len(lanes) == 2]
    assert len(mid_race) >= 3, "the race ended before the pools could be watched"
    assert {total for lanes in mid_race for _, total in lanes} == {1024 // 16}  # the same budget on both lanes
    for lane in (0, 1):
        held = [lanes[lane][0] for lanes in mid_race]
        assert max(held) > 0, f"lane {lane} never took a block"
        peak = held.index(max(held))
        assert len(set(held)) > 1, f"lane {lane}'s pool never changed mid-race"
        if lane == 0:  # continuous gives a request's blocks back as it finishes (static: when its wave ends)
            assert min(held[peak:]) < max(held), "continuous never gave a block back mid-race"
    assert len(set(pictures)) > 1, "the pool chart was never redrawn differently"
    page.get_by_text("the ratio of the two clocks").or_(page.get_by_text("No speed-up")).wait_for(timeout=120_000)
    page.wait_for_selector(IDLE)
    assert [held for held, _ in blocks_held(page)] == [0, 0]  # every block back (free or cached) at the end
    assert pools.count() == 2


def take_screenshot(page, tmp_path) -> None:
    """The memory part mid-race, into BATCHSCOPE_MEMORY_SCREENSHOT (or a temporary file)."""
    page.set_viewport_size({"width": 1440, "height": 2000})
    heading = page.get_by_test_id("stMain").get_by_text(HEADER)
    heading.scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    box = heading.bounding_box()
    assert box is not None
    path = os.environ.get("BATCHSCOPE_MEMORY_SCREENSHOT") or str(tmp_path / "memory.png")
    page.screenshot(path=path, clip={"x": 300, "y": max(0, box["y"] - 10), "width": 1140, "height": 1000})
    page.set_viewport_size({"width": 1440, "height": 1000})
