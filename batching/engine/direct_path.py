"""A step kind's way to its graph called directly (where the route has one: `torch_gate`): the call, once made,
and how far it is checked. What the call is, and how it is made, is the door's (`torch_door.direct_call`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from batching.engine.step_inputs import Signature


class DirectGraph(Protocol):
    """A compiled graph called without `torch.compile`'s entry: with the step's roles, in the runner's order."""

    roles: int  # how many roles it was made for

    def admits(self, model: object, inputs: dict[str, Any], cache: object, signature: Signature) -> bool:
        """Whether the graph's guards accept this call."""
        ...

    def __call__(self, roles: Sequence[torch.Tensor]) -> Sequence[torch.Tensor]: ...


@dataclass
class DirectPath:
    """A step kind's direct call: not yet made, being checked, in use, or given up (the normal call for good)."""

    call: DirectGraph | None = None
    checked: int = 0  # calls that ran both ways and agreed
    tries: int = 0  # watched calls that gave no recipe (a size matched two dimensions of its tensor, say)
    failed: bool = False
