"""A newcomer's first page load, in Debian's chromium, on a fresh server.

The engine process is forked from the page server by the first page load. It must let go of every socket it
inherited: while it held a copy of the browser's keep-alive connection, the browser's next requests on it (the
lazily loaded scripts of radios, sliders and text inputs) went unanswered and the widgets stayed grey skeletons.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.browser.helpers import BROWSER_MARKS, IDLE, new_page, start_streamlit, stop_streamlit
from tests.helpers import children_of, free_port

pytestmark = BROWSER_MARKS

# Every widget the sidebar draws on the default view (the race), by its accessible name: the navigation first.
SIDEBAR_WIDGETS = [
    ("link", "Race: continuous vs static"),
    ("link", "Shared engine (everyone's requests)"),
    ("link", "Remote server"),
    ("link", "Load sweep"),
    ("slider", "Slow motion (pause between steps, ms)"),
    ("slider", "Batch size (slots)"),
    ("combobox", "Scheduling policy"),
    ("radiogroup", "Decoding"),
    ("spinbutton", "Repetition penalty"),
    ("spinbutton", "Seed"),
    ("textbox", "System prompt"),
    ("radiogroup", "How requests join"),
]


def sockets_of(pid: int) -> list[str]:
    """The sockets a process holds, as /proc names them (`socket:[inode]`)."""
    links = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
    return [link for link in links if link.startswith("socket:")]


@pytest.fixture(scope="module")
def fresh_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """A page server nobody has loaded yet (so no engine process): its address and its PID."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("first-load") / "server.log"
    with log_path.open("wb") as log:
        server = start_streamlit(port, log)
        try:
            yield f"http://127.0.0.1:{port}", server.pid
        finally:
            stop_streamlit(server)


def assert_every_sidebar_widget_rendered(page) -> None:
    sidebar = page.get_by_test_id("stSidebar")
    for role, name in SIDEBAR_WIDGETS:
        sidebar.get_by_role(role, name=name).first.wait_for(state="visible", timeout=30_000)
    # The queue's table is drawn last (after the sidebar) and loads a script of its own: a grey box until it has.
    page.get_by_test_id("stMain").get_by_test_id("stDataFrame").wait_for(state="visible", timeout=30_000)
    assert page.get_by_test_id("stSkeleton").count() == 0


def test_two_fresh_pages_render_every_sidebar_widget_and_the_engine_holds_no_socket(fresh_server, chromium) -> None:
    url, server_pid = fresh_server
    assert children_of(server_pid) == [], "the server was fresh: no engine process before the first page"
    pages = []
    for _ in range(2):  # two browser contexts: two sessions, each with its own connections
        context = chromium.new_context(viewport={"width": 1440, "height": 1000})
        page = context.new_page()
        page.set_default_timeout(60_000)
        page.goto(url)
        pages.append(page)
    for page in pages:
        page.wait_for_selector(IDLE)
        assert_every_sidebar_widget_rendered(page)
    engines = children_of(server_pid)
    assert len(engines) == 1, f"one engine process for every page, found {engines}"
    assert sockets_of(engines[0]) == [], "the engine process kept sockets it inherited from the page server"
    # A page loaded after the engine started renders as well.
    later = new_page(chromium, url)
    assert_every_sidebar_widget_rendered(later)
    for page in [*pages, later]:
        page.context.close()
