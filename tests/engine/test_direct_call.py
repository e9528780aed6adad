"""Compiled steps through their graph called directly (`torch_door.direct_call`, behind the door: skipped where it is
closed): the recipe of a graph's flat inputs, a
direct call made and checked with the graph so a batcher's steps take it from the first, token for token equal to
`generate`, the guards asked once per step signature while global state stays, and a wrong recipe caught by that
check, leaving the normal call for good."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
import torch

from batching.engine.attention import PackedPlan, RowMask
from batching.engine.batcher import Batcher
from batching.engine.options import BatcherOptions
from batching.engine.runner import DIRECT_CHECKS
from batching.engine.step_inputs import walk_plan
from tests.engine.helpers import door_open, loaded, random_prompts, reference, run_with_late_arrivals

if not door_open():
    pytest.skip("the door to torch's internals is closed: no direct calls", allow_module_level=True)

import batching.engine.torch_door.direct_call as direct_call  # behind the door: imported only where it is open
from batching.engine.torch_door.direct_call import DirectCall, recipe_for

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


def test_steps_take_the_direct_call_made_with_the_graph_and_stay_equal_to_generate(compiled_llama: Any) -> None:
    model = compiled_llama
    prompts = random_prompts(len(CAPS), vocab=300, seed=11, longest=20)
    expected = [reference(model.model, p, c, ignore_eos=True) for p, c in zip(prompts, CAPS, strict=True)]
    batcher = Batcher(model.model, model.tokenizer, OPTIONS)
    compiler = batcher.runner.compiler
    assert compiler is not None and compiler.compile_now() is not None
    path = compiler.direct
    # Making the graph made its direct call and checked it against the normal one (`warmup.make_direct_call`), so
    # the first real step already calls it.
    assert path.call is not None and path.checked == DIRECT_CHECKS and not path.failed
    calls = _counting(path.call)
    first = run_with_late_arrivals(batcher, prompts, CAPS, late_from=3, join_at_step=3, ignore_eos=True)
    assert [first[i] for i in range(len(CAPS))] == expected
    assert calls[0] >= 30 and calls[0] == batcher.runner.compiled_steps
    # A second batcher of the same shape shares the graph and its direct call: no more checks, every compiled
    # decode step called directly, rows from 4 down to 1 and histories across several column steps.
    again = Batcher(model.model, model.tokenizer, OPTIONS)
    calls = _counting(path.call)
    compiled_before = again.runner.compiled_steps
    outputs = run_with_late_arrivals(again, prompts, CAPS, late_from=3, join_at_step=3, ignore_eos=True)
    assert [outputs[i] for i in range(len(CAPS))] == expected
    assert calls[0] >= 30 and calls[0] == again.runner.compiled_steps - compiled_before


class CountingGuards:
    """A graph's real guards, counting the checks that reach them."""

    def __init__(self, guards: Any) -> None:
        self.guards, self.checks = guards, 0

    def check(self, frame_locals: dict[str, Any]) -> bool:
        self.checks += 1
        return bool(self.guards.check(frame_locals))


def test_the_guards_answer_once_per_step_signature_while_global_state_stays(compiled_llama: Any) -> None:
    model = compiled_llama
    prompts = random_prompts(len(CAPS), vocab=300, seed=13, longest=20)
    batcher = Batcher(model.model, model.tokenizer, OPTIONS)
    compiler = batcher.runner.compiler
    assert compiler is not None and compiler.compile_now() is not None
    call = compiler.direct.call
    assert call is not None
    guards = CountingGuards(call.guards)
    call.guards, call._admitted, call._state = guards, set(), None
    asked: list[Any] = []
    probes: list[tuple[bool, int]] = []  # (admitted, checks so far) around the tenth step
    admits = call.admits

    def recorded(model: object, inputs: dict[str, Any], cache: object, signature: Any) -> bool:
        asked.append(signature)
        if len(asked) == 10:
            probes.append((admits(model, inputs, cache, signature), guards.checks))
            # A global flag the guards read switched (TF32: a CPU step ignores it): the kept answer is not used.
            tf32 = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = not tf32
            try:
                probes.append((admits(model, inputs, cache, signature), guards.checks))
            finally:
                torch.backends.cuda.matmul.allow_tf32 = tf32
        return admits(model, inputs, cache, signature)

    call.admits = recorded  # type: ignore[method-assign]
    run_with_late_arrivals(batcher, prompts, CAPS, late_from=3, join_at_step=3, ignore_eos=True)
    (kept, checks), (switched, checks_switched) = probes
    assert kept and not switched and checks_switched == checks + 1
    distinct = len(set(asked))
    # Rows from 4 down to 1 and histories across several column widths: several signatures, each met many times;
    # the tenth step's asked once more with the flag switched (the flag back, the kept answers stand again).
    assert 3 <= distinct < len(asked) // 4 and guards.checks == distinct + 1


def test_a_step_signature_holds_every_tensor_size_stride_and_dtype_and_every_other_value() -> None:
    def plan(rows: int = 3, kv_len: int = 1, tables: torch.Tensor | None = None) -> PackedPlan:
        mask = RowMask(torch.zeros(rows, 1, 1, 1, dtype=torch.int64), torch.zeros(rows, 1, 1, 1), torch.float32)
        return PackedPlan(rows, None, None, mask, [], kv_len, torch.zeros(rows, 4) if tables is None else tables)

    def signature(of: PackedPlan) -> tuple[Any, ...]:
        found: list[Any] = []
        tensors = walk_plan(of, found)
        assert len(tensors) == 3  # the tables and the mask's two tensors, not the mask's dtype
        return tuple(found)

    same = signature(plan())
    assert signature(plan()) == same  # new tensors of the same kind: the same signature
    assert signature(plan(rows=2)) != same
    assert signature(plan(kv_len=2)) != same
    assert signature(plan(kv_len=True)) != same  # True == 1, but not the same value to a guard
    assert signature(plan(tables=torch.zeros(3, 5))) != same
    assert signature(plan(tables=torch.zeros(4, 3).t())) != same  # same sizes, other strides
    assert signature(plan(tables=torch.zeros(3, 4, dtype=torch.int64))) != same


def test_a_wrong_recipe_is_caught_by_the_check_and_the_steps_stay_exact(
    compiled_llama: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = compiled_llama
    prompts = random_prompts(3, vocab=300, seed=12, longest=12)
    caps = CAPS[:3]
    expected = [reference(model.model, p, c, ignore_eos=True) for p, c in zip(prompts, caps, strict=True)]

    def wrong_recipe(inputs: Sequence[Any], roles: Sequence[torch.Tensor]) -> list[tuple[int, int]] | None:
        """The real recipe with the tables' block count (the one input with two symbolic sizes) read from their
        rows: wrong whenever a step's rows and blocks differ, as the warm-up's do (6 rows, 4 blocks)."""
        recipe = recipe_for(inputs, roles)
        if recipe is None:
            return None
        (tables,) = {role for role, dim in recipe if dim == 1 and (role, 0) in recipe}
        return [(tables, 0) if source == (tables, 1) else source for source in recipe]

    monkeypatch.setattr(direct_call, "recipe_for", wrong_recipe)
    options = replace(OPTIONS, max_batch_size=6)  # a compiler no other test makes: its direct call is made here
    batcher = Batcher(model.model, model.tokenizer, options)
    compiler = batcher.runner.compiler
    assert compiler is not None
    with caplog.at_level(logging.WARNING, logger="batching.engine.step_call"):
        assert compiler.compile_now() is not None
    path = compiler.direct
    assert path.failed
    assert any("disagreed with its normal call" in record.getMessage() for record in caplog.records)
    outputs = run_with_late_arrivals(batcher, prompts, caps, late_from=2, join_at_step=0, ignore_eos=True)
    assert [outputs[i] for i in range(3)] == expected
    assert batcher.runner.compiled_steps > 0  # through the normal call
