"""Reference workloads (in `reference_workloads/` beside this file), and loading a workload from a JSON or CSV file.

`share-nothing.json` is `share_nothing_workload()` as `workload_json` writes it (a test keeps the two equal; the
command that writes it is in docs/benchmarks.md).
"""

from __future__ import annotations

import csv
import json
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from batching.arrivals import Schedule
from batching.engine.builder import RequestBuilder
from batching.engine.params import RequestParams

WORKLOAD_DIR = Path(__file__).resolve().parent / "reference_workloads"
RANDOM_NAME = "random"
SHARE_NOTHING_NAME = "share-nothing"
DISTRIBUTIONS = ("uniform", "exponential", "lognormal")
# The vocabulary of random prompts: shop words, so the embedded model sees familiar tokens.
_WORDS = tuple(
    """order shipping return refund colour size price discount code delivery address parcel warranty account
    password invoice store stock item jacket shoe shirt hoodie phone laptop battery screen cable charger gift
    wrap sale week city today tomorrow please thanks help change cancel track update check available quickly
    blue red black white green small large medium fast slow new old best cheap premium express standard""".split()  # noqa: SIM905
)


@dataclass(frozen=True)
class WorkloadRequest:
    """One queued prompt; a missing cap means "the default cap" (the model's EOS decides the length)."""

    prompt: str
    max_new_tokens: int | None = None
    arrival_s: float | None = None
    arrival_step: int | None = None


@dataclass(frozen=True)
class Workload:
    name: str
    requests: tuple[WorkloadRequest, ...]
    batch_size: int = 8
    source: str = ""
    # Prompts sent as they are, without the Q/A template (whose system prompt every prompt would share): the
    # benchmark's `--raw-prompts` for this workload alone.
    raw_prompts: bool = False

    def schedule(self, rate_per_s: float | None = None, seed: int = 0) -> Schedule:
        """Poisson when a rate is given; else the requests' `arrival_step`s, else their `arrival_s`, else at once.

        A request without a step (or time) in a workload that gives them to others arrives at step 0 (time 0).
        """
        requests = self.requests
        if rate_per_s is not None:
            return Schedule.poisson(len(requests), rate_per_s, seed)
        if any(request.arrival_step is not None for request in requests):
            return Schedule.per_step([request.arrival_step or 0 for request in requests])
        if any(request.arrival_s is not None for request in requests):
            return Schedule.timed([request.arrival_s or 0.0 for request in requests])
        return Schedule.at_once(len(requests))


def builtin_workload_names() -> list[str]:
    return sorted(path.stem for path in WORKLOAD_DIR.glob("*.json"))


def load_workload(name_or_path: str) -> Workload:
    """A built-in workload by name, `random` (the seeded default), or a JSON/CSV file with `prompt`,
    `max_new_tokens`, optional `arrival_s` / `arrival_step`."""
    if name_or_path == RANDOM_NAME:
        return random_workload()
    builtin = WORKLOAD_DIR / f"{name_or_path}.json"
    if builtin.is_file():
        return _from_json(builtin)
    path = Path(name_or_path)
    if not path.is_file():
        raise ValueError(
            f"workload {name_or_path!r} is neither a built-in ({', '.join([*builtin_workload_names(), RANDOM_NAME])}) "
            "nor a file"
        )
    if path.suffix.lower() == ".csv":
        return _from_csv(path)
    if path.suffix.lower() == ".json":
        return _from_json(path)
    raise ValueError(f"workload file {path} is not allowed: use a .json or .csv file")


Number = TypeVar("Number", int, float)


