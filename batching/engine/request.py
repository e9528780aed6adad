"""One request's state: what was asked, what has been generated, and when each thing happened."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from batching.engine.params import RequestParams


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


@dataclass
class RequestTimes:
    """Clock readings (the batcher's clock, seconds) of the moments a request passed through."""

    arrival: float
    admitted: float | None = None
    first_token: float | None = None
    finished: float | None = None


@dataclass(eq=False)
class Request:
    """A prompt (already tokenised) to continue as `params` says.

    `slot` is the place in the batch the request holds from admission to release (what the page shows); the KV
    cache keeps its keys and values in a *row* that may move (see `kv_cache`), so the two are different numbers.
    """

    request_id: str
    prompt_ids: list[int]
    params: RequestParams
    times: RequestTimes = field(default_factory=lambda: RequestTimes(arrival=time.perf_counter()))
    state: RequestState = RequestState.WAITING
    output_ids: list[int] = field(default_factory=list)
    output_text: str = ""
    prefilled: int = 0  # tokens of `prefill_ids` whose keys and values are in the cache
    recomputed: int = 0  # output tokens folded back into the prompt by the last preemption (computed again)
    preemptions: int = 0
    cached_tokens: int = 0  # prompt tokens its first admission found in the prefix cache
    slot: int | None = None
    finish_reason: FinishReason | None = None
    error: str | None = None

    @property
    def max_new_tokens(self) -> int:
        return self.params.max_new_tokens

    @property
    def is_finished(self) -> bool:
        return self.state is RequestState.FINISHED

    @property
    def prefill_ids(self) -> list[int]:
        """What a prefill computes: the prompt, and after a preemption the tokens generated before it too."""
        return self.prompt_ids + self.output_ids[: self.recomputed] if self.recomputed else self.prompt_ids

    @property
    def remaining_prefill(self) -> int:
        return len(self.prompt_ids) + self.recomputed - self.prefilled

    def preempt(self) -> None:
        """Back to waiting with no cache: its tokens so far become the prompt it computes again when it returns."""
        self.state = RequestState.WAITING
        self.prefilled = 0
        self.recomputed = len(self.output_ids)
        self.preemptions += 1
        self.slot = None

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids
