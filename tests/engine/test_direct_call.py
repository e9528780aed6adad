"""Compiled steps through their graph called directly (`direct_call`): the recipe of a graph's flat inputs, a
batcher's steps switching to the direct call once it agreed with the normal one, token for token equal to
`generate`, and a wrong recipe caught by that check, leaving the normal call for good."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
import torch

from batching.engine.batcher import Batcher
from batching.engine.direct_call import DirectCall, recipe_for
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams
from batching.engine.runner import DIRECT_CHECKS
from tests.engine.helpers import loaded, random_prompts, reference, run_with_late_arrivals

CAPS = [30, 4, 22, 41, 9]
OPTIONS = BatcherOptions(
    max_batch_size=4, max_batched_tokens=24, max_seq_len=96, compile_steps=True, compile_autotune=False
)


def test_each_size_comes_from_the_tensor_after_it_and_each_tensor_from_its_role() -> None:
    ids, tables, pool = torch.zeros(1, 5), torch.zeros(5, 3), torch.zeros(2, 40, 16, 8)
    roles = [ids, tables, pool]
    # dynamo passes a new symbol just before the first tensor that has it, in dimension order
    assert recipe_for([5, ids, 3, tables, 40, pool], roles) == [(0, 1), (0, -1), (1, 1), (1, -1), (2, 1), (2, -1)]
    square = torch.zeros(4, 4)
    assert recipe_for([4, 4, square], [square]) == [(0, 0), (0, 1), (0, -1)]  # two symbols: one way only


def test_no_recipe_when_a_size_fits_two_dimensions_or_an_input_is_not_a_role() -> None:
    square, other = torch.zeros(4, 4), torch.zeros(3)
    assert recipe_for([4, square], [square]) is None  # rows or columns: cannot be told
    assert recipe_for([other], [square]) is None  # a tensor the step did not list
    assert recipe_for([7, square], [square]) is None  # a size the next tensor does not have
    assert recipe_for([square, 4], [square]) is None  # a size no tensor follows
    assert recipe_for([0.5, square], [square]) is None


@pytest.fixture
def compiled_llama(tiny_model_dirs: dict) -> Any:
    return loaded(str(tiny_model_dirs["llama"]))


def _counting(call: DirectCall) -> list[int]:
    calls = [0]
    graph_call = call.graph_call

    def counted(args: list[Any]) -> Sequence[torch.Tensor]:
        calls[0] += 1
        return graph_call(args)

    call.graph_call = counted
    return calls


def test_steps_switch_to_the_direct_call_once_it_agreed_and_stay_equal_to_generate(compiled_llama: Any) -> None:
    model = compiled_llama
    prompts = random_prompts(len(CAPS), vocab=300, seed=11, longest=20)
    expected = [reference(model.model, p, c, ignore_eos=True) for p, c in zip(prompts, CAPS, strict=True)]
    batcher = Batcher(model.model, model.tokenizer, OPTIONS)
    compiler = batcher.runner.compiler
    assert compiler is not None and compiler.compile_now() is not None
    path = compiler.direct
    # A first run makes the direct call and checks it against the normal one.
    first = run_with_late_arrivals(batcher, prompts, CAPS, late_from=3, join_at_step=3, ignore_eos=True)
    assert path.call is not None and path.checked == DIRECT_CHECKS and not path.failed
    assert [first[i] for i in range(len(CAPS))] == expected
    # A second batcher of the same shape shares the graph and its direct call: no more checks, every compiled
    # decode step called directly, rows from 4 down to 1 and histories across several column steps.
    again = Batcher(model.model, model.tokenizer, OPTIONS)
    calls = _counting(path.call)
    compiled_before = again.runner.compiled_steps
    outputs = run_with_late_arrivals(again, prompts, CAPS, late_from=3, join_at_step=3, ignore_eos=True)
    assert [outputs[i] for i in range(len(CAPS))] == expected
    assert calls[0] >= 30 and calls[0] == again.runner.compiled_steps - compiled_before


def test_a_wrong_recipe_is_caught_by_the_check_and_the_steps_stay_exact(
    compiled_llama: Any, caplog: pytest.LogCaptureFixture
) -> None:
    model = compiled_llama
    prompts = random_prompts(3, vocab=300, seed=12, longest=12)
    caps = CAPS[:3]
    expected = [reference(model.model, p, c, ignore_eos=True) for p, c in zip(prompts, caps, strict=True)]
    options = replace(OPTIONS, max_batch_size=6)  # a compiler no other test makes: its direct call is made here
    batcher = Batcher(model.model, model.tokenizer, options)
    compiler = batcher.runner.compiler
    assert compiler is not None and compiler.compile_now() is not None
    path = compiler.direct
    batcher.add(prompts[0], RequestParams(caps[0], ignore_eos=True))
    while path.call is None:  # the watched call makes it
        batcher.step()
    # The same recipe with the tables' block count (the one input with two symbolic sizes) read from their rows:
    # wrong as soon as the step's rows and blocks differ.
    recipe = path.call.recipe
    (tables,) = {role for role, dim in recipe if dim == 1 and (role, 0) in recipe}
    path.call.recipe = [(tables, 0) if source == (tables, 1) else source for source in recipe]
    with caplog.at_level(logging.WARNING, logger="batching.engine.step_call"):
        outputs = run_with_late_arrivals(batcher, prompts[1:], caps[1:], late_from=2, join_at_step=0, ignore_eos=True)
    assert path.failed
    assert any("disagreed with its normal call" in record.getMessage() for record in caplog.records)
    assert [outputs[i] for i in range(2)] == expected[1:]