def _request(raw: dict, where: str) -> WorkloadRequest:
    prompt = raw.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f"{where}: prompt is missing or empty")

    def number(key: str, kind: type[Number], minimum: float) -> Number | None:
        value = raw.get(key)
        if value in (None, ""):
            return None
        try:
            parsed = kind(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: {key}={value!r} is not a {kind.__name__}") from None
        if kind is int and float(value) != parsed:
            raise ValueError(f"{where}: {key}={value!r} is not a whole number")
        if parsed < minimum:
            raise ValueError(f"{where}: {key}={value!r} is not allowed: must be >= {minimum}")
        return parsed

    return WorkloadRequest(
        prompt=prompt,
        max_new_tokens=number("max_new_tokens", int, 1),
        arrival_s=number("arrival_s", float, 0),
        arrival_step=number("arrival_step", int, 0),
    )


def _from_json(path: Path) -> Workload:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"workload file {path} is not valid JSON: {exc}") from None
    raw_requests = data.get("requests") if isinstance(data, dict) else data
    if not isinstance(raw_requests, list) or not raw_requests:
        raise ValueError(f"workload file {path}: expected a non-empty list of requests (or {{'requests': [...]}})")
    requests = tuple(
        _request(raw if isinstance(raw, dict) else {}, f"{path.name} request {i}") for i, raw in enumerate(raw_requests)
    )
    meta = data if isinstance(data, dict) else {}
    batch_size = meta.get("batch_size", 8)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"workload file {path}: batch_size={batch_size!r} must be a whole number >= 1")
    raw_prompts = meta.get("raw_prompts", False)
    if not isinstance(raw_prompts, bool):
        raise ValueError(f"workload file {path}: raw_prompts={raw_prompts!r} must be true or false")
    return Workload(
        name=str(meta.get("name", path.stem)),
        requests=requests,
        batch_size=batch_size,
        source=str(meta.get("source", "")),
        raw_prompts=raw_prompts,
    )


def workload_json(workload: Workload) -> dict:
    """A workload as its JSON file holds it (what `load_workload` reads back)."""
    requests = [
        {key: value for key, value in vars(request).items() if value is not None} for request in workload.requests
    ]
    data: dict = {"name": workload.name, "batch_size": workload.batch_size, "source": workload.source}
    if workload.raw_prompts:
        data["raw_prompts"] = True
    return {**data, "requests": requests}


def _from_csv(path: Path) -> Workload:
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ValueError(f"workload file {path} is not valid CSV: {exc}") from None
    if not rows or "prompt" not in rows[0]:
        raise ValueError(f"workload file {path}: expected a header with a 'prompt' column and at least one row")
    requests = tuple(_request(row, f"{path.name} row {i + 2}") for i, row in enumerate(rows))
    return Workload(name=path.stem, requests=requests)


@dataclass(frozen=True)
class LengthRange:
    """A length drawn from `distribution` and kept within [low, high].

    uniform: every length equally likely; exponential: mostly short with a long tail (mean a quarter of the way
    up); lognormal: median at the geometric mean of the bounds, about 95% of draws inside them before clipping.
    """

    low: int
    high: int
    distribution: str = "uniform"

    def __post_init__(self) -> None:
        if not 1 <= self.low <= self.high:
            raise ValueError(f"length range {self.low}:{self.high} is not allowed: need 1 <= low <= high")
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(
                f"distribution {self.distribution!r} is not allowed: choose one of {', '.join(DISTRIBUTIONS)}"
            )

    @classmethod
    def parse(cls, text: str, distribution: str = "uniform") -> LengthRange:
        """`LOW:HIGH` (or a single number for a fixed length)."""
        low, _, high = text.partition(":")
        try:
            bounds = (int(low), int(high or low))
        except ValueError:
            raise ValueError(f"length range {text!r} is not allowed: write LOW:HIGH, e.g. 8:64") from None
        return cls(*bounds, distribution)

    def draw(self, rng: random.Random) -> int:
        if self.distribution == "uniform":
            value = rng.uniform(self.low, self.high + 1)
        elif self.distribution == "exponential":
            value = self.low + rng.expovariate(4 / max(self.high - self.low, 1))
        else:
            mu = (math.log(self.low) + math.log(self.high)) / 2
            sigma = max((math.log(self.high) - math.log(self.low)) / 4, 1e-9)
            value = rng.lognormvariate(mu, sigma)
        return min(self.high, max(self.low, int(value)))


