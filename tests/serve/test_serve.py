"""The OpenAI-compatible API, as its users drive it: a real server (`python -m batching.serve`) on a free port,
the real `openai` client, raw HTTP for what a client library would not send, and Prometheus' own parser.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import time
import urllib.request
from collections.abc import Iterator

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from batching.bench.workloads import load_workload
from batching.remote.telemetry import parse_metrics
from config.settings import ModelSettings
from model.loader import load_model
from model.prompting import format_prompt
from tests.engine.helpers import reference
from tests.serve.helpers import openai_client, our_server, post_json, post_large

MODEL = "builtin"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with our_server(tmp_path_factory.mktemp("serve")) as (url, _):
        yield url


@pytest.fixture(scope="module")
def guarded_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One slot, at most two requests for everyone, and an API key."""
    env = {
        "BATCHSCOPE_SERVER__API_KEY": "sesame",
        "BATCHSCOPE_BATCHING__MAX_BATCH_SIZE": "1",
        "BATCHSCOPE_LIMITS__MAX_QUEUE_TOTAL": "2",
    }
    with our_server(tmp_path_factory.mktemp("serve-guarded"), env) as (url, _):
        yield url


@pytest.fixture(scope="module")
def tight_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """KV memory for 128 positions in 4-position blocks: four requests of ~75 positions at once must preempt."""
    env = {"BATCHSCOPE_BATCHING__KV_CACHE_TOKENS": "128", "BATCHSCOPE_BATCHING__BLOCK_SIZE": "4"}
    with our_server(tmp_path_factory.mktemp("serve-tight"), env) as (url, _):
        yield url


@pytest.fixture(scope="module")
def builtin():
    return load_model(ModelSettings(name_or_path=MODEL, device="cpu", dtype="float32"))


