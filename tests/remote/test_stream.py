"""The one streaming client's own rules: the body it sends (vLLM's extensions only when asked), how an answer's end
reads as our engine's finish reason, and every failure one result with one line, from a thread's pool too.
Streams from real servers: tests/remote/test_remote.py (ours), tests/bench/peers/test_vllm_peer.py (vLLM's)."""

from __future__ import annotations

import pytest

from batching.engine.request import FinishReason
from batching.remote.endpoint import Endpoint
from batching.remote.stream import RemoteRequest, StreamResult, request_body
from batching.remote.stream_pool import StreamPool
from tests.helpers import free_port


def test_token_ids_go_as_a_list_and_vllms_fields_only_when_asked() -> None:
    plain = request_body(RemoteRequest((5, 6, 7), 4), "m")
    assert plain["prompt"] == [5, 6, 7] and plain["temperature"] == 0.0 and plain["stream"] is True
    assert "ignore_eos" not in plain and "return_token_ids" not in plain  # transformers serve refuses them (422)
    asked = request_body(RemoteRequest("Q: hi\nA:", 4, ignore_eos=True, token_ids=True), "m")
    assert asked["prompt"] == "Q: hi\nA:" and asked["ignore_eos"] is True and asked["return_token_ids"] is True


@pytest.mark.parametrize(
    ("finish", "stop", "error", "reason"),
    [
        ("stop", None, None, FinishReason.EOS),
        ("stop", "###", None, FinishReason.STOP),  # vLLM names the stop string (or token id) that ended it
        ("length", None, None, FinishReason.LENGTH),
        ("abort", None, None, FinishReason.CANCELLED),
        ("eos_token", None, None, FinishReason.EOS),  # a server's own word for the end of its answer
        (None, None, None, FinishReason.ERROR),
        ("length", None, "cannot connect", FinishReason.ERROR),
    ],
)
def test_an_answers_end_reads_as_our_engines_finish_reason(
    finish: str | None, stop: str | None, error: str | None, reason: FinishReason
) -> None:
    assert StreamResult(0.0, finish_reason=finish, stop_reason=stop, error=error).reason is reason


def test_a_pool_with_nothing_listening_ends_every_answer_once_with_one_line() -> None:
    endpoint = Endpoint(f"http://127.0.0.1:{free_port()}", connect_timeout_s=2)
    results: list[StreamResult] = []
    with StreamPool(endpoint, 2) as pool:
        for _ in range(3):
            pool.submit(request_body(RemoteRequest("Q: hi\nA:", 4), "m"), results.append)
    assert len(results) == 3
    assert all(r.reason is FinishReason.ERROR and r.chunks == [] for r in results)
    assert all((r.error or "").startswith("cannot connect to http://127.0.0.1") for r in results)
