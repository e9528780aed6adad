"""What a request asks for: how tokens are chosen, how many, and what ends it. Passed by name everywhere."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# The largest seed: torch.Generator.manual_seed takes any integer below 2**64, but a seed travels through JSON
# clients and other engines as a signed 64-bit integer (vLLM's API bounds it to int64, torch.long), so it is capped
# there, where it is parsed, never left to fail inside a step.
MAX_SEED = 2**63 - 1


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. Greedy unless `do_sample`; the seed makes sampling reproducible per request."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        checks = (
            ("temperature", self.temperature, self.temperature > 0 and math.isfinite(self.temperature), "> 0"),
            ("top_k", self.top_k, self.top_k >= 0, ">= 0 (0 keeps every token)"),
            ("top_p", self.top_p, 0 < self.top_p <= 1, "in (0, 1]"),
            (
                "repetition_penalty",
                self.repetition_penalty,
                self.repetition_penalty > 0 and math.isfinite(self.repetition_penalty),
                "> 0",
            ),
            ("seed", self.seed, _whole(self.seed) and 0 <= self.seed <= MAX_SEED, "a whole number in [0, 2**63 - 1]"),
        )
        for name, value, ok, allowed in checks:
            if not ok:
                raise ValueError(f"{name}={value} is not allowed: must be {allowed}")

    @property
    def needs_processing(self) -> bool:
        """Whether logits need more than an argmax."""
        return self.do_sample or self.repetition_penalty != 1.0


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class RequestParams:
    """One request's options: its cap, sampling, stop strings, and whether EOS may end it."""

    max_new_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_strings: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        cap = self.max_new_tokens
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise ValueError(f"max_new_tokens={cap!r} is not allowed: must be a whole number >= 1")
        stops = self.stop_strings
        if isinstance(stops, str) or any(not isinstance(stop, str) or not stop for stop in stops):
            raise ValueError(f"stop_strings={stops!r} is not allowed: each must be a non-empty string")
        object.__setattr__(self, "stop_strings", tuple(stops))
