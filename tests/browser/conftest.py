"""The browser tests' fixtures: the Streamlit server and chromium (plain helpers in tests/browser/helpers.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.browser.helpers import CHROMIUM, CHROMIUM_ARGS, start_streamlit, stop_streamlit
from tests.helpers import free_port


@dataclass(frozen=True)
class AppServer:
    """A running `streamlit run` of the page: its address, and the file its log (stdout and stderr) goes to."""

    url: str
    log: Path


@pytest.fixture(scope="module")
def app_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    """`streamlit run` on a free port with the default settings (the embedded model), stopped by its PID."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("streamlit") / "server.log"
    with log_path.open("wb") as log:
        server = start_streamlit(port, log)
        try:
            yield AppServer(f"http://127.0.0.1:{port}", log_path)
        finally:
            stop_streamlit(server)


@pytest.fixture(scope="module")
def app_url(app_server: AppServer) -> str:
    return app_server.url


@pytest.fixture(scope="module")
def chromium() -> Iterator[object]:
    """Debian's chromium through Playwright (never `playwright install`), closed after the module."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()
