"""The race in Debian's chromium: both lanes stream while the race runs, a prompt added mid-race joins both lanes,
Stop cancels both, and a race at real speed ends with the speed-up. The README's mid-race screenshot is taken only
when BATCHSCOPE_RACE_SCREENSHOT names a file (`BATCHSCOPE_RACE_SCREENSHOT=docs/race.png python -m pytest
tests/browser/test_browser_race.py`; the wait strip's with BATCHSCOPE_WAIT_SCREENSHOT=docs/waiting.png): the suite never
writes a tracked file.
"""

from __future__ import annotations

import os

import pytest

from tests.browser.helpers import BROWSER_MARKS, IDLE, add_prompt, new_page

pytestmark = BROWSER_MARKS


@pytest.fixture(scope="module")
def page(app_url: str, chromium):
    """One page for the module's tests, which run in order on it (the race is the default)."""
    return new_page(chromium, app_url)


def lane_texts(page) -> tuple[list[str], list[str]]:
    """Each card shows its answer on the continuous lane, then on the static lane."""
    texts = page.get_by_test_id("stMain").get_by_test_id("stText").all_inner_texts()
    return texts[0::2], texts[1::2]


def set_slow_motion(page, steps_of_10_ms: int) -> None:
    slider = page.get_by_test_id("stSidebar").get_by_test_id("stSlider").filter(has_text="Slow motion")
    thumb = slider.get_by_role("slider")
    thumb.focus()
    for _ in range(steps_of_10_ms):
        thumb.press("ArrowRight")
    page.wait_for_timeout(500)
    page.wait_for_selector(IDLE)
    assert slider.get_by_test_id("stSliderThumbValue").inner_text() == str(10 * steps_of_10_ms)


@pytest.mark.long
def test_a_race_at_real_speed_ends_with_both_lanes_answered_and_the_speedup(page) -> None:
    main = page.get_by_test_id("stMain")
    main.get_by_role("button", name="Load example").click()
    page.get_by_text("11 of 64 prompts").wait_for()
    page.wait_for_selector(IDLE)
    main.get_by_role("button", name="Generate").click()
    page.get_by_text("continuous finished").or_(page.get_by_text("static finished")).wait_for(timeout=120_000)
    main.get_by_text("the ratio of the two clocks").wait_for(timeout=60_000)  # drawn by the rerun after the race
    page.wait_for_selector(IDLE)
    continuous, static = lane_texts(page)
    assert len(continuous) == len(static) == 11
    assert continuous == static  # greedy: the same answers, scheduled differently
    assert page.get_by_text("continuous: 11 of 11 done").count() == 1
    # 5 charts (occupancy, latency, timeline, wait strip, inter-token gaps) + 2 of memory x 2 lanes, grid, mask
    assert main.get_by_test_id("stVegaLiteChart").count() == 16
    assert main.get_by_text("the ratio of the two clocks").count() == 1
    assert main.get_by_text("static wave running", exact=True).count() >= 1  # the numbers' table of reasons


@pytest.mark.long  # reads the page a long test before it left
def test_the_wait_strip_and_the_inter_token_gaps_are_drawn_for_both_lanes(page, tmp_path) -> None:
    """After the race above: both rows are there for both lanes; the README's picture of them when
    BATCHSCOPE_WAIT_SCREENSHOT names a file."""
    main = page.get_by_test_id("stMain")
    strip = main.get_by_text("One row per request, one cell per step").first
    gaps = main.get_by_text("Each request's inter-token gap over the run").first
    assert main.get_by_text("One row per request, one cell per step").count() == 2
    assert main.get_by_text("Each request's inter-token gap over the run").count() == 2
    viewport = page.viewport_size
    page.set_viewport_size({"width": 1440, "height": 1600})
    try:
        strip.evaluate("element => element.scrollIntoView({block: 'start'})")
        page.mouse.move(700, 400)
        page.mouse.wheel(0, -600)  # the strip's chart sits above its caption
        page.wait_for_timeout(500)
        top, bottom = strip.bounding_box(), gaps.bounding_box()
        assert top is not None and bottom is not None and bottom["y"] > top["y"]
        # Each caption sits under its chart: from above the strip's chart to the end of the gaps' caption.
        first = max(0.0, top["y"] - 520)
        path = os.environ.get("BATCHSCOPE_WAIT_SCREENSHOT") or str(tmp_path / "waiting.png")
        page.screenshot(path=path, clip={"x": 300, "y": first, "width": 1140, "height": bottom["y"] + 50 - first})
    finally:
        page.set_viewport_size(viewport)


@pytest.mark.long
def test_mid_race_both_lanes_stream_a_new_prompt_joins_both_and_stop_cancels_both(page, tmp_path) -> None:
    set_slow_motion(page, 3)  # 30 ms between steps: long enough to act in the middle of the race
    main = page.get_by_test_id("stMain")
    main.get_by_role("button", name="Generate").click()
    page.get_by_text("running ·").wait_for(timeout=20_000)
    page.get_by_test_id("stText").filter(has_text="▌").first.wait_for(timeout=20_000)
    page.wait_for_timeout(2500)  # a few waves in: static answers arrive by waves, continuous ones as slots free
    continuous, static = lane_texts(page)
    assert page.get_by_text("running ·").count() == 1, "the race ended before both lanes could be seen streaming"
    assert any(text.strip() for text in continuous) and any(text.strip() for text in static)
    page.set_viewport_size({"width": 1440, "height": 3200})  # tall enough for the answers without scrolling
    page.wait_for_timeout(500)
    box = main.get_by_text("2 · Answers, racing").bounding_box()
    screenshot = os.environ.get("BATCHSCOPE_RACE_SCREENSHOT") or str(tmp_path / "race.png")
    page.screenshot(path=screenshot, clip={"x": 300, "y": box["y"] - 10, "width": 1140, "height": 1400})
    page.set_viewport_size({"width": 1440, "height": 1000})

    add_prompt(page, "Can I pay with PayPal?")  # joins both lanes at the same clock time
    page.get_by_text("#12 · Can I pay with PayPal?").wait_for()
    # The innermost block holding the heading is the card (blocks come before the blocks inside them).
    card = main.get_by_test_id("stVerticalBlock").filter(has_text="#12 · Can I pay with PayPal?").last
    statuses = card.get_by_test_id("stCaptionContainer")
    statuses.filter(has_text="in slot").or_(statuses.filter(has_text="done")).first.wait_for(timeout=30_000)
    assert page.get_by_text("running ·").count() == 1
    main.get_by_role("button", name="Stop").click()
    page.get_by_text("stopped ·").wait_for(timeout=60_000)
    # The race's end reruns the script (so Generate and Stop redraw), and the page may read idle for a moment
    # between the two runs: wait for what the second run draws last, then for idle.
    page.get_by_text("No speed-up: the race was stopped").wait_for(timeout=60_000)
    page.wait_for_selector(IDLE)
    assert page.get_by_text("No speed-up: the race was stopped").count() == 1
    assert main.get_by_text("cancelled").count() + main.get_by_text("stopped before it was sent").count() >= 2
    # Every answer's last draw drops its cursor; the page may show one a moment after it reads idle (seen once in
    # CI), so give it a few seconds: a cursor that stays is a failure.
    cursors = page.get_by_test_id("stText").filter(has_text="▌")
    for _ in range(50):
        if cursors.count() == 0:
            break
        page.wait_for_timeout(200)
    assert cursors.count() == 0
    assert main.get_by_role("button", name="Generate").is_enabled()
    continuous, static = lane_texts(page)
    assert len(continuous) == len(static) == 12
