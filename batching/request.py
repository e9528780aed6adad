"""One request's state: what was asked, what has been generated, and when each thing happened."""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass, field


class RequestState(enum.Enum):
    """Life of a request: waiting -> prefilling -> decoding -> finished."""

    WAITING = "waiting"
    PREFILLING = "prefilling"
    DECODING = "decoding"
    FINISHED = "finished"


class FinishReason(enum.Enum):
    """Why a request stopped generating."""

    EOS = "eos"
    LENGTH = "length"
    STOP = "stop"
    CANCELLED = "cancelled"
    ERROR = "error"


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
            ("seed", self.seed, self.seed >= 0, ">= 0"),
        )
        for name, value, ok, allowed in checks:
            if not ok:
                raise ValueError(f"{name}={value} is not allowed: must be {allowed}")

    @property
    def needs_processing(self) -> bool:
        """Whether logits need more than an argmax."""
        return self.do_sample or self.repetition_penalty != 1.0


@dataclass
class RequestMetrics:
    """Clock readings (time.perf_counter seconds) and counts; the derived latencies are what the charts show."""

    arrival: float
    admitted: float | None = None
    first_token: float | None = None
    finished: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0

    @property
    def queue_s(self) -> float | None:
        """Time waiting for a slot."""
        return None if self.admitted is None else self.admitted - self.arrival

    @property
    def ttft_s(self) -> float | None:
        """Time to first token, from arrival."""
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def e2e_s(self) -> float | None:
        """End-to-end latency, from arrival to the last token."""
        return None if self.finished is None else self.finished - self.arrival

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first."""
        if self.finished is None or self.first_token is None or self.output_tokens < 2:
            return None
        return (self.finished - self.first_token) / (self.output_tokens - 1)


@dataclass(eq=False)
class Request:
    """A prompt (already tokenised) to continue for at most `max_new_tokens` tokens."""

    request_id: str
    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_strings: tuple[str, ...] = ()
    prompt_text: str | None = None
    ignore_eos: bool = False
    arrival: float = field(default_factory=time.perf_counter)
    state: RequestState = RequestState.WAITING
    output_ids: list[int] = field(default_factory=list)
    output_text: str = ""
    prefilled: int = 0
    slot: int | None = None
    finish_reason: FinishReason | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        self.metrics = RequestMetrics(arrival=self.arrival, prompt_tokens=len(self.prompt_ids))

    @property
    def is_finished(self) -> bool:
        return self.state is RequestState.FINISHED

    @property
    def remaining_prefill(self) -> int:
        return len(self.prompt_ids) - self.prefilled

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids
