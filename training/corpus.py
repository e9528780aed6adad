"""A seeded generator of customer-support Q/A pairs for an online shop: the embedded model's training data.

What the shop knows lives in `intents.json` beside this file (read here, and so by `training.train`): each
intent's training phrasings and held-out phrasings (never used for training), the slot values (products, colours,
order numbers) and an answer whose length is set on purpose: one short sentence for the return policy, several
paragraphs for the latest smartphone. That spread is what makes requests finish at different times in the app.
This module only draws from it: which template, which slot values, how a question is decorated.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

INTENTS_FILE = Path(__file__).resolve().parent / "intents.json"

# The customer-support workload of the app: always held out from training.
WORKLOAD_QUERIES = (
    "How do I track my order?",
    "What's your return policy?",
    "Is this product available in red?",
    "Explain the features of the latest smartphone model.",
    "How long does shipping take?",
    "I received a damaged item. What should I do?",
    "Are there any ongoing sales?",
    "How do I change my delivery address?",
    "Do you offer gift wrapping?",
    "What are your best-selling items this week?",
    "How do I apply a discount code?",
)

# The workload query that names slot values: its held-out template and the values that give it.
_WORKLOAD_SLOTS = {"Is {thing} available in {colour}?": {"thing": "this product", "colour": "red"}}


@dataclass(frozen=True)
class Example:
    """One question and its answer; an on-topic answer names one of `keywords` and, if set, `slot_value`."""

    intent: str
    question: str
    answer: str
    keywords: tuple[str, ...]
    slot_value: str | None = None


Slots = dict[str, str]


@dataclass(frozen=True)
class Intent:
    """What customers ask (train and held-out templates) and how the shop answers."""

    name: str
    train: tuple[str, ...]
    heldout: tuple[str, ...]
    answer: Callable[[Slots], str]
    keywords: tuple[str, ...]
    slot_keyword: str | None = None
    decorate: bool = True
    actions: tuple[str, ...] = ()  # fill the shared how-to frames: "How can I {action}?"
    topics: tuple[str, ...] = ()  # fill the shared topic frames: "Tell me about {topic}."


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _colour_answer(slots: Slots) -> str:
    thing, colour = slots["thing"], slots["colour"]
    if colour in IN_STOCK_COLOURS:
        return (
            f"Yes, {thing} is available in {colour}. Choose {colour} in the colour menu on the product page "
            "before you add it to your cart."
        )
    return (
        f"Sorry, {thing} is sold out in {colour} right now. It is still available in black, white and blue, "
        f"and you can tap Notify me on the product page to get an email when {colour} is back in stock."
    )


def _product_answer(slots: Slots) -> str:
    return PRODUCT_FEATURES[slots["product"]]


# Answers that depend on the slots drawn, named by an intent's `answer_rule` (the others give `answer`, a text).
ANSWER_RULES: dict[str, Callable[[Slots], str]] = {
    "colour_stock": _colour_answer,
    "product_features": _product_answer,
}


def _const(text: str) -> Callable[[Slots], str]:
    return lambda _slots: text


def _intent(entry: dict[str, Any]) -> Intent:
    answer = ANSWER_RULES[entry["answer_rule"]] if "answer_rule" in entry else _const(entry["answer"])
    return Intent(
        entry["name"],
        train=tuple(entry["train"]),
        heldout=tuple(entry["heldout"]),
        answer=answer,
        keywords=tuple(entry["keywords"]),
        slot_keyword=entry.get("slot_keyword"),
        decorate=entry.get("decorate", True),
        actions=tuple(entry.get("actions", ())),
        topics=tuple(entry.get("topics", ())),
    )


_DATA = json.loads(INTENTS_FILE.read_text(encoding="utf-8"))
_VALUES = _DATA["slot_values"]
IN_STOCK_COLOURS: tuple[str, ...] = tuple(_VALUES["in_stock_colours"])
SOLD_OUT_COLOURS: tuple[str, ...] = tuple(_VALUES["sold_out_colours"])
ITEMS: tuple[str, ...] = tuple(_VALUES["items"])
GARMENTS: tuple[str, ...] = tuple(_VALUES["garments"])
CODES: tuple[str, ...] = tuple(_VALUES["codes"])
CITIES: tuple[str, ...] = tuple(_VALUES["cities"])
PRODUCT_FEATURES: dict[str, str] = _DATA["products"]  # product name -> its answer, in the file's order
# Shared frames, filled with an intent's actions or topics; the held-out frames are never trained on.
HOWTO_FRAMES: tuple[str, ...] = tuple(_DATA["frames"]["howto"])
HELDOUT_HOWTO_FRAMES: tuple[str, ...] = tuple(_DATA["frames"]["heldout_howto"])
TOPIC_FRAMES: tuple[str, ...] = tuple(_DATA["frames"]["topic"])
HELDOUT_TOPIC_FRAMES: tuple[str, ...] = tuple(_DATA["frames"]["heldout_topic"])
PREFIXES: tuple[str, ...] = tuple(_DATA["decorations"]["prefixes"])
SUFFIXES: tuple[str, ...] = tuple(_DATA["decorations"]["suffixes"])
INTENTS: tuple[Intent, ...] = tuple(_intent(entry) for entry in _DATA["intents"])


def _framed(frames: tuple[str, ...], field: str, fillers: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(frame.replace("{" + field + "}", filler) for frame in frames for filler in fillers)


def phrasings(intent: Intent, heldout: bool) -> list[tuple[str, ...]]:
    """The intent's question templates, in groups: its own, the how-to frames, the topic frames."""
    own = intent.heldout if heldout else intent.train
    howto = _framed(HELDOUT_HOWTO_FRAMES if heldout else HOWTO_FRAMES, "action", intent.actions)
    topic = _framed(HELDOUT_TOPIC_FRAMES if heldout else TOPIC_FRAMES, "topic", intent.topics)
    return [group for group in (own, howto, topic) if group]


