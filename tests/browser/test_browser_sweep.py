"""The load sweep in Debian's chromium: the view opened from the navigation, a small sweep run on the embedded model
with its progress bar, then its headline, five charts and the table of every point.

The README's screenshot is taken only when BATCHSCOPE_SWEEP_SCREENSHOT names a file, and then of the default sweep
(its rates picked for the machine by a first race; about two minutes here):
`BATCHSCOPE_SWEEP_SCREENSHOT=docs/sweep.png python -m pytest tests/browser/test_browser_sweep.py`. The suite never
writes a tracked file.
"""

from __future__ import annotations

import os
import re

import pytest

from tests.browser.helpers import BROWSER_MARKS, IDLE, new_page, open_view

pytestmark = BROWSER_MARKS


@pytest.mark.long
def test_a_sweep_runs_with_a_progress_bar_and_ends_with_its_headline_charts_and_table(
    app_url: str, chromium, tmp_path
) -> None:
    page = new_page(chromium, app_url)
    open_view(page, "Load sweep")
    main = page.get_by_test_id("stMain")
    screenshot = os.environ.get("BATCHSCOPE_SWEEP_SCREENSHOT")
    if not screenshot:  # a short sweep for the suite; the README's shot is of the default one
        box = page.get_by_label("Request rates (requests/s)", exact=True)
        box.fill("4, 16, 64")
        box.press("Enter")  # a text input commits on Enter
        page.wait_for_selector(IDLE)
        count = page.get_by_label("Requests per rate", exact=True)
        count.fill("12")
        count.press("Enter")
        page.wait_for_selector(IDLE)
    main.get_by_role("button", name="Run sweep").click()
    main.get_by_test_id("stProgress").wait_for(timeout=30_000)
    main.get_by_text(re.compile(r"Done: (\d+) of \1 rates swept")).wait_for(timeout=600_000)
    main.get_by_text("3 · Every point").wait_for(timeout=60_000)  # drawn last, after the sweep's end
    page.wait_for_selector(IDLE)
    headline = main.get_by_test_id("stAlertContentSuccess")
    assert headline.count() == 1
    assert headline.inner_text().startswith("At TTFT p90 ≤ 200 ms and TPOT p90 ≤ 100 ms, ")
    assert main.get_by_test_id("stVegaLiteChart").count() == 5
    assert main.get_by_text("Knees · continuous:").count() == 1
    assert main.get_by_test_id("stDataFrame").count() == 1
    assert main.get_by_role("button", name="Run sweep").is_enabled()
    page.set_viewport_size({"width": 1440, "height": 2400})  # the page scrolls inside stMain: make it all visible
    page.wait_for_timeout(1000)
    top = main.get_by_text("2 · The sweep").bounding_box()  # from the bar to the table: the headline and charts
    bottom = main.get_by_text("3 · Every point").bounding_box()
    clip = {"x": 300, "y": top["y"] - 10, "width": 1140, "height": bottom["y"] - top["y"]}
    page.screenshot(path=screenshot or str(tmp_path / "sweep.png"), clip=clip)
