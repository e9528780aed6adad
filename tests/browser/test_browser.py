"""The real app in Debian's chromium: answers stream in while the run goes on, prompts join a running batch,
the charts and the comparison appear, Stop cancels. The README's screenshot is taken by this test only when
BATCHSCOPE_SCREENSHOT names a file (`BATCHSCOPE_SCREENSHOT=docs/screenshot.png python -m pytest
tests/browser/test_browser.py`): the suite never writes a tracked file.
"""

from __future__ import annotations

import os
import time

import pytest

from tests.browser.helpers import BROWSER_MARKS, IDLE, add_prompt, new_page, use_shared_engine

pytestmark = BROWSER_MARKS
GRID = 10  # the token grid's place among the page's charts: after 5 charts x (continuous, static)
STREAMING_IN_A_SLOT = """() => {
    const main = document.querySelector("[data-testid='stMain']");
    const texts = [...document.querySelectorAll("[data-testid='stText']")];
    const shown = main === null ? "" : main.innerText;
    const streaming = texts.some((text) => text.innerText.includes("▌"));
    return streaming && shown.includes("in slot") && shown.includes("running ·");
}"""


@pytest.fixture(scope="module")
def page(app_url: str, chromium):
    """One page for the module's tests, which run in order on it, on the shared engine (the race has its own)."""
    page = new_page(chromium, app_url)
    use_shared_engine(page)
    return page


@pytest.mark.long
def test_caps_edited_and_rows_deleted_in_the_table_reach_the_queue(page) -> None:
    """The data editor draws on a canvas: click a cell, type, Enter (slowly, or input is dropped)."""
    page.get_by_test_id("stMain").get_by_role("button", name="Load example").click()
    page.get_by_text("11 of 64 prompts").wait_for()
    page.wait_for_selector(IDLE)
    grid = page.get_by_test_id("stDataFrame").first  # the queue; the last one is the figures
    grid.scroll_into_view_if_needed()
    box = grid.bounding_box()

    def row_y(row: int) -> float:
        return box["y"] + 35 * (row + 1) + 17  # under a 35 px header, rows of 35 px

    page.mouse.click(box["x"] + box["width"] - 40, row_y(1))  # the cap of the second prompt
    page.wait_for_timeout(300)
    page.keyboard.type("5")
    page.wait_for_timeout(300)
    page.keyboard.press("Enter")
    page.wait_for_timeout(1000)
    page.wait_for_selector(IDLE)
    page.mouse.click(box["x"] + 15, row_y(0))  # select the first row, then delete it
    page.wait_for_timeout(300)
    page.keyboard.press("Delete")
    page.get_by_text("10 of 64 prompts").wait_for()
    page.wait_for_selector(IDLE)
    # The table is redrawn from the canonical queue: the edited prompt is now first, with its new cap.
    assert grid.get_by_test_id("glide-cell-2-0").text_content() == "What's your return policy?"
    assert grid.get_by_test_id("glide-cell-3-0").text_content() == "5"
    assert grid.get_by_test_id("glide-cell-1-0").text_content() == "1"  # the index counts from 1, as messages do

    # A cap typed as 2.5 reaches the queue as typed and is refused, naming the row as the table's index shows it.
    page.mouse.click(box["x"] + box["width"] - 40, row_y(0))
    page.wait_for_timeout(300)
    page.keyboard.type("2.5")
    page.wait_for_timeout(300)
    page.keyboard.press("Enter")
    page.get_by_text("row 1: max new tokens must be a whole number from 1 to").wait_for()
    page.wait_for_selector(IDLE)
    assert page.get_by_text("not '2.5'").count() == 1
    assert grid.get_by_test_id("glide-cell-3-0").text_content() == "5"  # unchanged


