"""Plain helpers of the browser tests (the fixtures that use them are in conftest.py): where chromium is, how to
launch it, when the page is idle, how to start `streamlit run`, and what a test does on the page.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import IO

import pytest

from tests.helpers import KEEP_EAGER, ROOT

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
IDLE = "[data-testid='stApp'][data-test-script-state='notRunning']"

# Every browser test module: `pytestmark = BROWSER_MARKS` (skipped without chromium, except under CI=true).
BROWSER_MARKS = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists() and os.environ.get("CI", "").lower() != "true",
        reason="Debian's chromium is not installed (apt-get install chromium)",
    ),
]


def start_streamlit(port: int, log: IO[bytes], env: dict[str, str] | None = None) -> subprocess.Popen:
    """`streamlit run` on `port` with the default settings (no BATCHSCOPE_ variable), its output into `log`;
    returns once it answers /_stcore/health (the caller stops it with `stop_streamlit`)."""
    clean = {name: value for name, value in os.environ.items() if not name.startswith("BATCHSCOPE_")}
    clean[KEEP_EAGER] = os.environ.get(KEEP_EAGER, "false")
    command = [sys.executable, "-m", "streamlit", "run", "streamlit_app.py", "--server.headless", "true"]
    command += ["--server.port", str(port), "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"]
    server = subprocess.Popen(command, cwd=ROOT, env={**clean, **(env or {})}, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while True:
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=1).read() == b"ok":
                return server
        except OSError:
            pass
        if server.poll() is not None or time.monotonic() >= deadline:
            stop_streamlit(server)
            raise AssertionError("streamlit exited or did not answer /_stcore/health within 60 s")
        time.sleep(0.2)


def stop_streamlit(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()


def new_page(browser, url: str):
    """A page in its own browser context (its own cookies and websocket, so its own Streamlit session), loaded."""
    context = browser.new_context(viewport={"width": 1440, "height": 1000}, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(60_000)
    page.goto(url)
    page.wait_for_selector(IDLE)
    return page


def add_prompt(page, text: str) -> None:
    box = page.get_by_label("Prompt", exact=True)
    box.fill(text)
    box.press("Enter")  # a text input commits on Enter (or blur)
    page.get_by_test_id("stMain").get_by_role("button", name="Add", exact=True).click()


def open_view(page, title: str) -> None:
    """Open a view by its title in the sidebar's navigation, and wait until it is drawn."""
    page.get_by_test_id("stSidebarNav").get_by_role("link", name=title, exact=True).click()
    page.wait_for_selector(IDLE)


def use_shared_engine(page) -> None:
    """Run the queue on the shared engine (with everyone's requests) rather than the race the page opens on."""
    open_view(page, "Shared engine (everyone's requests)")
    page.get_by_text("Compare with static batching afterwards").wait_for()
