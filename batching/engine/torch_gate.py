"""The one gate to torch's private internals: which torch they were checked on, whether the running one is it, and
whether a setting closed the door. Compiled steps go one of two routes, chosen here once per process:

- **torch's internals** (`torch_door`, imported only here and only when the door opens): dynamo's run-only mode,
  inductor with the weights frozen into the graph and what AOT autograd and freezing made kept on disk, and a ready
  graph called without `torch.compile`'s entry;
- **public APIs only** (`public_route`): `torch.compile` and `torch.compiler.set_stance`, on any torch.

The door opens where compiled steps are asked for, the running torch is `CHECKED_TORCH` and the setting allows it
(`allow_internals`); anywhere else the steps take the public route, token for token the same answers.
"""

from __future__ import annotations

import importlib
import logging
import re
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from transformers import PreTrainedModel

from batching.engine.direct_path import DirectGraph

logger = logging.getLogger(__name__)

# The torch (major.minor, or major.minor.patch) every private piece behind the door was read and tested on.
CHECKED_TORCH = "2.13"
DOOR = "batching.engine.torch_door"
Dims = Sequence[tuple[torch.Tensor, int]]  # (tensor, dimension) pairs


def checked(version: str, on: str = CHECKED_TORCH) -> bool:
    """Whether torch `version` (as torch spells its own: "2.13.0+cpu") is the one checked, `on`: the same
    release numbers as far as `on` gives them ("2.13" takes 2.13.0 and 2.13.1, not 2.14.1 nor 2.1)."""
    release = re.match(r"\d+(?:\.\d+)*", version)
    wanted = on.split(".")
    return release is not None and release.group(0).split(".")[: len(wanted)] == wanted


class CompileRoute(Protocol):
    """How compiled steps are made and run: through torch's internals or its public APIs only."""

    name: str
    frozen_weights: bool  # the weights are constants of the graph (and so the C++ GEMM templates are offered)
    marks_sizes: bool  # sizes are marked symbolic (`mark_dynamic`); else a second trace of other sizes makes them so

    def compile(
        self, run: Callable[..., object], options: dict[str, Any], model: PreTrainedModel
    ) -> Callable[..., object]:
        """`run` compiled with inductor's `options` for graphs of `model` (passed at each call)."""
        ...

    def graphs_only(self, forward: Callable[..., object]) -> Callable[..., object]:
        """`forward` that runs a graph its guards admit, else the model's own code, eager: never compiles, never
        waits on dynamo's compile lock."""
        ...

    def making(self, forward: Callable[..., object]) -> Callable[..., object]:
        """`forward` as the thread that makes the graph calls it."""
        ...

    def tracing(self) -> AbstractContextManager[None]:
        """Around a graph's making."""
        ...

    def mark_dynamic(self, dynamic: Dims, maybe_dynamic: Dims) -> None:
        """Mark the sizes a tracing call keeps symbolic (always; where dynamo finds them not specialised)."""
        ...

    def cache_hits(self) -> int | None:
        """Graphs read from inductor's disk cache so far in this process; None where that cannot be told."""
        ...

    def clear_cache(self) -> None:
        """Empty inductor's cache folder, so a graph read from it that could not be trusted is compiled afresh."""
        ...

    def forget(self, forward: Callable[..., object]) -> bool:
        """Drop the graphs dynamo made for `forward`; False where it cannot (the caller makes a new forward)."""
        ...

    def direct_calls(self, device: torch.device) -> bool:
        """Whether a graph on `device` may be called directly, without `torch.compile`'s entry."""
        ...

    def watching(self) -> AbstractContextManager[list[tuple[Any, list[Any]]]]:
        """Within the block, this thread's graph calls: (graph, its flat inputs), to make a direct call from."""
        ...

    def direct_call(
        self, forward: Callable[..., object], seen: list[tuple[Any, list[Any]]], roles: Sequence[torch.Tensor]
    ) -> DirectGraph | None:
        """The direct call of `forward`'s graph, seen called once (`seen`), over the step's `roles`; None: not made."""
        ...


@dataclass(frozen=True)
class DoorState:
    """Whether the door is open, and the line that says so at start."""

    open: bool
    line: str


_allowed = True  # the setting (engine.torch_internals)
_chosen: tuple[DoorState, CompileRoute] | None = None
_lock = threading.Lock()


def allow_internals(allowed: bool) -> None:
    """The setting: whether torch's internals may be used where the running torch is the checked one (the default).
    For every entry point at start, before any compiled step is made; later, only compilers made after it follow."""
    global _allowed, _chosen
    with _lock:
        _allowed, _chosen = allowed, None


def door_state(version: str = torch.version.__version__, allowed: bool | None = None) -> DoorState:
    """Whether the door opens for torch `version` and the setting (default: this process's), without opening it."""
    allowed = _allowed if allowed is None else allowed
    if not allowed:
        return DoorState(False, "torch internals: off by setting (public torch APIs only)")
    if not checked(version):
        return DoorState(False, f"torch internals: off: torch {version} was not checked (public torch APIs only)")
    return DoorState(True, f"torch internals: on (checked on torch {CHECKED_TORCH})")


def compile_route() -> tuple[DoorState, CompileRoute]:
    """This process's route for compiled steps, chosen at the first call (opening the door where it may) and said in
    the log; for whoever makes compiled steps only: the door is never imported otherwise."""
    global _chosen
    with _lock:
        if _chosen is None:
            _chosen = _choose()
            logger.info("%s", _chosen[0].line)
        return _chosen


def _choose() -> tuple[DoorState, CompileRoute]:
    state = door_state()
    if state.open:
        try:
            door = importlib.import_module(DOOR)
            return state, door.InternalRoute()
        except ImportError as exc:  # a build without a piece it reads: the public route, said
            state = DoorState(False, f"torch internals: off: the door could not open ({exc}) (public torch APIs only)")
    from batching.engine.public_route import PublicRoute

    return state, PublicRoute()
