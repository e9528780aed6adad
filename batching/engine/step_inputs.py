"""One step's work as values: the rows' new tokens packed into one sequence, and the forward call built from them.

`PackedStep` is what the rows ask for (tokens, positions, cache slots); `StepInputs` is one forward call of the
model, whichever builder made it (`step_builder`) and however it will be called (`step_call`): the model's inputs,
the cache's plan, the attention plan, the logits rows to keep, and the sizes a tracing call keeps symbolic.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import torch

from batching.engine.attention import PLAN_KWARG, GroupedPlan, PackedPlan
from batching.engine.kv_cache import PagedKVCache, StepPlan
from batching.engine.mask_view import StepMask
from batching.engine.recurrent import StatePlan

Dims = list[tuple[torch.Tensor, int]]  # (tensor, dimension) pairs
Signature = tuple[Hashable, ...]  # `StepInputs.roles`: what a step's guards can read of it


@dataclass
class PackedStep:
    """A step's new tokens, every row's packed into one sequence, and where each goes in the cache."""

    input_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    write_slots: list[int] = field(default_factory=list)
    write_columns: list[int] = field(default_factory=list)
    last_token: list[int] = field(default_factory=list)  # per row: its last new token's packed index
    singles: list[tuple[int, int]] = field(default_factory=list)  # (row, packed index): one new token
    chunks: list[tuple[int, int, int]] = field(default_factory=list)  # (row, packed start, packed end): a prompt chunk

    @property
    def rows(self) -> int:
        return len(self.last_token)

    @property
    def longest_chunk(self) -> int:
        return max((end - start for _, start, end in self.chunks), default=0)


@dataclass
class StepInputs:
    """One forward call: its tensors, the plans the cache and attention read, and what a tracing call marks."""

    input_ids: torch.Tensor  # [1, tokens]
    position_ids: torch.Tensor  # [1, tokens]
    logits_to_keep: torch.Tensor | int  # the packed indices whose logits are kept (0: every token's)
    cache_plan: StepPlan
    plan: PackedPlan | GroupedPlan
    rows: int  # the real rows: the first `rows` kept logits rows are the step's answer
    state_plan: StatePlan | None = None  # a hybrid model's mixers' split (None: left as it is)
    mask: StepMask | None = None  # the masks as the rows see them, when the batcher asks (`describe_masks`)
    # Sizes kept symbolic when this call traces its graph: always, and where dynamo finds them not specialised (the
    # route marks them: `torch_gate.CompileRoute.mark_dynamic`).
    dynamic: Dims = field(default_factory=list)
    maybe_dynamic: Dims = field(default_factory=list)

    def bind(self, cache: PagedKVCache) -> None:
        """Hand the cache the plans its layers read during the forward."""
        cache.plan, cache.attention_plan, cache.position_ids = self.cache_plan, self.plan, self.position_ids
        if self.state_plan is not None and cache.recurrent_states is not None:
            cache.recurrent_states.plan = self.state_plan

    def forward_kwargs(self, cache: PagedKVCache, cache_kwarg: str, attention_mask: torch.Tensor) -> dict[str, Any]:
        """The model's keyword arguments for this step: the one place a forward call is spelled out."""
        return {
            "input_ids": self.input_ids,
            "position_ids": self.position_ids,
            "attention_mask": attention_mask,
            cache_kwarg: cache,
            "use_cache": True,
            "logits_to_keep": self.logits_to_keep,
            PLAN_KWARG: self.plan,
        }

    def roles(self, attention_mask: torch.Tensor, pools: list[torch.Tensor]) -> tuple[list[torch.Tensor], Signature]:
        """Every tensor the step passes, in a fixed order for the step's kind: what a graph called directly is
        given (`torch_door.direct_call`); and the step's signature: what dynamo's guards can read of the call that is
        not the same object every step (each tensor's dtype, sizes and strides; the plans' types and other values)."""
        keep = [self.logits_to_keep] if isinstance(self.logits_to_keep, torch.Tensor) else []
        head = [self.input_ids, self.position_ids, *keep, attention_mask]
        signature: list[Hashable] = [_tensor_signature(tensor) for tensor in head]
        signature.append(None if keep else self.logits_to_keep)
        plans = walk_plan(self.cache_plan, signature) + walk_plan(self.plan, signature)
        signature += [_tensor_signature(pool) for pool in pools]
        return [*head, *plans, *pools], tuple(signature)


def walk_plan(plan: object, signature: list[Hashable]) -> list[torch.Tensor]:
    """The tensors a step's plan holds (its dataclass fields, nested plans and lists of them), in a fixed order;
    and, appended to `signature`, everything else a compiled graph's guards can see in it: each node's type and
    size, each tensor's metadata, every other value (an object of another kind by identity)."""
    found: list[torch.Tensor] = []
    stack = [plan]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            found.append(item)
            signature.append(_tensor_signature(item))
        elif isinstance(item, list | tuple):
            signature.append((type(item), len(item)))
            stack += list(item)
        elif (names := _field_names(type(item))) is not None:
            signature.append((type(item),))
            stack += [getattr(item, name) for name in names]
        elif isinstance(item, dict):  # made while tracing (a mask's additive forms): its keys only
            signature.append((dict, tuple(item)))
        elif item is None or isinstance(item, int | float | str | torch.dtype):
            signature.append((type(item), item))  # typed: True, 1 and 1.0 are equal keys
        else:
            signature.append((type(item), id(item)))
    return found


def _tensor_signature(tensor: torch.Tensor) -> Hashable:
    return tensor.dtype, tensor.shape, tensor.stride()


_FIELDS: dict[type, tuple[str, ...] | None] = {}  # a compiled step lists its roles every step: fields read once


def _field_names(kind: type) -> tuple[str, ...] | None:
    """A dataclass's field names (None for any other type), looked up once per type."""
    if kind not in _FIELDS:
        is_dataclass = dataclasses.is_dataclass(kind)
        _FIELDS[kind] = tuple(spec.name for spec in dataclasses.fields(kind)) if is_dataclass else None
    return _FIELDS[kind]
