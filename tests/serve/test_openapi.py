"""The server's own OpenAPI schema says what its routes take and answer: every status code and content type, and
this server's limits (model, vocabulary, window, seed), checked by reading it and by schemathesis with all its
checks against a real `python -m batching.serve` (a 256-position window and 8-token default answers keep the run
short: its fuzzing sends hundreds of requests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from batching.engine.params import MAX_SEED
from config.settings import ModelSettings
from model.loader import load_model
from model.prompting import format_prompt
from tests.engine.helpers import reference
from tests.helpers import ROOT
from tests.serve.helpers import openai_client, our_server, served

MODEL = "builtin"
WINDOW = 256
ENV = {"BATCHSCOPE_BATCHING__MAX_SEQ_LEN": str(WINDOW), "BATCHSCOPE_GENERATION__MAX_NEW_TOKENS": "8"}


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with our_server(tmp_path_factory.mktemp("openapi"), ENV) as (served_url, _):
        yield served_url


@pytest.fixture(scope="module")
def schema(url: str) -> dict:
    with urllib.request.urlopen(url + "/openapi.json", timeout=10) as answer:
        return json.loads(answer.read())


def test_every_status_and_content_type_a_route_answers_is_documented(schema: dict) -> None:
    paths = schema["paths"]
    for path in ("/v1/completions", "/v1/chat/completions"):
        answers = paths[path]["post"]["responses"]
        assert {"200", "400", "401", "429", "500", "503"} <= set(answers) and "422" not in answers
        assert set(answers["200"]["content"]) == {"application/json", "text/event-stream"}
        assert answers["400"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorBody"}
    assert set(paths["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    assert {"200", "503"} <= set(paths["/health"]["get"]["responses"])
    assert "HTTPValidationError" not in schema["components"]["schemas"]


def test_the_request_schemas_state_this_servers_limits(schema: dict) -> None:
    completion = schema["components"]["schemas"]["CompletionRequest"]
    fields = completion["properties"]
    assert completion["additionalProperties"] is False  # an unknown field is a 400, as the schema says
    assert {"maximum": MAX_SEED, "minimum": 0, "type": "integer"} in fields["seed"]["anyOf"]  # exact, not a float
    assert {"maximum": WINDOW - 1, "minimum": 1, "type": "integer"} in fields["max_tokens"]["anyOf"]
    ids = next(form for form in fields["prompt"]["anyOf"] if form.get("items", {}).get("type") == "integer")
    assert ids["maxItems"] == WINDOW - 1 and ids["items"]["exclusiveMaximum"] == 3027  # the embedded vocabulary
    assert fields["model"]["enum"] == [MODEL, None]
    assert fields["tools"]["type"] == "null" and fields["n"]["anyOf"][0]["const"] == 1


def test_a_cap_beyond_what_the_prompt_leaves_ends_the_answer_at_the_window(url: str) -> None:
    """vLLM's rule: max_tokens up to the window is taken, and cut to the room a longer prompt leaves."""
    prompt = [5 + i % 50 for i in range(200)]
    answer = openai_client(url).completions.create(
        model=MODEL, prompt=prompt, max_tokens=WINDOW - 1, temperature=0, extra_body={"ignore_eos": True}
    )
    assert answer.usage.completion_tokens == WINDOW - len(prompt) and answer.choices[0].finish_reason == "length"


@pytest.mark.long
def test_schemathesis_with_all_its_checks_finds_nothing_and_the_server_answers_token_exact_after(
    url: str, tmp_path: Path
) -> None:
    """Schemathesis' coverage and fuzzing phases against the served schema: no 5xx, every answer's status, content
    type, headers and body as documented, schema-valid requests taken and invalid ones refused, 405s with their
    Allow header. Its response-time check gets the request timeout as its limit: no speed is asserted here. One
    refusal is let through (schemathesis_hooks.py): a prompt longer in tokens than the window, which no JSON
    schema can state."""
    before, _ = served(url)
    command = [
        *(sys.executable, "-m", "schemathesis.cli", "run", url + "/openapi.json", "--checks", "all"),
        *("--max-examples", "10", "--seed", "1", "--workers", "1"),
        *("--request-timeout", "60", "--max-response-time", "60"),
    ]
    path = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.serve.schemathesis_hooks", "PYTHONPATH": path, "NO_COLOR": "1"}
    builtin = load_model(ModelSettings(name_or_path=MODEL, device="cpu", dtype="float32"))
    prompt = format_prompt("Where is my order?")
    expected = builtin.tokenizer.decode(
        reference(builtin.model, builtin.tokenizer(prompt)["input_ids"], 24), skip_special_tokens=True
    )
    client = openai_client(url)

    def streamed() -> str:
        """What a well-behaved user beside the fuzzer gets: a greedy answer streamed on the same shared batcher."""
        chunks = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stream=True)
        return "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)

    fuzzer = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    beside = [streamed()]
    while fuzzer.poll() is None:  # the user keeps asking for as long as the fuzzer runs
        beside.append(streamed())
    stdout, stderr = fuzzer.communicate(timeout=900)
    assert fuzzer.returncode == 0, stdout[-8000:] + stderr[-2000:]
    assert "No issues found" in stdout
    assert served(url)[0] - before > 100  # it did send its requests, and the engine answered them
    assert beside == [expected] * len(beside), "a request beside the fuzzer's was answered differently"
    answer = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
    assert answer.choices[0].text == expected
