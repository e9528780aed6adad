"""Evaluate the embedded model on held-out phrasings (the app's workload among them).

Run `python -m training.evaluate [--model model/builtin]`. It prints how often greedy answers end
with EOS, how often they are on topic (they name a keyword of the question's intent), the mean answer
length per intent, and the held-out answer loss of the trained model next to the same architecture
with random weights. It exits with status 1 when the EOS rate is under 80% or the longest intent's
answers are not at least 4x as long as the shortest's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from model.loader import BUILTIN_MODEL_DIR
from model.prompting import extract_answer, format_prompt
from training.corpus import WORKLOAD_QUERIES, Example, heldout_examples
from training.train import IGNORE, Encoded, build_model, encode

MAX_NEW_TOKENS = 256


@dataclass(frozen=True)
class Answer:
    """A greedy answer to one held-out example, and what the checks need to know about it."""

    example: Example
    text: str
    new_tokens: int
    ended: bool

    @property
    def on_topic(self) -> bool:
        """The answer names a keyword of the question's intent, and the slot value it asked about if any."""
        lowered = self.text.lower()
        slot = self.example.slot_value
        named_slot = slot is None or slot.lower() in lowered
        return named_slot and any(keyword.lower() in lowered for keyword in self.example.keywords)


@torch.inference_mode()
def answer(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, example: Example) -> Answer:
    """Greedy-decode an answer to the formatted question, as the app's reference path does."""
    inputs = tokenizer(format_prompt(example.question), return_tensors="pt")
    output = model.generate(**inputs, do_sample=False, max_new_tokens=MAX_NEW_TOKENS)  # type: ignore[operator]
    new = output[0, inputs["input_ids"].shape[1] :].tolist()
    ended = tokenizer.eos_token_id in new
    if ended:
        new = new[: new.index(tokenizer.eos_token_id)]
    decoded = tokenizer.decode(new, skip_special_tokens=True)
    text = extract_answer(decoded if isinstance(decoded, str) else "".join(decoded))
    return Answer(example, text, len(new), ended)


@torch.inference_mode()
def answer_loss(model: PreTrainedModel, data: Sequence[Encoded]) -> float:
    """Mean cross-entropy per answer token (and EOS), teacher-forced, over the held-out examples."""
    total, count = 0.0, 0
    for item in data:
        input_ids = torch.tensor([item.ids])
        labels = input_ids.clone()
        labels[0, : item.prompt_len] = IGNORE
        tokens = len(item.ids) - item.prompt_len
        total += model(input_ids=input_ids, labels=labels).loss.item() * tokens
        count += tokens
    return total / count


def report(answers: Sequence[Answer]) -> tuple[float, float]:
    """Print the rates and per-intent lengths; return the EOS rate and the longest/shortest length ratio."""
    eos_rate = sum(a.ended for a in answers) / len(answers)
    topic_rate = sum(a.on_topic for a in answers) / len(answers)
    workload = [a for a in answers if a.example.question in WORKLOAD_QUERIES]
    print(f"held-out questions: {len(answers)}")
    print(f"EOS before {MAX_NEW_TOKENS} new tokens: {eos_rate:.1%}   on topic: {topic_rate:.1%}")
    print(
        f"workload queries ({len(workload)}): EOS {sum(a.ended for a in workload)}/{len(workload)}, "
        f"on topic {sum(a.on_topic for a in workload)}/{len(workload)}"
    )
    lengths: dict[str, list[int]] = defaultdict(list)
    for a in answers:
        lengths[a.example.intent].append(a.new_tokens)
    means = sorted((statistics.mean(values), intent) for intent, values in lengths.items())
    print("mean answer length (new tokens) per intent:")
    for mean, intent in means:
        print(f"  {intent:24s} {mean:6.1f}")
    ratio = means[-1][0] / max(means[0][0], 1.0)
    print(f"longest / shortest intent: {means[-1][1]} / {means[0][1]} = {ratio:.1f}x")
    misses = [a for a in answers if not (a.ended and a.on_topic)]
    for a in misses:
        print(f"MISS [{a.example.intent}] {a.example.question!r} -> {a.text[:120]!r}")
    return eos_rate, ratio


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=BUILTIN_MODEL_DIR, help="folder of the model to evaluate")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random-weights baseline")
    parser.add_argument("--samples", type=int, default=4, help="workload answers to print in full")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    examples = heldout_examples()
    data = encode(tokenizer, examples)
    random_model = build_model(tokenizer, args.seed).eval()
    trained_loss, random_loss = answer_loss(model, data), answer_loss(random_model, data)
    print(f"held-out answer loss per token: trained {trained_loss:.3f}, random weights {random_loss:.3f}")
    started = time.perf_counter()
    answers = [answer(model, tokenizer, example) for example in examples]
    print(f"generated {sum(a.new_tokens for a in answers)} tokens in {time.perf_counter() - started:.1f} s")
    eos_rate, ratio = report(answers)
    print("sample answers:")
    for a in [a for a in answers if a.example.question in WORKLOAD_QUERIES][: args.samples]:
        print(f"Q: {a.example.question}\nA: {a.text}\n")
    passed = eos_rate >= 0.8 and ratio >= 4.0
    print("PASS" if passed else "FAIL")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
