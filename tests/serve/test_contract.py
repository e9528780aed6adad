"""The OpenAI contract, checked against a real server (`python -m batching.serve`) with the real `openai` client, as
OpenAI's API reference and vLLM's server behave: stop strings left out of the text and the stream, a fresh seed
when none is given, sampling when `temperature` is left out, a 400 naming every field this server cannot honour,
a bad seed refused before the engine sees it, and a fault an HTTP error (a stream: an error event, then the end).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import psutil
import pytest

from batching.bench.workloads import load_workload
from batching.engine.params import MAX_SEED
from batching.serve.schemas import SamplingDefaults
from batching.serve.server import sampling_defaults, start_background
from batching.service import EngineClient, EngineConfig
from config.settings import ModelSettings, load_settings
from model.loader import load_model
from model.prompting import format_prompt
from tests.engine.helpers import reference
from tests.helpers import free_port
from tests.serve.helpers import async_openai_client, openai_client, our_server, post_json, served, sse_events
from tests.service.helpers import FAILING_SEED, fail_sampling_with_seed_666

MODEL = "builtin"
QUESTIONS = [request.prompt for request in load_workload("customer-support").requests]
PROMPT = format_prompt(QUESTIONS[0])
# Without the system prompt it was trained on, the embedded model is unsure: sampled answers part at once
UNSURE = "Q: How do I reset my password?\nA:"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    with our_server(tmp_path_factory.mktemp("contract")) as (url, process):
        yield url, process.pid


@pytest.fixture(scope="module")
def url(server: tuple[str, int]) -> str:
    return server[0]


@pytest.fixture(scope="module")
def builtin():
    return load_model(ModelSettings(name_or_path=MODEL, device="cpu", dtype="float32"))


def _greedy(builtin, prompt: str, cap: int, ignore_eos: bool = True) -> str:
    """`generate`'s answer to `prompt` alone, as the API's text."""
    ids = builtin.tokenizer(prompt)["input_ids"]
    return builtin.tokenizer.decode(reference(builtin.model, ids, cap, ignore_eos=ignore_eos), skip_special_tokens=True)


def _stop_inside(answer: str) -> str:
    """A stop string from the middle of `answer` whose first occurrence is there (it spans a token boundary)."""
    for start in range(len(answer) // 2, len(answer) - 6):
        stop = answer[start : start + 6]
        if answer.find(stop) == start and stop.strip():
            return stop
    raise AssertionError(f"no stop string to pick in {answer!r}")


def test_a_stop_string_and_all_after_it_are_left_out_of_the_text_and_the_stream(url: str, builtin) -> None:
    client = openai_client(url)
    answer = _greedy(builtin, PROMPT, 40)
    stop = _stop_inside(answer)
    expected = answer[: answer.find(stop)]
    fields = {"model": MODEL, "prompt": PROMPT, "max_tokens": 40, "temperature": 0, "extra_body": {"ignore_eos": True}}
    whole = client.completions.create(**fields, stop=[stop, "never in it"])
    assert whole.choices[0].text == expected and whole.choices[0].finish_reason == "stop"
    chunks = [chunk for chunk in client.completions.create(**fields, stop=stop, stream=True) if chunk.choices]
    assert "".join(chunk.choices[0].text for chunk in chunks) == expected
    assert [chunk.choices[0].finish_reason for chunk in chunks][-1] == "stop"
    # A tail that begins a stop string is held back, then sent once the text goes another way
    almost = stop[:3] + "\x07never"
    streamed = client.completions.create(**fields, stop=almost, stream=True)
    assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == answer


def test_a_chat_answer_and_its_stream_end_before_the_stop_string(url: str, builtin) -> None:
    client = openai_client(url)
    messages = [{"role": "user", "content": QUESTIONS[1]}]
    answer = _greedy(builtin, format_prompt(QUESTIONS[1]), 40)
    stop = _stop_inside(answer)
    fields = {"model": MODEL, "messages": messages, "max_tokens": 40, "temperature": 0, "stop": stop}
    fields["extra_body"] = {"ignore_eos": True}
    whole = client.chat.completions.create(**fields)
    assert whole.choices[0].message.content == answer[: answer.find(stop)]
    stream = client.chat.completions.create(**fields, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == answer[: answer.find(stop)]


def _sampled(url: str, **fields) -> str:
    extra = {"ignore_eos": True} | ({"top_k": fields.pop("top_k")} if "top_k" in fields else {})  # vLLM's fields
    answer = openai_client(url).completions.create(
        model=MODEL, prompt=UNSURE, max_tokens=24, extra_body=extra, **fields
    )
    return answer.choices[0].text


def test_requests_without_a_seed_each_draw_a_fresh_one_and_a_given_seed_repeats(url: str) -> None:
    assert len({_sampled(url, temperature=1.0) for _ in range(4)}) > 1
    assert _sampled(url, temperature=1.0, seed=7) == _sampled(url, temperature=1.0, seed=7)


def test_a_request_without_temperature_samples_at_the_models_default_never_silently_greedy(url: str) -> None:
    """The embedded model's generation_config.json sets no temperature, so a request without one samples at
    OpenAI's default of 1, as vLLM's server does: `seed`, `top_p` or `top_k` alone are sampled draws."""
    greedy = _sampled(url, temperature=0)
    alone = [_sampled(url, seed=seed) for seed in (1, 2, 3, 4)]
    assert len(set(alone)) > 1 and any(text != greedy for text in alone)
    assert alone[0] == _sampled(url, seed=1, temperature=1.0)
    assert _sampled(url, top_p=0.95, seed=5) == _sampled(url, top_p=0.95, seed=5, temperature=1.0)
    assert _sampled(url, top_k=40, seed=6) == _sampled(url, top_k=40, seed=6, temperature=1.0)


def test_absent_sampling_fields_take_the_models_generation_config_else_openais_defaults(tmp_path: Path) -> None:
    assert sampling_defaults(ModelSettings(name_or_path=MODEL)) == SamplingDefaults()
    (tmp_path / "config.json").write_text("{}")
    config = {"temperature": 0.6, "top_k": 20, "top_p": 0.9, "do_sample": False}  # do_sample is not read (vLLM)
    (tmp_path / "generation_config.json").write_text(json.dumps(config))
    assert sampling_defaults(ModelSettings(name_or_path=str(tmp_path))) == SamplingDefaults(0.6, 0.9, 20, 1.0)


@pytest.mark.parametrize(
    ("path", "field", "value"),
    [
        ("/v1/chat/completions", "tools", [{"type": "function", "function": {"name": "f"}}]),
        ("/v1/chat/completions", "tool_choice", "auto"),
        ("/v1/chat/completions", "response_format", {"type": "json_object"}),
        ("/v1/completions", "logit_bias", {"50": 100}),
        ("/v1/completions", "min_p", 0.1),
        ("/v1/completions", "stop_token_ids", [5]),
        ("/v1/completions", "logprobs", 2),
        ("/v1/chat/completions", "logprobs", True),
        ("/v1/chat/completions", "top_logprobs", 2),
        ("/v1/completions", "presence_penalty", 0.5),
        ("/v1/completions", "n", 2),
        ("/v1/completions", "best_of", 3),
        ("/v1/completions", "echo", True),
        ("/v1/completions", "suffix", "!"),
        ("/v1/chat/completions", "functions", [{"name": "f"}]),
        ("/v1/completions", "guided_json", {"type": "object"}),
        ("/v1/completions", "frobnicate", 1),
    ],
)
def test_a_field_this_server_cannot_honour_is_a_400_naming_it(url: str, path: str, field: str, value) -> None:
    base = {"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "Q: hi\nA:"}
    status, answer = post_json(url, path, {**base, "max_tokens": 2, field: value})
    assert status == 400, answer
    assert answer["error"]["param"] == field and field in answer["error"]["message"]


def test_unknown_fields_inside_the_body_are_named_too(url: str) -> None:
    status, answer = post_json(url, "/v1/completions", {"prompt": "hi", "stream_options": {"include_obfuscation": 1}})
    assert status == 400 and answer["error"]["param"] == "stream_options.include_obfuscation"
    message = {"role": "assistant", "content": "x", "tool_calls": []}
    status, answer = post_json(url, "/v1/chat/completions", {"messages": [message]})
    assert status == 400 and answer["error"]["param"] == "messages.0.tool_calls"


def test_unsupported_fields_at_their_neutral_value_are_taken(url: str) -> None:
    neutral = {"n": 1, "best_of": 1, "logprobs": None, "echo": False, "presence_penalty": 0, "frequency_penalty": 0.0}
    neutral |= {"min_p": 0, "tools": None, "tool_choice": None, "response_format": None, "logit_bias": None}
    neutral |= {"stop_token_ids": None, "user": "someone", "suffix": None, "stop": None, "ignore_eos": None}
    status, answer = post_json(url, "/v1/completions", {"prompt": "Q: hi\nA:", "max_tokens": 2, **neutral})
    assert status == 200, answer
    status, answer = post_json(url, "/v1/completions", {"prompt": "Q: hi\nA:", "max_tokens": 2, "n": True})
    assert status == 400 and answer["error"]["param"] == "n"  # JSON's true is not 1


def test_a_seed_out_of_range_is_a_400_before_the_engine_and_the_requests_beside_it_answer(url: str, builtin) -> None:
    """Six greedy requests in flight beside one sampled request seeded 2**64 (which torch cannot take): the bad
    one is refused with a 400 naming `seed`, every other one gets its whole answer."""
    client = async_openai_client(url)
    prompts = [format_prompt(question) for question in QUESTIONS[:6]]

    async def greedy(prompt: str) -> str:
        answer = await client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=16, temperature=0, extra_body={"ignore_eos": True}
        )
        return answer.choices[0].text

    async def bad() -> openai.BadRequestError:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=1, seed=2**64)
        return caught.value

    async def together() -> list:
        return await asyncio.gather(*(greedy(prompt) for prompt in prompts), bad())

    *texts, refused = asyncio.run(together())
    assert refused.status_code == 400 and refused.body["param"] == "seed"
    assert texts == [_greedy(builtin, prompt, 16) for prompt in prompts]
    assert post_json(url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "seed": MAX_SEED + 1})[0] == 400
    assert post_json(url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "seed": MAX_SEED})[0] == 200


def test_a_stream_with_continuous_usage_carries_the_usage_so_far_in_every_chunk(url: str) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}  # guidellm sends both (vLLM's extension)
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "stream": True, "ignore_eos": True}
    status, events = sse_events(url, "/v1/completions", {**body, "stream_options": options})
    assert status == 200 and events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    counts = [chunk["usage"]["completion_tokens"] for chunk in chunks]
    assert counts == sorted(counts) and counts[-1] == 12 and chunks[-1]["choices"] == []


def _engine_of(server_pid: int) -> psutil.Process:
    (engine,) = psutil.Process(server_pid).children()
    return engine


def test_a_request_whose_engine_dies_is_a_503_a_stream_ends_with_an_error_event_and_the_next_is_answered(
    server: tuple[str, int], builtin
) -> None:
    """kill -9 of the engine process mid-answer: the waiting request is a 503 (never a 200 with empty text), the
    stream already under way gets an OpenAI-style error event and then [DONE]; the server starts a new engine by
    itself (/health is 200 again, no request asked) and the next request is answered token-exact. (Last in this
    module: it restarts the module's engine.)"""
    url, pid = server
    engine = _engine_of(pid)
    tokens_before = served(url)[1]
    body = {"prompt": PROMPT, "max_tokens": 900, "temperature": 0, "ignore_eos": True}
    request = urllib.request.Request(
        url + "/v1/completions", json.dumps({**body, "stream": True}).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as stream:
        assert stream.status == 200
        assert stream.readline().startswith(b"data: {")  # tokens are flowing

        async def whole() -> openai.APIStatusError:
            with pytest.raises(openai.APIStatusError) as caught:
                await async_openai_client(url).completions.create(
                    model=MODEL, prompt=PROMPT, max_tokens=900, temperature=0, extra_body={"ignore_eos": True}
                )
            return caught.value

        async def kill_then_wait() -> openai.APIStatusError:
            waiting = asyncio.create_task(whole())
            await asyncio.sleep(0.5)
            os.kill(engine.pid, signal.SIGKILL)
            return await waiting

        failed = asyncio.run(kill_then_wait())
        rest = stream.read().decode().split("\n\n")
    events = [line.strip().removeprefix("data: ") for line in rest if line.strip()]
    assert failed.status_code == 503 and failed.body["type"] == "server_error"
    assert json.loads(events[-2])["error"]["code"] == 503 and events[-1] == "[DONE]"
    assert all("error" not in json.loads(event) for event in events[:-2])
    assert failed.response.headers["retry-after"] == "1"
    streamed = 1 + len(events) - 2  # the chunk read before the kill, then those up to the error
    assert served(url)[1] - tokens_before >= streamed  # the tokens the dead engine generated are counted
    deadline = time.monotonic() + 60
    while not _listening(url) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _engine_of(pid).pid != engine.pid
    answer = openai_client(url).completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0)
    assert answer.choices[0].text == _greedy(builtin, PROMPT, 16, ignore_eos=False)
    with urllib.request.urlopen(url + "/metrics", timeout=10) as scraped:
        assert 'batchscope:engine_restarts_total{cause="exited"} 1.0' in scraped.read().decode()


def _listening(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def test_a_request_failing_inside_a_live_engine_is_a_500_and_the_others_answer(builtin) -> None:
    """A fault planted in the engine process fails requests seeded 666 inside a step: that request is a 500 (a
    stream's: an error event, then [DONE]), the greedy ones beside it are answered whole."""
    settings = load_settings()
    settings = settings.model_copy(update={"model": settings.model.model_copy(update={"device": "cpu"})})
    config = EngineConfig(settings.model, settings.tokenizer, settings.engine, initializer=fail_sampling_with_seed_666)
    service = EngineClient(config, settings.limits)
    port = free_port()
    background = start_background(service, settings, port)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while not _listening(url):
            assert time.monotonic() < deadline, "the API did not start in 30 s"
            time.sleep(0.2)
        client = async_openai_client(url)
        prompts = [format_prompt(question) for question in QUESTIONS[:4]]

        async def greedy(prompt: str) -> str:
            answer = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
            return answer.choices[0].text

        async def planted() -> openai.APIStatusError:
            with pytest.raises(openai.InternalServerError) as caught:
                await client.completions.create(
                    model=MODEL, prompt=PROMPT, max_tokens=12, temperature=1, seed=FAILING_SEED
                )
            return caught.value

        async def together() -> list:
            return await asyncio.gather(*(greedy(prompt) for prompt in prompts), planted())

        *texts, failed = asyncio.run(together())
        assert failed.status_code == 500 and "tokenizer exploded" in failed.body["message"]
        assert texts == [_greedy(builtin, prompt, 12, ignore_eos=False) for prompt in prompts]
        body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 1, "seed": FAILING_SEED, "stream": True}
        status, events = sse_events(url, "/v1/completions", body)
        assert status == 200 and events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["code"] == 500 and error["type"] == "server_error" and "tokenizer exploded" in error["message"]
    finally:
        background.stop()
        service.close()
