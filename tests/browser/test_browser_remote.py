"""A remote run end to end in a real browser: the page pointed at our own server (`python -m batching.serve`) by
`BATCHSCOPE_REMOTE__URL`, the queue streamed into the cards, then the static waves, the server's telemetry, the
comparison and the exports; and a wrong key shown as one message in the sidebar."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.browser.helpers import BROWSER_MARKS, IDLE, new_page, start_streamlit, stop_streamlit
from tests.helpers import free_port
from tests.serve.helpers import our_server

pytestmark = BROWSER_MARKS


@pytest.fixture(scope="module")
def remote_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """Our server (with an API key), and the page started with that server as its default remote engine."""
    folder = tmp_path_factory.mktemp("browser-remote")
    with our_server(folder, {"BATCHSCOPE_SERVER__API_KEY": "sesame"}) as (server_url, _):
        port = free_port()
        env = {"BATCHSCOPE_REMOTE__URL": server_url + "/v1", "BATCHSCOPE_REMOTE__API_KEY": "sesame"}
        with (folder / "streamlit.log").open("wb") as log:
            app = start_streamlit(port, log, env=env)
            try:
                yield f"http://127.0.0.1:{port}", server_url
            finally:
                stop_streamlit(app)


@pytest.mark.long
def test_a_remote_run_streams_compares_and_exports(remote_app: tuple[str, str], chromium, tmp_path: Path) -> None:
    app_url, _ = remote_app
    page = new_page(chromium, app_url)
    sidebar = page.get_by_test_id("stSidebar")
    sidebar.get_by_text("Watching model builtin at").wait_for()
    main = page.get_by_test_id("stMain")
    main.get_by_role("button", name="Load example").click()
    page.get_by_text("11 of 64 prompts").wait_for()
    page.wait_for_selector(IDLE)

    # Staggered arrivals (one every 0.5 s) keep the live pass going for seconds: sent at once, the 11 answers can
    # all be in within a second, before a loaded machine's browser draws one of them streaming (seen in CI).
    sidebar.get_by_text("staggered", exact=True).click()
    page.wait_for_timeout(500)
    page.wait_for_selector(IDLE)
    assert sidebar.get_by_test_id("stSlider").filter(has_text="Seconds between requests").count() == 1
    main.get_by_role("button", name="Generate").click()
    page.get_by_test_id("stText").filter(has_text="▌").first.wait_for(timeout=30_000)  # answers streaming in
    assert page.get_by_text("Remote server: every time here is measured by this page's client").count() == 1
    page.get_by_text("Same queue, same server, same N:").wait_for(timeout=180_000)
    page.wait_for_selector(IDLE)

    assert page.get_by_text("finished · 11 of 11 done").count() == 1
    assert page.get_by_test_id("stText").filter(has_text="▌").count() == 0
    texts = page.get_by_test_id("stText").all_inner_texts()
    assert len(texts) == 11 and all(text.strip() for text in texts)
    # client view (3 charts) and server telemetry, for continuous and static
    assert page.get_by_test_id("stVegaLiteChart").count() == 8
    assert page.get_by_text("Server telemetry (Batchscope").count() == 2
    assert page.get_by_test_id("stAlertContentError").count() == 0
    with page.expect_download() as download:
        main.get_by_role("button", name="Server telemetry (CSV)").click()
    saved = tmp_path / "telemetry.csv"
    download.value.save_as(saved)
    lines = saved.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith('"time_s","engine","running","waiting"') and len(lines) > 2


def test_a_wrong_key_is_one_message_in_the_sidebar(remote_app: tuple[str, str], chromium) -> None:
    app_url, _ = remote_app
    page = new_page(chromium, app_url)
    sidebar = page.get_by_test_id("stSidebar")
    key = sidebar.get_by_label("API key")
    key.fill("guess")
    key.press("Enter")
    sidebar.get_by_text("refused the API key (HTTP 401)").wait_for()
    page.wait_for_selector(IDLE)
    assert sidebar.get_by_test_id("stAlertContentError").count() == 1
