"""Print docs/models.md's table of model families from the test matrix, then the README's summary of it:
`python -m tests.engine.families_table`.

Each family's tiny config is built (random weights), then asked what the engine says of it: the attention
features it reports, and for a refused family the engine's own one-line reason.
"""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from batching.engine.model_support import UnsupportedModelError, attention_features, check_supported
from tests.engine.families import FAMILIES


def summary() -> list[str]:
    """The README's table: the families by kind of layer, each marked exact or refused (the matrix's verdicts)."""
    lines = ["| layers | token-exact with `generate` | refused |", "|---|---|---|"]
    kinds = ("attention only", "hybrid / state-space", "GPTQ 4-bit weights (gptqmodel's CPU kernel)")
    groups: dict[str, tuple[list[str], list[str]]] = {kind: ([], []) for kind in kinds}
    for family in FAMILIES:
        exact, refused = groups[kinds[2] if family.gptq_bits else kinds[1] if family.recurrent else kinds[0]]
        (refused if family.refused else exact).append(family.name)
    for kind, (exact, refused) in groups.items():
        lines.append(f"| {kind} | {', '.join(exact)} | {', '.join(refused) or '-'} |")
    return lines


def rows() -> list[str]:
    lines = ["| family | model type | what its tiny test config switches on | engine |", "|---|---|---|---|"]
    for family in FAMILIES:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(family.config())
        try:
            check_supported(model)
            verdict = "exact" + (f" ({attention_features(model)})" if attention_features(model) else "")
        except UnsupportedModelError as exc:
            verdict = "refused: " + str(exc).split(" is not supported: ", 1)[1]
        lines.append(f"| {family.name} | `{model.config.model_type}` | {family.features} | {verdict} |")
    return lines


if __name__ == "__main__":
    print("\n".join(rows()))
    print()
    print("\n".join(summary()))