def _metrics_text(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as answer:
        return answer.read().decode()


def _metrics(url: str) -> dict[str, float]:
    values = {}
    for family in text_string_to_metric_families(_metrics_text(url)):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            values[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return values


QUESTIONS = [request.prompt for request in load_workload("customer-support").requests]


def test_models_and_health_name_the_served_model(server: str) -> None:
    assert openai_client(server).models.list().data[0].id == MODEL
    with urllib.request.urlopen(server + "/health", timeout=5) as answer:
        assert json.loads(answer.read()) == {"status": "ok"}


def test_a_completion_is_what_generate_gives_for_the_prompt_alone(server: str, builtin) -> None:
    prompt = format_prompt(QUESTIONS[0])
    answer = openai_client(server).completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
    ids = builtin.tokenizer(prompt)["input_ids"]
    expected = reference(builtin.model, ids, 24)
    assert answer.choices[0].text == builtin.tokenizer.decode(expected, skip_special_tokens=True)
    assert answer.usage.prompt_tokens == len(ids) and answer.usage.completion_tokens == len(expected)
    assert answer.choices[0].finish_reason == ("length" if len(expected) == 24 else "stop")
    timings = answer.model_extra["timings"]
    assert timings["ttft_ms"] > 0 and timings["e2e_ms"] >= timings["ttft_ms"]


def test_chat_uses_the_models_chat_template_streaming_or_not(server: str, builtin) -> None:
    client = openai_client(server)
    messages = [{"role": "user", "content": QUESTIONS[1]}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40, temperature=0)
    ids = builtin.tokenizer(format_prompt(QUESTIONS[1]))["input_ids"]
    expected = builtin.tokenizer.decode(reference(builtin.model, ids, 40), skip_special_tokens=True)
    assert whole.choices[0].message.content == expected
    assert whole.usage.prompt_tokens == len(ids)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=40,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason


def test_thirty_two_concurrent_streams_each_equal_their_prompt_run_alone(server: str, builtin) -> None:
    prompts = [format_prompt(QUESTIONS[i % len(QUESTIONS)]) + " " * (i // len(QUESTIONS)) for i in range(32)]
    caps = [8 + (i * 7) % 41 for i in range(32)]
    client = openai.AsyncOpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=120)

    async def one(prompt: str, cap: int) -> str:
        stream = await client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=cap, temperature=0, stream=True, extra_body={"ignore_eos": True}
        )
        return "".join([chunk.choices[0].text async for chunk in stream if chunk.choices])

    async def everyone() -> list[str]:
        return await asyncio.gather(*(one(p, c) for p, c in zip(prompts, caps, strict=True)))

    texts = asyncio.run(everyone())
    for prompt, cap, text in zip(prompts, caps, texts, strict=True):
        expected = reference(builtin.model, builtin.tokenizer(prompt)["input_ids"], cap, ignore_eos=True)
        assert text == builtin.tokenizer.decode(expected, skip_special_tokens=True)


def test_a_client_that_disconnects_mid_stream_frees_its_slot(server: str) -> None:
    before = _metrics(server).get("batchscope:request_success_total{finished_reason=abort}", 0.0)
    host, port = server.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    body = {"model": MODEL, "prompt": "Q: Hello\nA:", "max_tokens": 900, "stream": True, "ignore_eos": True}
    connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: ")  # tokens are flowing
    assert _metrics(server)["batchscope:num_requests_running"] == 1
    connection.close()
    # The gauge is read from the engine, the counter moves when the API's router thread takes the finished event:
    # they settle a moment apart, so wait for both.
    aborted = "batchscope:request_success_total{finished_reason=abort}"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        figures = _metrics(server)
        if figures["batchscope:num_requests_running"] == 0 and figures.get(aborted, 0.0) == before + 1:
            break
        time.sleep(0.1)
    assert figures["batchscope:num_requests_running"] == 0
    assert figures.get(aborted, 0.0) == before + 1, figures


def test_clients_that_hang_up_on_whole_answers_have_their_requests_aborted(server: str) -> None:
    """Eight non-streaming requests of 1,000 tokens whose clients close the connection once all eight run: each
    is cancelled (counted `abort`, not `length`) and every slot is free again."""
    before = _metrics(server)
    host, port = server.removeprefix("http://").split(":")
    body = json.dumps({"model": MODEL, "prompt": "Q: Hello\nA:", "max_tokens": 1000, "ignore_eos": True})
    connections = []
    for _ in range(8):
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        connections.append(connection)
    deadline = time.monotonic() + 30
    while _metrics(server)["batchscope:num_requests_running"] < 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _metrics(server)["batchscope:num_requests_running"] == 8
    for connection in connections:
        connection.close()
    aborted, length = (f"batchscope:request_success_total{{finished_reason={r}}}" for r in ("abort", "length"))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        figures = _metrics(server)
        if (
            figures.get(aborted, 0.0) - before.get(aborted, 0.0) >= 8
            and figures["batchscope:num_requests_running"] == 0
        ):
            break
        time.sleep(0.05)
    assert figures.get(aborted, 0.0) - before.get(aborted, 0.0) == 8
    assert figures.get(length, 0.0) == before.get(length, 0.0)
    assert figures["batchscope:num_requests_running"] == 0


@pytest.mark.parametrize(
    ("path", "body", "param", "message"),
    [
        ("/v1/completions", b'{"prompt": "hi", "max_tokens": ', None, "not valid JSON"),
        ("/v1/completions", {"model": "gpt-9", "prompt": "hi"}, "model", "is not served here"),
        ("/v1/completions", {"prompt": "hi", "temperature": -1}, "temperature", "greater than or equal to 0"),
        ("/v1/completions", {"prompt": "hi", "top_p": 0}, "top_p", "greater than 0"),
        ("/v1/completions", {"prompt": "hi", "n": 2}, "n", "n=2 is not supported"),
        ("/v1/completions", {"prompt": ["a", "b"]}, "prompt", "at most 1 item"),
        ("/v1/completions", {"prompt": "  "}, "prompt", "should match pattern"),
        ("/v1/completions", {"prompt": [5, 99999]}, "prompt.1", "less than 3027"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 999999}, "max_tokens", "less than or equal to 1023"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": "9"}, "max_tokens", "valid integer"),
        ("/v1/completions", {"prompt": "hi", "stream": 1}, "stream", "valid boolean"),
        ("/v1/completions", {"prompt": "hello " * 2000}, "prompt", "allowed: shorten it"),
        ("/v1/completions", {"prompt": "hi", "stop": [""]}, "stop.0", "at least 1 character"),
        ("/v1/completions", {"prompt": "hi", "stop": ["x"] * 10_000}, "stop", "at most 64 items"),
        ("/v1/completions", {"prompt": "hi", "stop": "x" * 513}, "stop", "at most 512 characters"),
        ("/v1/completions", {"prompt": "hi", "stop": ["a", "x" * 513]}, "stop.1", "at most 512 characters"),
        ("/v1/completions", {"prompt": "hi", "temperature": float("nan")}, "temperature", "a finite number"),
        ("/v1/completions", {"prompt": "\ud83d"}, "prompt", "unicode string"),
        ("/v1/completions", {"prompt": "hi", "stop": ["\udc00"]}, "stop.0", "unicode string"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\ud83d"}]}, "messages.0.content", "lone"),
        ("/v1/completions", {"prompt": "hi", "seed": 2**64}, "seed", "less than or equal to 9223372036854775807"),
        ("/v1/completions", {"max_tokens": 3}, "prompt", "Field required"),
        ("/v1/chat/completions", {"messages": []}, "messages", "at least 1 item"),
        ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role", "Input"),
        ("/v1/nothing-here", {}, None, "Not Found"),
    ],
)
def test_bad_input_gets_an_openai_style_400_naming_the_field(server: str, path, body, param, message) -> None:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, answer = post_json(server, path, raw)
    assert status == (404 if path == "/v1/nothing-here" else 400)
    error = answer["error"]
    assert message in error["message"] and error["param"] == param
    assert "Traceback" not in error["message"] and "\n" not in error["message"]


def test_a_lone_surrogate_is_a_400_and_the_keep_alive_connection_serves_the_next_request(server: str) -> None:
    host, port = server.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    headers = {"Content-Type": "application/json"}
    bodies = [
        {"messages": [{"role": "user", "content": "\ud83d"}], "max_tokens": 2},
        {"messages": [{"role": "user", "content": "Hi \U0001f600"}], "max_tokens": 2},
    ]
    answers, sockets = [], []
    for body in bodies:  # json.dumps writes the lone surrogate as the escape "\ud83d", as a client would
        connection.request("POST", "/v1/chat/completions", json.dumps(body), headers)
        response = connection.getresponse()
        answers.append((response.status, json.loads(response.read())))
        sockets.append(connection.sock)
    connection.close()
    assert sockets[0] is not None and sockets[1] is sockets[0]  # one connection: not closed and opened again
    assert answers[0][0] == 400 and "lone surrogate" in answers[0][1]["error"]["message"]
    assert answers[1][0] == 200 and answers[1][1]["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_over_the_limit_is_a_413_before_it_is_read(server: str, chunked: bool) -> None:
    """5 MB of prompt: refused by its Content-Length before a byte of it is read, or once the chunks sent pass the
    limit; the server answers the next request as before."""
    body = json.dumps({"model": MODEL, "prompt": "hello " * 850_000, "max_tokens": 4}).encode()
    status, answer = post_large(server, body, chunked)
    error = answer["error"]
    assert status == 413 and error["code"] == 413
    assert "larger than this server takes (2,000,000 bytes)" in error["message"]
    assert openai_client(server).completions.create(model=MODEL, prompt="Q: Hi\nA:", max_tokens=2).choices


def test_metrics_parse_and_their_counters_match_the_requests_sent(server: str) -> None:
    before = _metrics(server)
    client = openai_client(server)
    answers = [
        client.completions.create(model=MODEL, prompt=format_prompt(q), max_tokens=12, temperature=0)
        for q in QUESTIONS[:3]
    ]
    after = _metrics(server)

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert delta("batchscope:prompt_tokens_total") == sum(a.usage.prompt_tokens for a in answers)
    assert delta("batchscope:generation_tokens_total") == sum(a.usage.completion_tokens for a in answers)
    finished = sum(delta(f"batchscope:request_success_total{{finished_reason={r}}}") for r in ("stop", "length"))
    assert finished == 3
    assert delta("batchscope:time_to_first_token_seconds_count") == 3
    assert delta("batchscope:e2e_request_latency_seconds_count") == 3
    assert delta("batchscope:iteration_tokens_total_count") > 0
    assert after["batchscope:num_requests_running"] == 0 and after["batchscope:kv_cache_usage_perc"] == 0


def test_kv_metrics_show_blocks_in_use_mid_stream_then_preemptions_and_prefix_hits(tight_server: str) -> None:
    client = openai_client(tight_server)
    stream = client.completions.create(
        model=MODEL, prompt=format_prompt(QUESTIONS[0]), max_tokens=40, temperature=0, stream=True
    )
    next(iter(stream))  # a token is out: the request holds its blocks
    during = _metrics(tight_server)
    for _ in stream:
        pass
    assert 0 < during["batchscope:kv_cache_usage_perc"] <= 1
    async_client = openai.AsyncOpenAI(base_url=tight_server + "/v1", api_key="unused", max_retries=0, timeout=120)

    async def one(question: str) -> None:
        await async_client.completions.create(
            model=MODEL, prompt=format_prompt(question), max_tokens=40, temperature=0, extra_body={"ignore_eos": True}
        )

    async def four() -> None:
        await asyncio.gather(*(one(q) for q in QUESTIONS[1:5]))

    asyncio.run(four())
    after = _metrics(tight_server)
    assert after["batchscope:num_preemptions_total"] > 0
    queries, hits = after["batchscope:prefix_cache_queries_total"], after["batchscope:prefix_cache_hits_total"]
    assert 0 < hits < queries  # the shared system prompt's blocks, found again; the questions' own are new
    assert after["batchscope:kv_cache_usage_perc"] == 0  # nothing running: cached blocks count as free
    assert parse_metrics(_metrics_text(tight_server)).preemptions == after["batchscope:num_preemptions_total"]


def test_an_api_key_is_required_when_set(guarded_server: str) -> None:
    with pytest.raises(openai.AuthenticationError) as caught:
        openai_client(guarded_server, key="wrong").models.list()
    assert "API key" in caught.value.body["message"]
    assert openai_client(guarded_server, key="sesame").models.list().data[0].id == MODEL


def test_a_full_queue_answers_429_and_the_others_go_on(guarded_server: str) -> None:
    client = openai.AsyncOpenAI(base_url=guarded_server + "/v1", api_key="sesame", max_retries=0, timeout=60)

    async def one() -> str:
        try:
            answer = await client.completions.create(
                model=MODEL, prompt="Q: Hi\nA:", max_tokens=40, temperature=0, extra_body={"ignore_eos": True}
            )
        except openai.RateLimitError as error:
            assert "max_queue_total=2" in error.body["message"]
            return "429"
        return answer.choices[0].finish_reason

    async def burst() -> list[str]:
        return await asyncio.gather(*(one() for _ in range(5)))

    outcomes = asyncio.run(burst())
    assert outcomes.count("length") >= 2 and "429" in outcomes
    assert set(outcomes) <= {"length", "429"}


def test_a_hybrid_model_served_answers_concurrent_requests_as_generate_does(
    tmp_path_factory: pytest.TempPathFactory, family_model_dirs
) -> None:
    """Bamba (Mamba-2 layers beside attention) behind the API: six requests at once share three slots, each through
    its own SSM state, and every answer is `generate`'s; /metrics counts no prefix lookups (prefix caching is off)."""
    from tests.engine.helpers import loaded

    hybrid = loaded(str(family_model_dirs["bamba"]))
    prompts = [[5 + i, 40 + 3 * i, 77, 9 + i] * (1 + i % 3) for i in range(6)]
    caps = [12, 3, 20, 7, 15, 5]
    env = {"BATCHSCOPE_MODEL__NAME_OR_PATH": str(family_model_dirs["bamba"])}
    env["BATCHSCOPE_BATCHING__MAX_BATCH_SIZE"] = "3"
    with our_server(tmp_path_factory.mktemp("serve-hybrid"), env) as (url, _):
        name = openai_client(url).models.list().data[0].id

        async def ask_all() -> list[str]:
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)

            async def ask(prompt: list[int], cap: int) -> str:
                body = {"ignore_eos": True}
                answer = await client.completions.create(
                    model=name, prompt=prompt, max_tokens=cap, temperature=0, extra_body=body
                )
                return answer.choices[0].text

            return await asyncio.gather(*(ask(p, c) for p, c in zip(prompts, caps, strict=True)))

        texts = asyncio.run(ask_all())
        metrics = _metrics(url)
    for prompt, cap, text in zip(prompts, caps, texts, strict=True):
        expected = reference(hybrid.model, prompt, cap, ignore_eos=True)
        assert text == hybrid.tokenizer.decode(expected, skip_special_tokens=True)
    assert metrics["batchscope:prefix_cache_queries_total"] == 0
    assert metrics["batchscope:generation_tokens_total"] == sum(caps)