def random_workload(
    requests: int = 32,
    prompt_words: LengthRange = LengthRange(4, 40),
    max_new_tokens: LengthRange = LengthRange(8, 256, "exponential"),
    batch_size: int = 8,
    seed: int = 0,
) -> Workload:
    """A seeded synthetic workload: prompts of random words, caps from a length distribution; same seed, same list."""
    if requests < 1:
        raise ValueError(f"requests={requests} is not allowed: must be >= 1")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} is not allowed: must be >= 1")
    items = _random_requests(requests, prompt_words, max_new_tokens, seed)
    return Workload(
        name=RANDOM_NAME,
        requests=items,
        batch_size=batch_size,
        source=f"seeded synthetic (seed {seed}): {_described(requests, prompt_words, max_new_tokens)}",
    )


def share_nothing_workload(
    requests: int = 32,
    prompt_words: LengthRange = LengthRange(22, 350, "lognormal"),
    max_new_tokens: LengthRange = LengthRange(16, 256, "lognormal"),
    batch_size: int = 8,
    seed: int = 0,
) -> Workload:
    """Prompts that share no prefix, sent without the template, so prefix caching cannot hide prefill (seed-lab's
    prompts are equal, seed-blog's one growing history, and every templated prompt starts with the system prompt).
    Lengths and caps are drawn as a chat trace's are, lognormal: prompts of about 30 to 480 tokens of the embedded
    model (1.37 a word), most near 120; caps of 16 to 256, most near 64. Seeded: same seed, same list."""
    if requests < 1:
        raise ValueError(f"requests={requests} is not allowed: must be >= 1")
    return Workload(
        name=SHARE_NOTHING_NAME,
        requests=_random_requests(requests, prompt_words, max_new_tokens, seed),
        batch_size=batch_size,
        source=f"prompts sharing no prefix, untemplated (seed {seed}): "
        f"{_described(requests, prompt_words, max_new_tokens)}",
        raw_prompts=True,
    )


def _random_requests(
    requests: int, prompt_words: LengthRange, max_new_tokens: LengthRange, seed: int
) -> tuple[WorkloadRequest, ...]:
    """Prompts of random shop words, caps from a length distribution, drawn in turn from one seeded generator."""
    rng = random.Random(seed)
    items = []
    for _ in range(requests):
        words = [rng.choice(_WORDS) for _ in range(prompt_words.draw(rng))]
        prompt = " ".join(words).capitalize() + "?"
        items.append(WorkloadRequest(prompt=prompt, max_new_tokens=max_new_tokens.draw(rng)))
    return tuple(items)


def _described(requests: int, prompt_words: LengthRange, max_new_tokens: LengthRange) -> str:
    return (
        f"{requests} requests, prompt words {prompt_words.low}:{prompt_words.high} {prompt_words.distribution}, "
        f"caps {max_new_tokens.low}:{max_new_tokens.high} {max_new_tokens.distribution}"
    )


class RefusedRequest(ValueError):
    """The engine would refuse request `index` of a list; `reason` says why."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"request {index}: {reason}")
        self.index = index
        self.reason = reason


def encode_requests(
    builder: RequestBuilder, requests: Iterable[tuple[str, int]]
) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """Each (text, cap) as the engine takes it: its prompt's token ids, checked as the engine checks them, and its
    cap; RefusedRequest for the first the engine would refuse."""
    ids, caps = [], []
    for index, (text, cap) in enumerate(requests):
        try:
            request = builder.build(text, RequestParams(cap))
        except ValueError as exc:
            raise RefusedRequest(index, str(exc)) from None
        ids.append(tuple(request.prompt_ids))
        caps.append(cap)
    return tuple(ids), tuple(caps)
