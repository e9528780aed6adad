"""How a built step runs: eager, through the compiled graphs (`torch.compile`'s entry in run-only mode), or its graph
called directly (where the route has direct calls: `torch_gate`), and on a GPU a decode step replayed from its CUDA
graph (`cuda_graphs`).

What the step computes is `step_builder`'s; the caller only says which way it ran (`StepAnswer.path`: it knows
which callable it called, and a compiled forward's answer says whether a graph ran it, `step_forward.ran_graph`)
and keeps a compiled step's greedy choices, which the graph makes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from transformers import PreTrainedModel

from batching.engine.attention import PackedPlan
from batching.engine.compiled import Bucket, StepCompiler
from batching.engine.cuda_graphs import DecodeGraphs, Outputs
from batching.engine.direct_path import DirectGraph, DirectPath
from batching.engine.events import StepPath
from batching.engine.kv_cache import PagedKVCache
from batching.engine.sampling import greedy_list
from batching.engine.step_forward import ran_graph
from batching.engine.step_inputs import Signature, StepInputs
from batching.engine.torch_gate import compile_route

logger = logging.getLogger(__name__)

# A step kind's first calls through a direct graph call also run through `torch.compile`: outputs and cache writes
# must agree (`StepCaller._checked_direct`). Watched calls that give no recipe are tried this many times.
DIRECT_CHECKS = 3
DIRECT_TRIES = 8

Step = Callable[..., object]  # a compiled forward: `step(model, **inputs)`, answering as `step_forward.run_model`
Ran = tuple[Sequence[Any], StepPath]  # a compiled call's answer (`run_model`'s, or a direct call's two), how it ran


@dataclass
class StepAnswer:
    """A step's logits `[rows, vocab]` in float32, its greedy choices when a graph made them, and how it ran."""

    logits: torch.Tensor
    greedy: list[int | None] | None
    path: StepPath


class GraphRefused(RuntimeError):
    """A call that had to run through a compiled graph ran eager: the graph's guards refused it."""


