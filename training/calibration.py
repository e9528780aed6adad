"""Write the embedded model's GPTQ calibration texts, `model/calibration.txt`: `python -m training.calibration`.

Training pairs drawn from the corpus (a seed of their own, never held-out questions), each in the prompt format the
model answers, one text a line (their line breaks become spaces), so quantising needs no data set from a hub.
"""

from __future__ import annotations

from model.gptq import CALIBRATION_FILE
from model.prompting import format_prompt
from training.corpus import training_examples

COUNT = 64
SEED = 2026


def calibration_lines() -> list[str]:
    return [
        " ".join(f"{format_prompt(example.question)} {example.answer}".split())
        for example in training_examples(COUNT, seed=SEED)
    ]


def main() -> None:
    CALIBRATION_FILE.write_text("\n".join(calibration_lines()) + "\n", encoding="utf-8")
    print(f"wrote {COUNT} calibration texts to {CALIBRATION_FILE}")


if __name__ == "__main__":
    main()
