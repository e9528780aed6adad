"""The page's remote server view, driven by AppTest: the page opens on it when a server is set; a bad URL, a port
with nothing on it, a whole run on our server where one prompt fails (a server-side refusal) while the others go on,
and comparisons that warm the server up first and alternate which mode runs first."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from batching.remote import WARM_UP_TOKENS
from tests.helpers import KEEP_EAGER, ROOT, free_port
from tests.serve.helpers import our_server, served
from utils.metrics.run import summarize
from utils.plain_text import escape_markdown

APP = str(ROOT / "streamlit_app.py")


@pytest.fixture
def remote_env(monkeypatch: pytest.MonkeyPatch, tiny_model_dirs: dict[str, Path]) -> pytest.MonkeyPatch:
    """The page on the tiny model (its own checks); with BATCHSCOPE_REMOTE__URL set, it opens on the remote view."""
    for name in [n for n in os.environ if n.startswith("BATCHSCOPE_") and n != KEEP_EAGER]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("BATCHSCOPE_MODEL__NAME_OR_PATH", str(tiny_model_dirs["llama"]))
    return monkeypatch


def _open() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    assert not at.exception, at.exception
    return at


def _add(at: AppTest, prompt: str, cap: int) -> None:
    at.text_input(key="new_prompt").set_value(prompt)
    at.text_input(key="new_cap").set_value(str(cap))
    next(b for b in at.button if b.label == "Add").click().run()


def _generate(at: AppTest) -> None:
    next(b for b in at.button if b.label == "Generate").click().run()
    assert not at.exception, at.exception


def test_a_bad_url_is_one_line_in_the_sidebar_and_generate_starts_nothing(remote_env: pytest.MonkeyPatch) -> None:
    remote_env.setenv("BATCHSCOPE_REMOTE__URL", "localhost:8000")
    at = _open()
    assert [e.value for e in at.sidebar.error] == [
        escape_markdown("'localhost:8000' is not a server address: type http://host:port or https://host[:port]")
    ]
    _add(at, "How do I track my order?", 4)
    _generate(at)
    assert "remote_run" not in at.session_state
    assert "is not a server address" in at.main.error[0].value


def test_a_port_with_no_server_is_said_once_and_the_built_in_engine_is_one_click_away(
    remote_env: pytest.MonkeyPatch,
) -> None:
    remote_env.setenv("BATCHSCOPE_REMOTE__URL", f"http://127.0.0.1:{free_port()}")
    at = _open()
    assert len(at.sidebar.error) == 1
    assert escape_markdown("cannot connect to http://127.0.0.1") in at.sidebar.error[0].value
    at.switch_page("app/race/page.py").run()  # the race, in the navigation
    assert not at.exception, at.exception
    assert not at.sidebar.error and at.text_input(key="new_prompt") is not None
    assert at.slider(key="slow_motion") is not None  # the race's own control: the built-in engine is shown


def test_a_remote_run_shows_every_answer_and_one_message_for_the_prompt_the_server_refused(
    remote_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # the server (the same tiny model) takes shorter prompts than the page: the long one is refused there (HTTP 400)
    with our_server(tmp_path, {"BATCHSCOPE_TOKENIZER__MAX_PROMPT_TOKENS": "200"}) as (url, _):
        remote_env.setenv("BATCHSCOPE_REMOTE__URL", url)
        at = _open()
        assert any(c.value.startswith("Watching model **") for c in at.sidebar.caption)  # the name /v1/models gave
        _add(at, "How do I track my order?", 6)
        _add(at, "Tell me everything about returns. " * 20, 6)
        _add(at, "Do you ship abroad?", 6)
        _generate(at)
    run = at.session_state.remote_run.run
    assert run.done and [view.status for view in run.views] == ["done", "done", "done"]
    failed = [view for view in run.views if view.finished.error]
    assert len(failed) == 1 and failed[0].number == 2
    messages = [e.value for e in at.main.error]
    assert len(messages) == 1 and messages[0].startswith("continuous: 1 of 3 requests failed:")
    assert "answered HTTP 400" in messages[0]
    assert [view.finished.output_tokens for view in run.views if view.number != 2] == [6, 6]
    assert not any(s.value.startswith("Same queue") for s in at.subheader)  # no comparison after a failure
    assert "The comparison is switched off" not in str([i.value for i in at.info])
    assert [b.label for b in at.get("download_button")] == [
        "Requests (CSV)",
        "Client samples (CSV)",
        "Server telemetry (CSV)",
        "Everything (JSON)",
    ]


def _order_line(at: AppTest) -> str:
    return next(c.value for c in at.main.caption if c.value.startswith("Warm-up: one short request ("))


def test_each_comparison_warms_the_server_up_once_untimed_and_the_next_one_runs_the_other_mode_first(
    remote_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with our_server(tmp_path) as (url, _):
        remote_env.setenv("BATCHSCOPE_REMOTE__URL", url)
        at = _open()
        for prompt in ("How do I track my order?", "Do you ship abroad?", "Can I pay by bank transfer?"):
            _add(at, prompt, 5)
        for first, second in [("continuous", "static"), ("static", "continuous"), ("continuous", "static")]:
            before = served(url)
            _generate(at)
            after = served(url)
            kept = at.session_state.remote_run
            live, other = kept.live, kept.second
            assert (live.setup.mode, other.setup.mode) == (first, second)
            assert kept.setup["order"] == [first, second]
            assert f"This time {first} ran first (live)." in _order_line(at)
            assert live.record.start < min(e.admitted for e in other.record.finished)  # it really ran second
            summaries = [summarize(run.record) for run in (live, other)]
            assert [s.requests for s in summaries] == [3, 3]
            assert after[0] - before[0] == 1 + 6  # the server answered one request more than the figures count
            warm_up_tokens = after[1] - before[1] - sum(s.output_tokens for s in summaries)
            assert 1 <= warm_up_tokens <= WARM_UP_TOKENS
            assert not at.main.error
    comparisons, shown = at.session_state.remote_comparisons, at.session_state.remote_run
    _generate(at)  # the server is gone: the warm-up fails, nothing new starts, the last comparison stays
    errors = [e.value for e in at.main.error]
    assert len(errors) == 1
    assert errors[0].startswith(escape_markdown("the warm-up request failed, so nothing was run: cannot connect"))
    assert at.session_state.remote_run is shown and at.session_state.remote_comparisons == comparisons


def test_a_warm_up_that_fails_is_one_line_and_generate_starts_nothing(remote_env: pytest.MonkeyPatch) -> None:
    remote_env.setenv("BATCHSCOPE_REMOTE__URL", f"http://127.0.0.1:{free_port()}")
    remote_env.setenv("BATCHSCOPE_REMOTE__MODEL", "builtin")  # typed: the sidebar asks the server nothing
    at = _open()
    assert not at.sidebar.error
    _add(at, "How do I track my order?", 4)
    _generate(at)
    assert [e.value for e in at.main.error] == [
        escape_markdown(
            f"the warm-up request failed, so nothing was run: cannot connect to {at.session_state.remote_url} "
            "(connection refused or host unknown): is the server running on that port?"
        )
    ]
    assert "remote_run" not in at.session_state and "remote_comparisons" not in at.session_state


HOSTILE = "![pwned](http://evil.example/x.png) [click here](http://evil.example) **urgent**"


@contextlib.contextmanager
def hostile_server() -> Iterator[str]:
    """A real HTTP server that answers every request with an error whose message is Markdown: an image, a link."""

    class Refuse(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"error": {"message": HOSTILE}}).encode()
            self.send_response(500)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_servers_error_text_is_shown_as_text_never_as_markdown(remote_env: pytest.MonkeyPatch) -> None:
    with hostile_server() as url:
        remote_env.setenv("BATCHSCOPE_REMOTE__URL", url)
        at = _open()
        said = f"{url}/v1/models answered HTTP 500: {HOSTILE}"
        assert [e.value for e in at.sidebar.error] == [escape_markdown(said)]
        _add(at, "How do I track my order?", 4)
        _generate(at)
        assert [e.value for e in at.main.error] == [escape_markdown(said)]