def _slots(rng: random.Random) -> Slots:
    item = rng.choice(ITEMS)
    product = rng.choice(tuple(PRODUCT_FEATURES))
    return {
        "thing": rng.choice(("this product", "this item", f"the {item}", f"the {item}", f"this {item}")),
        "item": item,
        "garment": rng.choice(GARMENTS),
        "colour": rng.choice(IN_STOCK_COLOURS + SOLD_OUT_COLOURS),
        "product": product,
        "product_word": product.split()[0],
        "order": f"#{rng.randint(10000, 99999)}",
        "code": rng.choice(CODES),
        "city": rng.choice(CITIES),
    }


def _decorate(question: str, rng: random.Random) -> str:
    prefix, suffix = rng.choice(PREFIXES), rng.choice(SUFFIXES)
    first_word = question.split()[0]
    if prefix.endswith((", ", ": ")) and first_word not in ("I", "I'm", "I'd", "I've") and question[1:2].islower():
        question = question[0].lower() + question[1:]
    text = prefix + question + suffix
    roll = rng.random()
    if roll < 0.08:
        text = text.lower()
    elif roll < 0.14:
        text = text.rstrip("?.!")
    return text


def _example(intent: Intent, template: str, rng: random.Random, decorate: bool, fixed: Slots | None = None) -> Example:
    slots = _slots(rng) | (fixed or {})
    question = _cap(template.format(**slots))
    answer = _cap(intent.answer(slots))
    slot_value = slots[intent.slot_keyword] if intent.slot_keyword else None
    if decorate and intent.decorate:
        question = _decorate(question, rng)
    return Example(intent.name, question, answer, intent.keywords or (slot_value or "",), slot_value)


def normalize(question: str) -> str:
    """Lower case, letters and digits only: two phrasings that differ only in punctuation are the same."""
    return " ".join(re.sub(r"[^a-z0-9 ]+", " ", question.lower().replace("'", "")).split())


def heldout_examples(per_template: int = 2, seed: int = 1234) -> list[Example]:
    """Held-out phrasings (the app's workload queries among them), asked plainly, for evaluation only.

    Each held-out template of an intent, with `per_template` slot draws, plus one question from a
    held-out how-to frame and one from a held-out topic frame where the intent has those.
    """
    rng = random.Random(seed)
    examples, seen = [], set()
    for intent in INTENTS:
        for template in intent.heldout:
            if template in _WORKLOAD_SLOTS:
                examples.append(_example(intent, template, rng, decorate=False, fixed=_WORKLOAD_SLOTS[template]))
                seen.add(normalize(examples[-1].question))
            copies = per_template if "{" in template else 1
            for _ in range(copies):
                example = _example(intent, template, rng, decorate=False)
                if normalize(example.question) not in seen:
                    seen.add(normalize(example.question))
                    examples.append(example)
        for group in phrasings(intent, heldout=True)[1:]:
            example = _example(intent, rng.choice(group), rng, decorate=False)
            if normalize(example.question) not in seen:
                seen.add(normalize(example.question))
                examples.append(example)
    return examples


def training_examples(count: int, seed: int = 0) -> list[Example]:
    """`count` training pairs: uniform over intents, then over groups of phrasings, then templates.

    A question that contains a held-out phrasing (after normalising) is drawn again, so no held-out
    question is ever seen in training, however it is decorated.
    """
    rng = random.Random(seed)
    held = [f" {normalize(example.question)} " for example in heldout_examples()]
    held += [f" {normalize(query)} " for query in WORKLOAD_QUERIES]
    examples: list[Example] = []
    while len(examples) < count:
        intent = rng.choice(INTENTS)
        group = rng.choice(phrasings(intent, heldout=False))
        example = _example(intent, rng.choice(group), rng, decorate=True)
        padded = f" {normalize(example.question)} "
        if not any(phrase in padded for phrase in held):
            examples.append(example)
    return examples