@pytest.mark.long
def test_answers_stream_while_the_run_goes_on_and_the_comparison_follows(page, record_property, tmp_path) -> None:
    page.get_by_test_id("stMain").get_by_role("button", name="Load example").click()
    page.get_by_text("11 of 64 prompts").wait_for()
    page.wait_for_selector(IDLE)
    add_prompt(page, "Do you ship to Canada?")
    page.get_by_text("12 of 64 prompts").wait_for()
    page.wait_for_selector(IDLE)

    clicked = time.perf_counter()
    page.get_by_test_id("stMain").get_by_role("button", name="Generate").click()
    # A streaming answer (its cursor), a running request's "in slot N" line and the run's "running ·" line on the page
    # at one moment, checked in the page in one go: checked one after the other, the run could move on in between
    # (it failed so twice under the whole suite's load).
    page.wait_for_function(STREAMING_IN_A_SLOT, timeout=20_000)
    first_token_s = time.perf_counter() - clicked
    record_property("first_token_s", round(first_token_s, 3))
    print(f"\nfirst streamed token {first_token_s:.2f} s after clicking Generate")  # reported, not asserted

    page.get_by_text("continuous finished").or_(page.get_by_text("static finished")).wait_for(timeout=120_000)
    # The export section comes once the comparison's replays after the run are done: how long they take is the
    # machine's speed, so wait for it rather than expect it at the first idle moment.
    export = page.get_by_test_id("stMain").get_by_role("button", name="Everything (JSON)")
    export.wait_for(timeout=120_000)
    page.wait_for_selector(IDLE)
    assert page.get_by_test_id("stText").filter(has_text="▌").count() == 0
    assert page.get_by_text("finished · 12 of 12 done").count() == 1
    # 5 charts (occupancy, latency, timeline, wait strip, inter-token gaps) x (continuous, static), the token grid,
    # the picked step's attention mask
    assert page.get_by_test_id("stVegaLiteChart").count() == 12
    texts = page.get_by_test_id("stText").all_inner_texts()
    assert len(texts) == 12 and sum(1 for text in texts if text.strip()) >= 11
    assert export.count() == 1

    page.set_viewport_size({"width": 1440, "height": 6400})
    page.wait_for_timeout(1500)  # let the charts lay out at the new size
    screenshot = os.environ.get("BATCHSCOPE_SCREENSHOT") or str(tmp_path / "screenshot.png")
    page.get_by_test_id("stMain").screenshot(path=screenshot)
    page.set_viewport_size({"width": 1440, "height": 1000})


@pytest.mark.long  # reads the page a long test before it left
def test_a_click_on_the_token_grid_opens_that_step_in_the_inspector(page, record_property, tmp_path) -> None:
    main = page.get_by_test_id("stMain")
    main.get_by_text("4 · Inside the steps").scroll_into_view_if_needed()
    shown = time.perf_counter()
    main.get_by_text("static (replay)").click()
    page.wait_for_selector(IDLE)
    grid = main.get_by_test_id("stVegaLiteChart").nth(GRID)
    grid.locator("canvas, svg").first.wait_for()
    draw_s = time.perf_counter() - shown
    record_property("grid_draw_s", round(draw_s, 3))
    print(f"\nthe static run's token grid drew {draw_s:.2f} s after picking it")
    slider = main.get_by_role("group", name="Step").get_by_test_id("stSliderThumbValue")
    assert slider.inner_text() == "1"
    picked = 1
    for _ in range(3):  # Streamlit may swap the chart's element once after its first draw: click again if so
        page.wait_for_timeout(1000)
        page.wait_for_selector(IDLE)
        grid = main.get_by_test_id("stVegaLiteChart").nth(GRID)
        grid.scroll_into_view_if_needed()
        box = grid.bounding_box()
        page.mouse.click(box["x"] + box["width"] * 0.6, box["y"] + box["height"] * 0.3)  # a cell of a later step
        page.wait_for_timeout(500)
        page.wait_for_selector(IDLE)
        picked = int(slider.inner_text())
        if picked > 1:
            break
    assert picked > 1, "the click did not move the inspector to another step"
    assert main.get_by_text("tokens packed into this step").count() == 1
    # the picked step's attention mask is drawn under it, with the static wave's padded rectangle
    mask = main.get_by_test_id("stVegaLiteChart").nth(GRID + 1)
    mask.locator("canvas, svg").first.wait_for()
    assert main.get_by_text("The attention mask the engine built for this step").count() == 1
    assert main.get_by_text("Padded rectangle:").count() == 1
    main.get_by_role("slider").focus()  # back to the first step, the wave's padded prefill, for the screenshot
    page.keyboard.press("Home")
    page.wait_for_timeout(500)
    page.wait_for_selector(IDLE)
    assert slider.inner_text() == "1"
    page.set_viewport_size({"width": 1440, "height": 3000})
    page.wait_for_timeout(1000)
    heading = main.get_by_text("4 · Inside the steps")
    heading.evaluate("element => element.scrollIntoView({block: 'start'})")  # the section from the top down
    page.wait_for_timeout(500)
    screenshot = os.environ.get("BATCHSCOPE_INSPECTOR_SCREENSHOT") or str(tmp_path / "inspector.png")
    box, end = heading.bounding_box(), main.get_by_text("Padded rectangle:").bounding_box()
    height = end["y"] + end["height"] + 50 - (box["y"] - 10)  # from the heading down to the padded rectangle (2 lines)
    page.screenshot(path=screenshot, clip={"x": 300, "y": box["y"] - 10, "width": 1140, "height": height})
    page.set_viewport_size({"width": 1440, "height": 1000})