class StepCaller:
    """Calls built steps over one model and cache."""

    def __init__(self, model: PreTrainedModel, cache: PagedKVCache, cache_kwarg: str) -> None:
        self.model = model
        self.cache = cache
        self.cache_kwarg = cache_kwarg
        # A prepared 4D mask is passed through by the model untouched; the real masks travel in the plan.
        self.placeholder_mask = torch.zeros((1, 1, 1, 1), dtype=model.dtype, device=model.device)

    def kwargs(self, inputs: StepInputs) -> dict[str, Any]:
        """The model's keyword arguments for `inputs`, its plans handed to the cache."""
        inputs.bind(self.cache)
        return inputs.forward_kwargs(self.cache, self.cache_kwarg, self.placeholder_mask)

    def __call__(
        self, inputs: StepInputs, step: Step | None = None, compiler: StepCompiler | None = None, trace: bool = False
    ) -> StepAnswer:
        """Run `inputs` eager (`step` None) or through `step`; with the step kind's `compiler`, through its graph
        called directly once that call is made and checked. `trace`: this call makes the graph (sizes marked)."""
        kwargs = self.kwargs(inputs)
        rows = inputs.rows
        if step is None:
            output: Any = self.model(**kwargs)
            return StepAnswer(output.logits[0, :rows].float(), None, "eager")
        if trace:
            route = compiler.route if compiler is not None else compile_route()[1]
            route.mark_dynamic(inputs.dynamic, inputs.maybe_dynamic)
        ran = None
        if compiler is not None and not compiler.direct.failed and self.cache.recurrent_states is None:
            # (a hybrid's states are not checked: the normal call)
            roles, signature = inputs.roles(self.placeholder_mask, self.cache.pools())
            ran = self._direct(compiler, step, roles, signature, kwargs)
        if ran is None:
            ran = self._through_graphs(step, kwargs)
        outputs, path = ran
        logits, greedy = outputs[0], outputs[1]
        return StepAnswer(logits[:rows].float(), greedy_list(greedy[:rows]), path)

    def replay(
        self, graphs: DecodeGraphs, bucket: Bucket, values: list[list[Any]], rows: int
    ) -> tuple[StepAnswer, PackedPlan] | None:
        """A decode step replayed from the bucket's CUDA graph, once captured (None: not yet), and its attention
        plan; its plans become the cache's, as a call's would."""
        captured = graphs.replay(bucket, values)
        if captured is None:
            return None
        self.cache.plan, plan = captured.plans
        self.cache.attention_plan = plan
        return _graph_answer(captured.outputs, rows, "direct"), plan  # no torch.compile entry

    def capture(
        self, graphs: DecodeGraphs, bucket: Bucket, inputs: StepInputs, sources: list[torch.Tensor], step: Step
    ) -> StepAnswer:
        """A decode step through `step`, then captured as the bucket's CUDA graph (`sources`: the tensors the graph's
        replays copy new values into); not captured when the graphs' guards refused the step (it ran eager)."""
        assert isinstance(inputs.plan, PackedPlan)  # a decode step's
        plan, kwargs = inputs.plan, self.kwargs(inputs)
        outputs, path = self._through_graphs(step, kwargs)
        called = cast(Outputs, tuple(outputs[:2]))
        if path == "compiled":
            run = self._graph_run(step, kwargs, plan)
            graphs.capture(
                bucket, sources, (inputs.cache_plan, plan), called, run, self.cache.pools(), inputs.cache_plan.slots
            )
        return _graph_answer(called, inputs.rows, path)

    def _graph_run(self, step: Step, kwargs: dict[str, Any], plan: PackedPlan) -> Callable[[], Outputs]:
        """The step through its compiled graph again, as a capture runs it: the masks the last call built are dropped
        first (kept, the graph's guards refuse the call, which then runs eager and would be captured reading them as
        constants: every replay would attend with the capture's mask); raises `GraphRefused` if no graph ran."""

        def run() -> Outputs:
            plan.forget_masks()
            outputs = cast(Sequence[Any], step(self.model, **kwargs))
            if not ran_graph(outputs):
                raise GraphRefused("the compiled graph's guards refused the step, which ran eager")
            return cast(Outputs, tuple(outputs[:2]))

        return run

    def _through_graphs(self, step: Step, kwargs: dict[str, Any]) -> Ran:
        """The step through `step` (the graphs in run-only mode, `StepCompiler.graphs_only`): "compiled" when a graph
        ran, "eager" when none admitted the step and the model's own code ran."""
        outputs = cast(Sequence[Any], step(self.model, **kwargs))
        return outputs, "compiled" if ran_graph(outputs) else "eager"

    def _direct(
        self,
        compiler: StepCompiler,
        step: Step,
        roles: list[torch.Tensor],
        signature: Signature,
        kwargs: dict[str, Any],
    ) -> Ran | None:
        """The step through its graph called directly once the call is made and checked; until then through
        `torch.compile`, watched to make the call, then run both ways to check it. None: the normal call."""
        path = compiler.direct
        call = path.call
        if call is None:
            with compiler.route.watching() as seen:
                outputs = cast(Sequence[Any], step(self.model, **kwargs))
            if not ran_graph(outputs):  # no graph admitted the step: it ran eager, and says so; no recipe to make
                return outputs, "eager"
            path.call = compiler.route.direct_call(step, seen, roles)
            if path.call is None:
                path.tries += 1
                path.failed = path.tries >= DIRECT_TRIES
            return outputs, "compiled"
        if call.roles != len(roles) or not call.admits(self.model, kwargs, self.cache, signature):
            return None
        if path.checked < DIRECT_CHECKS:
            # The normal call's answer (its guards are the direct call's: it ran a graph).
            return self._checked_direct(path, call, step, roles, kwargs), "compiled"
        return call(roles), "direct"

    def _checked_direct(
        self, path: DirectPath, call: DirectGraph, step: Step, roles: list[torch.Tensor], kwargs: dict[str, Any]
    ) -> Sequence[Any]:
        """Run the step through `torch.compile`, then directly over the same inputs with the cache slots it wrote
        overwritten with NaN: the direct call must give the same outputs (its graph's two, and no more: more would
        be what dynamo does after the graph) and write the same slots. Else the direct call is dropped for good."""
        normal = cast(Sequence[Any], step(self.model, **kwargs))
        slots = self.cache.plan.slots
        pools = [pool.view(pool.shape[0], -1, pool.shape[-1]) for pool in self.cache.pools()]
        written = [pool[:, slots].clone() for pool in pools]
        for pool in pools:
            pool[:, slots] = float("nan")
        try:
            direct = call(roles)
            same = len(direct) == 2 and ran_graph(normal) and all(map(torch.equal, direct, normal[:2]))
            same = same and all(torch.equal(pool[:, slots], kept) for pool, kept in zip(pools, written, strict=True))
        except Exception as exc:  # any failure means: not this way
            logger.debug("direct graph call failed", exc_info=exc)
            same = False
        if not same:
            for pool, kept in zip(pools, written, strict=True):
                pool[:, slots] = kept
            path.failed = True
            logger.warning("a compiled graph called directly disagreed with its normal call: normal calls from now on")
        else:
            path.checked += 1
        return normal


def _graph_answer(outputs: Outputs, rows: int, path: StepPath) -> StepAnswer:
    """A graph's outputs as a compiled call's: greedy choices kept, the first `rows` rows' logits in float32, a copy
    (the graph's next replay overwrites its outputs)."""
    logits, greedy = outputs
    return StepAnswer(logits[:rows].to(torch.float32, copy=True), greedy_list(greedy[:rows]), path)
