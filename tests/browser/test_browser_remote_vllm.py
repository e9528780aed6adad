"""The page watching vLLM itself, in a real browser: started with the session's real vLLM server as its remote
engine (`BATCHSCOPE_REMOTE__URL`), the example queue streamed into the cards, the static waves after it, and the
server telemetry charted as vLLM reported it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.bench.vllm_helpers import RunningVllm
from tests.browser.helpers import BROWSER_MARKS, IDLE, new_page, start_streamlit, stop_streamlit
from tests.helpers import free_port

pytestmark = BROWSER_MARKS


@pytest.fixture(scope="module")
def page_on_vllm(vllm: RunningVllm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log_path = tmp_path_factory.mktemp("browser-vllm") / "streamlit.log"
    with log_path.open("wb") as log:
        app = start_streamlit(port, log, env={"BATCHSCOPE_REMOTE__URL": vllm.url + "/v1"})
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            stop_streamlit(app)


@pytest.mark.long
def test_the_page_runs_the_example_queue_on_vllm_and_charts_vllms_own_telemetry(
    page_on_vllm: str, vllm: RunningVllm, chromium
) -> None:
    page = new_page(chromium, page_on_vllm)
    page.get_by_test_id("stSidebar").get_by_text(f"Watching model {vllm.model} at").wait_for()
    main = page.get_by_test_id("stMain")
    main.get_by_role("button", name="Load example").click()
    page.get_by_text("11 of 64 prompts").wait_for()
    page.wait_for_selector(IDLE)

    main.get_by_role("button", name="Generate").click()
    page.get_by_text("Same queue, same server, same N:").wait_for(timeout=180_000)
    page.wait_for_selector(IDLE)

    assert page.get_by_text("finished · 11 of 11 done").count() == 1
    texts = page.get_by_test_id("stText").all_inner_texts()
    assert len(texts) == 11 and all(text.strip() and "▌" not in text for text in texts)
    assert page.get_by_test_id("stAlertContentError").count() == 0
    # the server's view, continuous and static: vLLM's own figures, none of them missing
    lines = page.get_by_text("Server telemetry (vLLM,").all_inner_texts()
    assert len(lines) == 2 and not any("not reported" in line for line in lines), lines
    assert all("requests running: peak" in line and "KV-cache use: peak" in line for line in lines)
