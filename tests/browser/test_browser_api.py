"""The API inside the page's process (`BATCHSCOPE_SERVER__PORT`): an API client's request and a browser tab's run
share one engine, and the tab's live run shows the API request as another user's in its batch.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator

import openai
import pytest

from tests.browser.helpers import (
    BROWSER_MARKS,
    IDLE,
    new_page,
    start_streamlit,
    stop_streamlit,
    use_shared_engine,
)
from tests.helpers import free_port

pytestmark = BROWSER_MARKS


@pytest.fixture(scope="module")
def app_with_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    page_port, api_port = free_port(), free_port()
    log_path = tmp_path_factory.mktemp("streamlit-api") / "server.log"
    with log_path.open("wb") as log:
        server = start_streamlit(page_port, log, env={"BATCHSCOPE_SERVER__PORT": str(api_port)})
        try:
            yield f"http://127.0.0.1:{page_port}", f"http://127.0.0.1:{api_port}"
        finally:
            stop_streamlit(server)


def _wait_for_api(url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise AssertionError("the API inside the page's process did not answer /health in 60 s")


@pytest.mark.long
def test_an_api_request_shares_the_batch_with_a_tabs_run(app_with_api: tuple[str, str], chromium) -> None:
    page_url, api_url = app_with_api
    page = new_page(chromium, page_url)  # the first page load starts the engine and the API
    use_shared_engine(page)  # the API's requests and the tab's share that engine's batches
    page.get_by_text(f"OpenAI-compatible API: {api_url}/v1").wait_for()
    _wait_for_api(api_url)
    client = openai.OpenAI(base_url=api_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    answers: list = []
    api_call = threading.Thread(
        target=lambda: answers.append(
            client.completions.create(
                model="builtin", prompt="Q: Hello\nA:", max_tokens=900, temperature=0, extra_body={"ignore_eos": True}
            )
        )
    )
    main = page.get_by_test_id("stMain")
    main.get_by_role("button", name="Load example").click()
    page.get_by_text("11 of 64 prompts").wait_for()
    page.wait_for_selector(IDLE)
    api_call.start()
    time.sleep(0.3)  # the API request is in the batch before the tab's prompts arrive
    main.get_by_role("button", name="Generate").click()
    page.get_by_text("finished · 11 of 11 done").wait_for(timeout=120_000)
    page.wait_for_selector(IDLE)
    api_call.join(timeout=120)
    assert answers and answers[0].usage.completion_tokens == 900
    # the live run saw another client's request in its steps: the page says its figures include that load
    # (900 tokens keep the API request in the batch while the tab's prompts run, even on a loaded machine; the note
    # is drawn once the replays after the run are done)
    page.get_by_text("Other people's requests shared the engine during your live run").wait_for(timeout=120_000)
