"""The function every compiled step's graph is made from: the model's forward, each row's greedy choice, and
whether the call ran as a graph, which is how the caller tells a compiled step from an eager one on either route
(`torch_gate`): `torch.compiler.is_compiling()` is a constant True in a traced graph and False in the model's own
code, so no hook into torch is needed to know."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import PreTrainedModel

from batching.engine.sampling import greedy_choices


def run_model(model: PreTrainedModel, **inputs: Any) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The step's logits `[rows, vocab]`, each row's greedy choice made in the graph (`greedy_choices`: outside it,
    the reductions and argmax cost 0.1 ms a step on the embedded model, 5% of a seed-blog run), and whether a graph
    ran it (a constant of the graph: not one of its outputs)."""
    logits = model(**inputs).logits[0]
    return logits, greedy_choices(logits), torch.compiler.is_compiling()


def ran_graph(outputs: Sequence[Any]) -> bool:
    """Whether a call of a compiled `run_model` ran one of its graphs (else the model's own code, eager)."""
    return len(outputs) == 3 and outputs[2] is True
