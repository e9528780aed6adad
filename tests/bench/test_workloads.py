"""Workloads: the shipped ones load, files in JSON and CSV load (or fail with a clear line), `random` is seeded."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from batching.bench.workloads import (
    RANDOM_NAME,
    SHARE_NOTHING_NAME,
    WORKLOAD_DIR,
    LengthRange,
    builtin_workload_names,
    load_workload,
    random_workload,
    share_nothing_workload,
    workload_json,
)
from batching.engine.blocks import DEFAULT_BLOCK_SIZE
from tests.helpers import ROOT


def test_every_shipped_workload_loads_with_its_batch_size() -> None:
    names = builtin_workload_names()
    assert {"seed-lab", "seed-blog", "seed-ragged", "customer-support", "staggered"} <= set(names)
    assert load_workload("seed-ragged").batch_size == 3
    lab = load_workload("seed-lab")
    assert len(lab.requests) == 32
    assert [request.max_new_tokens for request in lab.requests[:9]] == [100] + [10] * 7 + [100]
    assert [request.arrival_step for request in load_workload("staggered").requests] == list(range(11))
    assert all(request.max_new_tokens is None for request in load_workload("customer-support").requests)


def test_a_json_file_with_arrival_times_loads_in_order(tmp_path: Path) -> None:
    path = tmp_path / "mine.json"
    rows = [{"prompt": "Hi", "max_new_tokens": 3, "arrival_s": 0.5}, {"prompt": "Yo", "max_new_tokens": 4}]
    path.write_text(json.dumps({"name": "mine", "batch_size": 2, "requests": rows}))
    workload = load_workload(str(path))
    assert workload.name == "mine"
    assert workload.batch_size == 2
    assert [(r.prompt, r.max_new_tokens, r.arrival_s) for r in workload.requests] == [("Hi", 3, 0.5), ("Yo", 4, None)]


def test_a_bare_json_list_is_a_workload_too(tmp_path: Path) -> None:
    path = tmp_path / "list.json"
    path.write_text(json.dumps([{"prompt": "Hello", "max_new_tokens": 2}]))
    assert load_workload(str(path)).requests[0].max_new_tokens == 2


def test_a_csv_file_loads_with_optional_arrival_times(tmp_path: Path) -> None:
    path = tmp_path / "mine.csv"
    path.write_text('prompt,max_new_tokens,arrival_s\n"Hello, there",5,\nBye,2,1.25\n')
    workload = load_workload(str(path))
    assert workload.name == "mine"
    assert [(r.prompt, r.max_new_tokens, r.arrival_s) for r in workload.requests] == [
        ("Hello, there", 5, None),
        ("Bye", 2, 1.25),
    ]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("bad.json", "{not json", "not valid JSON"),
        ("empty.json", "[]", "non-empty list"),
        ("noprompt.json", '[{"max_new_tokens": 3}]', "prompt is missing"),
        ("cap.json", '[{"prompt": "a", "max_new_tokens": 2.5}]', "not a whole number"),
        ("zero.csv", "prompt,max_new_tokens\nhi,0\n", "must be >= 1"),
        ("header.csv", "text\nhi\n", "'prompt' column"),
        ("notes.txt", "hello", "use a .json or .csv file"),
        ("raw.json", '{"raw_prompts": "yes", "requests": [{"prompt": "a"}]}', "must be true or false"),
    ],
)
def test_a_bad_file_is_one_clear_value_error(tmp_path: Path, name: str, content: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        load_workload(str(path))


def test_an_unknown_name_lists_what_there_is() -> None:
    with pytest.raises(ValueError, match=r"seed-lab.*random"):
        load_workload("no-such-workload")


def test_the_random_workload_is_the_same_for_the_same_seed() -> None:
    assert random_workload(seed=7) == random_workload(seed=7)
    assert random_workload(seed=7) != random_workload(seed=8)
    assert load_workload(RANDOM_NAME) == random_workload()


def test_random_lengths_stay_within_their_ranges() -> None:
    words, caps = LengthRange(3, 9), LengthRange(5, 50, "lognormal")
    workload = random_workload(requests=200, prompt_words=words, max_new_tokens=caps, batch_size=4, seed=1)
    assert workload.batch_size == 4
    assert len(workload.requests) == 200
    assert all(3 <= len(r.prompt.split()) <= 9 for r in workload.requests)
    assert all(5 <= r.max_new_tokens <= 50 for r in workload.requests)
    assert len({r.max_new_tokens for r in workload.requests}) > 10


def test_exponential_caps_are_mostly_short() -> None:
    draws = [LengthRange(1, 401, "exponential").draw(random.Random(seed)) for seed in range(500)]
    assert sum(draws) / len(draws) == pytest.approx(101, rel=0.2)  # mean a quarter of the way up
    assert sum(draw < 201 for draw in draws) > 400


def test_a_length_range_parses_low_high_or_one_number() -> None:
    assert LengthRange.parse("8:64") == LengthRange(8, 64)
    assert LengthRange.parse("5", "lognormal") == LengthRange(5, 5, "lognormal")
    for bad in ("8-64", "x:3", "9:3", "0:4"):
        with pytest.raises(ValueError, match="length range"):
            LengthRange.parse(bad)
    with pytest.raises(ValueError, match="distribution"):
        LengthRange(1, 2, "gaussian")


def test_share_nothing_ships_as_its_generator_makes_it_untemplated_with_no_two_prompts_sharing_a_block() -> None:
    workload = load_workload(SHARE_NOTHING_NAME)
    assert workload == share_nothing_workload() and workload.raw_prompts
    assert json.loads((WORKLOAD_DIR / f"{SHARE_NOTHING_NAME}.json").read_text()) == workload_json(workload)
    tokenizer = AutoTokenizer.from_pretrained(ROOT / "model" / "builtin")
    prompts = [tokenizer(request.prompt)["input_ids"] for request in workload.requests]
    # Prefix caching shares whole blocks from a prompt's start: different first blocks, nothing to share.
    assert len({tuple(ids[:DEFAULT_BLOCK_SIZE]) for ids in prompts}) == len(prompts) == 32
    # A chat trace's lengths: dozens to hundreds of tokens, most near the low end; caps likewise.
    lengths = sorted(len(ids) for ids in prompts)
    assert lengths[0] >= 30 and lengths[-1] <= 480 and 80 <= lengths[16] <= 200
    caps = sorted(request.max_new_tokens or 0 for request in workload.requests)
    assert caps[0] >= 16 and caps[-1] <= 256 and 32 <= caps[16] <= 100
