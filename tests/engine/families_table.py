"""Print docs/models.md's table of model families from the test matrix: `python -m tests.engine.families_table`.

Each family's tiny config is built (random weights), then asked what the engine says of it: the attention
features it reports, and for a refused family the engine's own one-line reason.
"""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from batching.engine.model_support import UnsupportedModelError, attention_features, check_supported
from tests.engine.families import FAMILIES


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
