"""Our server behind the field's routers: real `vllm-router` and `sglang-router` processes in front of two real
`python -m batching.serve`, answering `generate`'s text through the router, and the fields those routers add to what
they forward taken at the values that cannot change the answer (any other value stays a 400 naming the field)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import pytest

from batching.bench.workloads import load_workload
from config.settings import ModelSettings
from model.loader import load_model
from model.prompting import format_prompt
from tests.engine.helpers import reference
from tests.serve.helpers import openai_client, post_json, served, two_eager_servers
from tests.serve.routers import ROUTERS, Router, running_router

MODEL = "builtin"
QUESTIONS = [request.prompt for request in load_workload("customer-support").requests]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    with two_eager_servers(tmp_path_factory.mktemp("fleet")) as urls:
        yield urls


@pytest.fixture(scope="module", params=sorted(ROUTERS))
def router(request: pytest.FixtureRequest, servers: tuple[str, str], tmp_path_factory) -> Iterator[Router]:
    with running_router(request.param, servers, tmp_path_factory.mktemp(request.param)) as running:
        yield running


@pytest.fixture(scope="module")
def builtin():
    return load_model(ModelSettings(name_or_path=MODEL, device="cpu", dtype="float32"))


def _expected(builtin, prompt: str, cap: int) -> str:
    ids = builtin.tokenizer(prompt)["input_ids"]
    return builtin.tokenizer.decode(reference(builtin.model, ids, cap), skip_special_tokens=True)


@pytest.mark.long
def test_completions_through_the_router_are_generates_answers_and_round_robin_uses_both_servers(
    router: Router, servers: tuple[str, str], builtin
) -> None:
    before = [served(url)[0] for url in servers]
    client = openai_client(router.url)
    for question in QUESTIONS[:3]:
        prompt = format_prompt(question)
        answer = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
        assert answer.choices[0].text == _expected(builtin, prompt, 24)
    prompt = format_prompt(QUESTIONS[3])
    stream = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert "".join(chunk.choices[0].text for chunk in chunks if chunk.choices) == _expected(builtin, prompt, 24)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    answered = [served(url)[0] - count for url, count in zip(servers, before, strict=True)]
    assert answered == [2, 2]  # four requests, one server then the other


def test_chat_through_the_router_streaming_or_not_is_generates_answer(router: Router, builtin) -> None:
    client = openai_client(router.url)
    messages = [{"role": "user", "content": QUESTIONS[4]}]
    expected = _expected(builtin, format_prompt(QUESTIONS[4]), 32)
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=32, temperature=0)
    assert whole.choices[0].message.content == expected
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=32, temperature=0, stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices) == expected


# What each router added to every body it forwarded (captured from vllm-router 0.1.17 and sglang-router 0.3.2)
ADDED = {"no_stop_trim": False, "ignore_eos": False, "skip_special_tokens": True, "return_hidden_states": False}
ADDED_CHAT = {"logprobs": False, "continue_final_message": False, "separate_reasoning": True, "stream_reasoning": True}
ADDED_CHAT |= {"include_reasoning": True}


def test_the_fields_routers_add_are_taken_at_the_values_they_send(servers: tuple[str, str]) -> None:
    url = servers[0]
    status, answer = post_json(url, "/v1/completions", {"prompt": "Q: hi\nA:", "max_tokens": 2, "echo": False, **ADDED})
    assert status == 200, answer
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **ADDED, **ADDED_CHAT}
    status, answer = post_json(url, "/v1/chat/completions", chat)
    assert status == 200, answer
    off = {"separate_reasoning": False, "stream_reasoning": False, "include_reasoning": False}
    status, answer = post_json(url, "/v1/chat/completions", chat | off)  # no reasoning parser: nothing to switch
    assert status == 200, answer


@pytest.mark.parametrize(
    ("path", "field", "value"),
    [
        ("/v1/completions", "no_stop_trim", True),
        ("/v1/completions", "skip_special_tokens", False),
        ("/v1/completions", "return_hidden_states", True),
        ("/v1/chat/completions", "continue_final_message", True),
        ("/v1/completions", "no_stop_trim", 0),  # JSON's 0 is not false
        ("/v1/completions", "separate_reasoning", True),  # a chat field: unknown to completions
    ],
)
def test_a_router_field_at_a_value_that_would_change_the_answer_is_a_400_naming_it(
    servers: tuple[str, str], path: str, field: str, value: object
) -> None:
    base = {"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "Q: hi\nA:"}
    status, answer = post_json(servers[0], path, {**base, "max_tokens": 2, field: value})
    assert status == 400, answer
    assert answer["error"]["param"] == field and field in answer["error"]["message"]


def test_the_openapi_schema_states_each_router_field_and_the_value_it_takes(servers: tuple[str, str]) -> None:
    with urllib.request.urlopen(servers[0] + "/openapi.json", timeout=10) as answer:
        schemas = json.loads(answer.read())["components"]["schemas"]
    completion, chat = schemas["CompletionRequest"]["properties"], schemas["ChatCompletionRequest"]["properties"]
    for fields in (completion, chat):
        assert {"const": False, "type": "boolean"} in fields["no_stop_trim"]["anyOf"]
        assert {"const": True, "type": "boolean"} in fields["skip_special_tokens"]["anyOf"]
        assert {"const": False, "type": "boolean"} in fields["return_hidden_states"]["anyOf"]
    assert {"const": False, "type": "boolean"} in chat["continue_final_message"]["anyOf"]
    assert {"type": "boolean"} in chat["include_reasoning"]["anyOf"] and "include_reasoning" not in completion
