"""Remote runs against two real servers on this machine: ours (`python -m batching.serve`) and
`transformers serve --continuous-batching` on a tiny local model; and every failure a remote server can cause
(a wrong port, a wrong key, a server stopped mid-run, a bad URL) ending in its own message, nothing hanging."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from batching.bench.peers.serve_peer import Load, running_server, server_specs
from batching.engine.events import TokenEvent
from batching.engine.params import RequestParams
from batching.engine.request import FinishReason
from batching.remote import (
    WARM_UP_QUESTION,
    WARM_UP_TOKENS,
    Endpoint,
    RemoteError,
    RemoteRun,
    RunSetup,
    fetch_model,
    parse_url,
    warm_up,
)
from batching.remote.stream import RemoteRequest, request_body
from batching.runs import RunRecord
from model.prompting import format_prompt
from tests.helpers import free_port
from tests.serve.helpers import our_server, served
from utils import export
from utils.charts import run as run_charts
from utils.metrics.run import summarize

SYSTEM = "You are a friendly customer-support assistant for an online shop. Answer the customer's question."
QUESTIONS = [
    "How do I track my order?",
    "What is your return policy?",
    "Can I change my delivery address?",
    "Do you ship abroad?",
    "My parcel arrived damaged, what now?",
    "How long does a refund take?",
    "Can I pay by bank transfer?",
    "Where do I find my invoice?",
]
CAPS = [8, 48, 12, 40, 10, 32, 16, 24]
LANES = 4
RUN_TIMEOUT_S = 120


def run_queue(
    endpoint: Endpoint,
    model: str,
    mode: str,
    caps: list[int],
    lanes: int = LANES,
    questions: Sequence[str] = QUESTIONS,
    **kwargs: object,
) -> RemoteRun:
    """Submit one question per cap (the embedded model's Q/A format), close the run and wait for it to end."""
    run = RemoteRun(RunSetup(endpoint, model, lanes, mode), **kwargs)  # type: ignore[arg-type]
    for question, cap in zip(questions, caps, strict=False):
        run.submit(format_prompt(question, SYSTEM), RequestParams(cap))
    run.close()
    run.join(RUN_TIMEOUT_S)
    assert run.done, f"the {mode} run did not finish in {RUN_TIMEOUT_S} s"
    return run


def _in_flight_at_most(record: RunRecord) -> int:
    """The most requests the client had in flight at once (sent and not yet answered)."""
    moments = sorted([(e.admitted, 1) for e in record.finished] + [(e.finished, -1) for e in record.finished])
    most = current = 0
    for _, change in moments:
        current += change
        most = max(most, current)
    return most


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with our_server(tmp_path_factory.mktemp("remote-ours")) as (url, _):
        yield url


@pytest.fixture(scope="module")
def runs(ours: str) -> dict[str, RemoteRun]:
    """The queue run continuous, then static, against our server, its /metrics read every 50 ms."""
    endpoint = Endpoint(parse_url(ours + "/v1"))
    model = fetch_model(endpoint)
    return {mode: run_queue(endpoint, model, mode, CAPS, telemetry_every_s=0.05) for mode in ("continuous", "static")}


def test_the_model_name_comes_from_v1_models(ours: str) -> None:
    assert fetch_model(Endpoint(parse_url(ours))) == "builtin"


def test_the_warm_up_is_one_short_request_the_server_answers_before_the_run_and_no_figure_counts(ours: str) -> None:
    setup = RunSetup(Endpoint(ours), "builtin", LANES, "continuous")
    before = served(ours)
    warm = warm_up(setup, format_prompt(WARM_UP_QUESTION, SYSTEM))
    after_warm_up = served(ours)
    assert after_warm_up == (before[0] + 1, before[1] + warm.tokens)  # answered in full before the run exists
    assert 1 <= warm.tokens <= WARM_UP_TOKENS and warm.seconds > 0
    run = run_queue(setup.endpoint, setup.model, "continuous", CAPS[:5], telemetry_every_s=None)
    after_run = served(ours)
    summary = summarize(run.record)
    assert summary.requests == after_run[0] - after_warm_up[0] == 5
    assert summary.output_tokens == after_run[1] - after_warm_up[1]  # the run's tokens, not one of the warm-up's
    assert sorted(e.request_id for e in run.record.finished) == [f"continuous-{n}" for n in range(1, 6)]


def test_a_failed_warm_up_is_one_line_and_the_server_answered_nothing(ours: str) -> None:
    before = served(ours)
    with pytest.raises(RemoteError) as error:
        warm_up(RunSetup(Endpoint(ours), "nope", LANES), format_prompt(WARM_UP_QUESTION, SYSTEM))
    assert str(error.value).startswith("the warm-up request failed, so nothing was run: ")
    assert "model='nope' is not served here" in str(error.value) and "\n" not in str(error.value)
    assert served(ours) == before


@pytest.mark.parametrize("mode", ["continuous", "static"])
def test_a_remote_run_gets_every_answer_streamed_within_its_cap(runs: dict[str, RemoteRun], mode: str) -> None:
    record = runs[mode].record
    assert len(record.finished) == len(CAPS)
    by_id = {event.request_id: event for event in record.finished}
    for number, cap in enumerate(CAPS, start=1):
        event = by_id[f"{mode}-{number}"]
        assert event.error is None and event.reason in (FinishReason.EOS, FinishReason.LENGTH)
        assert 1 <= event.output_tokens <= cap and event.text.strip()
        streamed = "".join(t.text for t in record.tokens if t.request_id == event.request_id)
        assert streamed == event.text  # the answer is exactly what streamed in
        assert event.arrival <= event.admitted <= event.first_token <= event.finished  # type: ignore[operator]
        assert event.prompt_tokens > 0  # the server's usage chunk
    assert _in_flight_at_most(record) == LANES


def test_greedy_answers_are_the_same_in_both_modes(runs: dict[str, RemoteRun]) -> None:
    texts = {
        mode: sorted((e.request_id.split("-")[1], e.text) for e in run.record.finished) for mode, run in runs.items()
    }
    assert texts["continuous"] == texts["static"]


def test_continuous_refills_a_lane_at_once_and_static_waits_for_the_whole_wave(runs: dict[str, RemoteRun]) -> None:
    """Read from the order of the client's own events, whatever the server's speed: static sends its second wave
    only after the first wave's last answer; continuous sends into the lane #1 (cap 8) freed while the first wave's
    longest answers still stream. The sampled lane states never show a continuous lane held."""
    for mode, run in runs.items():
        by_number = {int(e.request_id.split("-")[1]): e for e in run.record.finished}
        first_wave_end = max(by_number[n].finished for n in range(1, LANES + 1))
        second_wave_start = min(by_number[n].admitted for n in range(LANES + 1, len(CAPS) + 1))  # type: ignore[type-var]
        if mode == "continuous":
            assert second_wave_start < first_wave_end  # type: ignore[operator]
        else:
            assert second_wave_start >= first_wave_end  # type: ignore[operator]
    assert not any(step.idle_held for step in runs["continuous"].record.steps)


def test_the_server_occupancy_is_polled_from_our_metrics(runs: dict[str, RemoteRun]) -> None:
    for run in runs.values():
        samples = run.telemetry()
        assert samples and {s.telemetry.engine for s in samples} == {"Batchscope"}
        assert max(s.telemetry.running or 0 for s in samples) >= 2
        assert all(s.telemetry.cache_usage is not None and s.telemetry.preemptions is not None for s in samples)
        assert run.poller is not None and not run.poller.slots_available  # no /slots on our server: not asked again


def test_remote_runs_feed_the_existing_charts_comparison_and_exports(runs: dict[str, RemoteRun]) -> None:
    records = {mode: run.record for mode, run in runs.items()}
    labels = {e.request_id: f"#{e.request_id.split('-')[1]}" for r in records.values() for e in r.finished}
    summaries = {mode: summarize(record) for mode, record in records.items()}
    assert summaries["continuous"].requests == summaries["static"].requests == len(CAPS)
    assert 0 < summaries["static"].mean_occupancy <= 1 and summaries["continuous"].output_tokens > 0
    table = export.comparison_frame(summaries)
    assert list(table.columns) == ["continuous", "static"]
    document = json.loads(export.to_json(records, labels, {}, {"engine": "remote"}))
    assert len(document["runs"]["static"]["requests"]) == len(CAPS) and document["speedup"] > 0
    # Occupancy is sampled every 0.1 s: a fast server may answer a whole wave between two samples.
    occupancy = run_charts.occupancy_frame(records["static"])
    assert set(occupancy["who"]) <= {run_charts.YOURS, run_charts.HELD}
    # The client samples what is in flight every 0.1 s: a short answer may start and end between two samples.
    timeline = run_charts.timeline_frame(records["continuous"], labels)
    assert len(timeline) > 0 and set(timeline["label"]) <= set(labels.values())


def test_a_wrong_port_fails_each_request_with_one_message_and_nothing_hangs() -> None:
    endpoint = Endpoint(f"http://127.0.0.1:{free_port()}", connect_timeout_s=2)
    with pytest.raises(RemoteError, match=r"cannot connect to http://127\.0\.0\.1"):
        fetch_model(endpoint)
    started = time.monotonic()
    run = run_queue(endpoint, "builtin", "continuous", [4, 4, 4], lanes=2)
    assert time.monotonic() - started < 30
    errors = {event.error for event in run.record.finished}
    assert len(run.record.finished) == 3 and len(errors) == 1
    assert errors.pop().startswith("cannot connect to http://127.0.0.1")
    assert {event.reason for event in run.record.finished} == {FinishReason.ERROR}


def test_a_wrong_key_is_refused_with_its_message_and_the_right_key_works(tmp_path: Path) -> None:
    with our_server(tmp_path, {"BATCHSCOPE_SERVER__API_KEY": "sesame"}) as (url, _):
        wrong = Endpoint(url, api_key="guess")
        with pytest.raises(RemoteError, match=r"refused the API key \(HTTP 401\)"):
            fetch_model(wrong)
        run = run_queue(wrong, "builtin", "static", [4, 4], telemetry_every_s=None)
        assert [e.reason for e in run.record.finished] == [FinishReason.ERROR] * 2
        assert all("refused the API key (HTTP 401)" in (e.error or "") for e in run.record.finished)
        right = run_queue(Endpoint(url, api_key="sesame"), "builtin", "static", [4], telemetry_every_s=None)
        assert right.record.finished[0].error is None and right.record.finished[0].output_tokens == 4


def test_a_server_stopped_mid_run_ends_each_answer_with_a_message_and_the_run_finishes(tmp_path: Path) -> None:
    with our_server(tmp_path) as (url, process):
        endpoint = Endpoint(url, connect_timeout_s=2, read_timeout_s=5)
        run = RemoteRun(RunSetup(endpoint, "builtin", 2, "continuous"))
        for question in QUESTIONS[:4]:
            run.submit(format_prompt(question, SYSTEM), RequestParams(200))
        deadline = time.monotonic() + 60
        while not any(isinstance(event, TokenEvent) for event in run.poll(0.05)):
            assert time.monotonic() < deadline, "no token arrived"
        os.killpg(process.pid, signal.SIGKILL)  # the server and its engine process, mid-answer
        run.close()
        run.join(30)
        assert run.done
    finished = run.record.finished
    assert len(finished) == 4
    errors = [e.error or "" for e in finished if e.reason is FinishReason.ERROR]
    assert any("closed the connection mid-answer" in error for error in errors), errors
    assert all(e.reason is not FinishReason.ERROR or e.error for e in finished)
    assert any(e.output_tokens > 0 for e in finished if e.reason is FinishReason.ERROR)


@pytest.mark.parametrize(
    ("typed", "message"),
    [
        ("localhost:8000", "is not a server address"),
        ("ftp://host/v1", "is not a server address"),
        ("http://", "is not a server address"),
        ("http://host:99999", "has a port that is not allowed"),
        ("http://host:8000/v1?x=1", "leave out the ?query"),
    ],
)
def test_a_bad_url_is_refused_in_one_line(typed: str, message: str) -> None:
    with pytest.raises(RemoteError, match=message.replace("?", r"\?")) as error:
        parse_url(typed)
    assert "\n" not in str(error.value)


def test_a_url_is_taken_with_or_without_its_api_path() -> None:
    for typed in ("http://gpu:8000", "http://gpu:8000/", "http://gpu:8000/v1", " http://gpu:8000/v1/completions "):
        assert parse_url(typed) == "http://gpu:8000"
    assert parse_url("https://llm.example.com/team-a/v1") == "https://llm.example.com/team-a"


def test_transformers_serve_runs_both_modes_with_every_answer_and_reports_no_telemetry(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    folder = str(tiny_model_dirs["llama"])
    load = Load(
        rates=(),
        requests=1,
        prompt_tokens=48,
        prompt_tokens_min=16,
        prompt_tokens_max=96,
        output_tokens=32,
        throughput=False,
    )
    (tmp_path / "hf-cache").mkdir()
    spec = server_specs(folder, LANES, 512, load, tmp_path / "hf-cache")["transformers"]
    with running_server(spec, folder, tmp_path) as url:
        endpoint = Endpoint(url)
        with pytest.raises(RemoteError, match="lists no model"):  # a forced local model is not listed
            fetch_model(endpoint)
        for mode in ("continuous", "static"):
            run = run_queue(endpoint, folder, mode, [6, 12, 4, 10, 8, 5], telemetry_every_s=0.05)
            finished = run.record.finished
            assert len(finished) == 6 and all(e.error is None and e.output_tokens >= 1 for e in finished)
            assert _in_flight_at_most(run.record) == LANES
            assert run.telemetry() == []  # no /metrics, no /slots: the page says "not reported"
            assert run.poller is not None and not run.poller.metrics_available and not run.poller.slots_available


def test_the_chat_api_sends_the_system_prompt_and_the_question_as_messages(ours: str) -> None:
    body = request_body(
        RemoteRequest("formatted", 5, question="Do you ship abroad?", system_prompt=SYSTEM), "m", "chat"
    )
    assert body["messages"] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Do you ship abroad?"},
    ]
    assert "prompt" not in body and body["stream_options"] == {"include_usage": True}
    run = RemoteRun(RunSetup(Endpoint(ours), "builtin", 2, "continuous", "chat", SYSTEM), telemetry_every_s=None)
    for question in QUESTIONS[:3]:
        run.submit(question, RequestParams(6))
    run.close()
    run.join(RUN_TIMEOUT_S)
    finished = run.record.finished
    assert len(finished) == 3 and all(e.error is None and 1 <= e.output_tokens <= 6 and e.text for e in finished)
