"""Plain events the batchers emit; the page, the benchmark and the tests consume the same stream."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

from batching.engine.blocks import PoolUsage
from batching.engine.mask_view import StepMask
from batching.engine.request import FinishReason

# How a step ran: eager; through a compiled graph, by `torch.compile`'s entry; or its graph called directly
# (`direct_call`, or on a GPU its CUDA graph replayed). The API counts steps by it (`engine_steps_total{path}`).
StepPath = Literal["eager", "compiled", "direct"]


@dataclass(frozen=True)
class TokenEvent:
    """A request produced one token; `text` is what it adds to the decoded answer (may be empty mid-character)."""

    request_id: str
    token_id: int
    text: str
    index: int
    time: float


@dataclass(frozen=True)
class FinishedEvent:
    """A request left the engine, for good."""

    request_id: str
    reason: FinishReason
    output_ids: tuple[int, ...]
    text: str
    prompt_tokens: int
    arrival: float
    admitted: float | None
    first_token: float | None
    finished: float
    slot: int | None
    error: str | None = None
    cached_tokens: int = 0  # prompt tokens found in the prefix cache when it was first admitted (not computed)
    preemptions: int = 0  # times it was preempted and its tokens computed again

    @property
    def output_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def e2e_s(self) -> float:
        return self.finished - self.arrival

    @property
    def queue_s(self) -> float | None:
        return None if self.admitted is None else self.admitted - self.arrival

    @property
    def tpot_s(self) -> float | None:
        if self.first_token is None or self.output_tokens < 2:
            return None
        return (self.finished - self.first_token) / (self.output_tokens - 1)


@dataclass(frozen=True)
class PreemptedEvent:
    """A running request gave its KV blocks back because a running request needed one and none was free: it waits
    again, and its `recompute` tokens so far (prompt and answer) are computed again when it returns."""

    request_id: str
    time: float
    recompute: int
    slot: int | None


@dataclass(frozen=True)
class MemoryView:
    """The KV block pool after a step: its blocks by state, the positions holding tokens, and (with step detail)
    each running request's block table."""

    block_size: int
    usage: PoolUsage
    tokens: int  # positions holding a real token (a shared block's once; no static padding)
    tables: tuple[tuple[str, tuple[int, ...]], ...] = ()
    preemptions: int = 0  # so far, this batcher
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache so far
    prefix_hits: int = 0  # of those, found cached
    state_bytes_per_request: int = 0  # a hybrid model's conv and SSM states, held beside the blocks by each request
    state_bytes: int = 0  # those of the requests holding a cache row now

    @property
    def reserved(self) -> int:
        """Positions held by requests (whole blocks), whether or not a token is in them yet."""
        return self.usage.in_use * self.block_size


class RowKind(enum.Enum):
    """What one row of a forward pass did."""

    PREFILL = "prefill"  # a chunk of its prompt (the whole prompt for static batching, left-padded)
    DECODE = "decode"  # one new token
    WAITING = "waiting"  # admitted, but this step's token budget left nothing for its prompt
    HELD = "held"  # finished, still holding its slot in a static wave: computes one padding token


@dataclass(frozen=True)
class StepRow:
    """One row of a step's forward pass, as the runner ran it: which request, in which slot, which tokens.

    `token_ids` are the real tokens the row added (padding excluded), at positions `first_position`, +1, ...;
    `padding` counts the padding tokens computed ahead of them (static waves) or instead of them (held slots).
    """

    request_id: str
    slot: int
    kind: RowKind
    token_ids: tuple[int, ...]
    first_position: int
    padding: int = 0

    @property
    def tokens(self) -> int:
        return len(self.token_ids)


class WaitReason(enum.Enum):
    """Why a request that is in the batcher computed nothing in a step (what vLLM's scheduler decides, named)."""

    NO_SLOT = "no free slot"  # every slot is taken (vLLM's max_num_seqs)
    TOKEN_BUDGET = "token budget spent"  # admitted, but the step's tokens went to others (max_num_batched_tokens)
    NO_BLOCKS = "no free blocks"  # its first chunk's KV blocks are not free (or a preemption this step)
    PREFIX_PENDING = "prefix being computed"  # another request computes its next prompt block now: it joins after
    PREEMPTED = "preempted"  # gave its blocks back; its tokens so far are computed again when it returns
    WAVE = "static wave running"  # static batching: the next wave forms only once every member of this one is done


@dataclass(frozen=True)
class Waiting:
    """One request that computed nothing in a step, and why. `recompute`: for a preempted one, the tokens (prompt and
    answer so far) it computes again when it returns."""

    request_id: str
    reason: WaitReason
    recompute: int = 0


@dataclass(frozen=True)
class StepEvent:
    """One engine step (one forward pass): who sat in each slot, and how many tokens of each kind it computed.

    `slots[k]` is the id of the request in slot k, or None when the slot was idle. A static wave's finished
    members still hold their slot (computing padding) until the wave ends: they are listed in `idle_held`.
    `rows` says what each row computed (the packed batch, in order); the step inspector and waste meters read it.
    `mask` describes the attention masks the runner built for it (its rows with new tokens, in the same order).
    """

    index: int
    start: float
    end: float
    slots: tuple[str | None, ...]
    prefill_tokens: int
    decode_tokens: int
    idle_held: tuple[str, ...] = ()
    rows: tuple[StepRow, ...] = ()  # in packed order; empty when the batcher does not record them
    token_budget: int = 0  # the scheduler's max tokens per step (0: unknown)
    mask: StepMask | None = None  # None when the batcher does not record step detail
    path: StepPath = "eager"  # how it ran: eager, through a compiled graph, or its graph called directly
    memory: MemoryView | None = None  # the block pool after the step
    waiting: tuple[Waiting, ...] = ()  # every request in the batcher that computed nothing this step, and why

    @property
    def compiled(self) -> bool:
        """Whether a compiled graph answered the step (through `torch.compile`'s entry or called directly)."""
        return self.path != "eager"

    @property
    def active(self) -> int:
        """Requests that did useful work this step."""
        return sum(1 for request_id in self.slots if request_id is not None) - len(self.idle_held)


Event = TokenEvent | FinishedEvent | StepEvent | PreemptedEvent