@pytest.mark.long  # reads the page a long test before it left
def test_a_prompt_added_mid_run_joins_it_and_stop_cancels_the_rest(page) -> None:
    # Staggered arrivals, one every 3 s (the slider's end), keep the run going long enough to act in the middle
    # of it even on a loaded machine (at 0.5 s, every prompt could be sent before Stop got through).
    sidebar = page.get_by_test_id("stSidebar")
    sidebar.get_by_text("staggered", exact=True).click()
    interval = sidebar.get_by_test_id("stSlider").filter(has_text="Seconds between requests")
    interval.get_by_role("slider").focus()
    interval.get_by_role("slider").press("End")
    page.wait_for_timeout(500)
    page.wait_for_selector(IDLE)
    assert interval.get_by_test_id("stSliderThumbValue").inner_text() == "3.00"
    page.get_by_test_id("stMain").get_by_role("button", name="Generate").click()
    page.get_by_test_id("stText").filter(has_text="▌").first.wait_for(timeout=20_000)

    add_prompt(page, "Can I pay with PayPal?")  # joins the batch that is already running
    page.get_by_text("#13 · Can I pay with PayPal?").wait_for()
    page.get_by_text("running ·").wait_for(timeout=5_000)
    page.get_by_test_id("stMain").get_by_role("button", name="Stop").click()
    page.get_by_text("stopped ·").wait_for(timeout=30_000)
    page.get_by_text("No comparison: the run was stopped").wait_for()  # drawn once the page has caught up
    page.wait_for_selector(IDLE)
    assert page.get_by_text("not run: stopped before it was sent").count() >= 1
    assert page.get_by_test_id("stText").filter(has_text="▌").count() == 0
    assert page.get_by_test_id("stMain").get_by_role("button", name="Generate").is_enabled()


def test_the_server_log_shows_the_engines_info_lines(page, app_server) -> None:
    """The page configures logging in its entry point: the loader's INFO line reaches the server's log, once."""
    page.wait_for_selector(IDLE)
    lines = app_server.log.read_text(encoding="utf-8", errors="replace").splitlines()
    loaded = [line for line in lines if "INFO model.loader: loaded builtin on cpu" in line]
    assert len(loaded) == 1, lines[-20:]


RISKY_PROMPT = "See www.example.com, https://example.org/a?b=1 or mail bob@example.com :material/home: \u202eevil"


def test_a_prompt_with_links_an_email_an_icon_code_and_a_bidi_override_shows_as_plain_text(page) -> None:
    main = page.get_by_test_id("stMain")
    main.get_by_role("button", name="Clear all").click()
    page.get_by_text("0 of 64 prompts").wait_for()
    page.wait_for_selector(IDLE)
    add_prompt(page, RISKY_PROMPT)
    page.get_by_text("1 of 64 prompts").wait_for()
    page.wait_for_selector(IDLE)
    main.get_by_role("button", name="Generate").click()
    page.get_by_text("1 of 1 done").wait_for(timeout=60_000)
    page.wait_for_selector(IDLE)
    heading = main.get_by_test_id("stHtml").filter(has_text="#1 ·")
    assert heading.count() == 1
    assert heading.locator("a").count() == 0  # no link from the URL, the bare domain or the e-mail address
    assert heading.get_by_test_id("stIconMaterial").count() == 0 and heading.locator("svg").count() == 0
    assert heading.locator("bdi").inner_text() == RISKY_PROMPT  # every character as typed, direction isolated
    assert heading.inner_text().startswith("#1 · ")
