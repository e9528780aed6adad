"""The interference benchmark on a tiny model: a smaller token budget cuts the long prompt into more steps (counts,
not times), and the table and JSON carry every budget."""

from __future__ import annotations

import json
from pathlib import Path

from batching.bench.cli import main


def test_a_smaller_budget_computes_the_long_prompt_in_more_steps(tiny_model_dirs, tmp_path: Path, capsys) -> None:
    out = tmp_path / "interference.json"
    code = main(
        [
            "interference",
            "--model",
            str(tiny_model_dirs["llama"]),
            "--budgets",
            "128,16",
            "--prompt-tokens",
            "60",
            "--repeat",
            "1",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    rows = {row["budget"]: row for row in json.loads(out.read_text())}
    assert rows[128]["prompt_steps"] == 1 and rows[16]["prompt_steps"] == 7  # 60 tokens: 16 - 7 decode rows = 9 a step
    assert "| 128 | 1 |" in capsys.readouterr().out


def test_a_budget_that_leaves_no_room_for_prompts_is_refused(capsys) -> None:
    assert main(["interference", "--budgets", "8"]) == 2
    assert "--budgets=8 is not allowed: each must exceed 8 (the slots)" in capsys.readouterr().err
