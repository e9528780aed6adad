"""Who runs this step: admission into free slots, each row's new tokens, and when a slot is given back.

One scheduler per policy family, composed into the batcher; the batcher runs whatever it decides, so the two
families differ here and nowhere else.

- `ContinuousScheduler`: iteration-level. A finished request frees its slot at once and a waiting one (in policy
  order) takes it on the next step. Decode rows get one token each; what the per-step token budget has left goes
  to prompt chunks, so a long prompt is prefilled over several steps while the others keep decoding.
- `StaticScheduler`: the baseline. Waves of `max_batch_size` in arrival order, prompts left-padded to the
  longest; a finished member keeps its slot (computing padding) until the wave's longest member is done.

Both take KV memory from a block pool of the same size. Continuous batching takes blocks as tokens arrive: a
waiting request joins only when its first chunk's blocks are free (after a prefix hit), and when a running request
needs a block and none is left, the newest running request is preempted (vLLM V1's choice: its blocks are freed and
it goes back to the front of the queue, its tokens so far to be computed again). A waiting request whose next
uncached prompt block another request is computing now waits a step and finds it cached (SGLang's in-batch prefix
caching), rather than computing the same prefix beside it. Static batching reserves what
`generate` does: every member of a wave holds room for the wave's longest prompt plus its largest cap from the
start, so a tight pool makes waves smaller than the slot count.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from batching.engine.blocks import BlockHash, BlockPool
from batching.engine.events import RowKind, StepRow, Waiting, WaitReason
from batching.engine.request import Request, RequestState
from config.choices import FCFS, LONGEST_FIRST, PREEMPT, RESERVE, SHORTEST_FIRST

# Waiting requests passed over in one admission because a prompt block of theirs is being computed: bounds the
# scan of a long queue while a long shared prompt is prefilled in chunks (the rest wait their turn in order).
MAX_DEFERRED = 16

POLICIES: dict[str, Callable[[Request], int]] = {
    FCFS: lambda request: 0,
    SHORTEST_FIRST: lambda request: request.max_new_tokens,
    LONGEST_FIRST: lambda request: -request.max_new_tokens,
}


# How continuous batching takes KV blocks. "preempt": a request is admitted when its first chunk's blocks are free and
# takes more as its tokens arrive; when a running one needs a block and none is free, the newest is preempted
# (vLLM). "reserve": a request is admitted only when blocks for its whole prompt and cap are free, reserved at once,
# so no request is ever preempted (TensorRT-LLM's guaranteed-no-evict): fewer rows at once, no work done twice.
ADMISSIONS = {
    PREEMPT: "admit by what the prompt needs, preempt the newest when blocks run out (vLLM)",
    RESERVE: "reserve prompt + cap at admission, never preempt (TensorRT-LLM's guaranteed-no-evict)",
}


def check_admission(admission: str) -> str:
    if admission not in ADMISSIONS:
        raise ValueError(f"admission={admission!r} is not allowed: choose one of {', '.join(ADMISSIONS)}")
    return admission


def check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise ValueError(f"policy={policy!r} is not allowed: choose one of {', '.join(POLICIES)}")
    return policy


class WaitingQueue:
    """Requests waiting for a slot, popped in the policy's order (arrival order among equals)."""

    def __init__(self, policy: str = FCFS) -> None:
        self._key = POLICIES[check_policy(policy)]
        self._heap: list[tuple[int, int, int, Request]] = []  # (0 pushed to the front, 1 not, key, order, _)
        self._order = itertools.count()
        self._cancelled: set[str] = set()

    def push(self, request: Request) -> None:
        heapq.heappush(self._heap, (1, self._key(request), next(self._order), request))

    def push_front(self, request: Request) -> None:
        """Put a request back at the head of the queue (it was preempted, or did not fit): it goes first."""
        heapq.heappush(self._heap, (0, 0, -next(self._order), request))

    def pop(self) -> Request | None:
        while self._heap:
            request = heapq.heappop(self._heap)[3]
            if request.request_id in self._cancelled:
                self._cancelled.discard(request.request_id)
                continue
            return request
        return None

    def remove(self, request_id: str) -> Request | None:
        """Take a waiting request out (it was cancelled); None if it is not waiting."""
        for *_, request in self._heap:
            if request.request_id == request_id and request_id not in self._cancelled:
                self._cancelled.add(request_id)
                return request
        return None

    def __len__(self) -> int:
        return len(self._heap) - len(self._cancelled)

    def __iter__(self) -> Iterator[Request]:
        """The waiting requests, in no particular order (the heap's)."""
        return (entry[3] for entry in self._heap if entry[3].request_id not in self._cancelled)


def waiting_reasons(
    waiting: WaitingQueue, reasons: dict[str, WaitReason], otherwise: WaitReason
) -> tuple[Waiting, ...]:
    """Why each waiting request was not admitted this step: its own reason if the admission looked at it, else why the
    admission stopped before it (`otherwise`); a preempted request waits as preempted, with its tokens to compute."""
    described = []
    for request in waiting:
        if request.preemptions:
            described.append(Waiting(request.request_id, WaitReason.PREEMPTED, request.remaining_prefill))
        else:
            described.append(Waiting(request.request_id, reasons.get(request.request_id, otherwise)))
    return tuple(described)


@dataclass(frozen=True)
class ScheduledBatch:
    """One step's work, row by row in cache order: the request in each row and the new tokens it computes.

    `padding[r]` > 0 says the first tokens of row r are left padding (a static wave's prefill): computed, but not
    work. A row with no tokens waits this step (its prompt chunk did not fit the budget).
    """

    requests: tuple[Request, ...]
    tokens: tuple[list[int], ...]
    padding: tuple[int, ...] | None = None

    def real_tokens(self, row: int) -> int:
        return len(self.tokens[row]) - (self.padding[row] if self.padding else 0)

    def rows(self) -> tuple[StepRow, ...]:
        """What each row computes, for the step event (read before the step changes the requests' states)."""
        described = []
        for row, request in enumerate(self.requests):
            tokens = self.tokens[row]
            padding = self.padding[row] if self.padding else 0
            real: tuple[int, ...] = ()
            if request.is_finished:
                kind, first = RowKind.HELD, len(request.all_ids)
                padding = len(tokens)
            elif request.state is RequestState.DECODING:
                kind, real, first = RowKind.DECODE, tuple(tokens), len(request.all_ids) - 1
            else:
                kind = RowKind.PREFILL if tokens else RowKind.WAITING
                real, first = tuple(tokens[padding:]), request.prefilled
            described.append(StepRow(request.request_id, request.slot or 0, kind, real, first, padding))
        return tuple(described)

    def work(self) -> tuple[int, int]:
        """(prompt tokens, decode tokens) computed for live requests this step."""
        prefill = decode = 0
        for row, request in enumerate(self.requests):
            if request.state is RequestState.PREFILLING:
                prefill += self.real_tokens(row)
            elif request.state is RequestState.DECODING:
                decode += len(self.tokens[row])
        return prefill, decode


class ContinuousScheduler:
    """Up to `max_batch_size` requests at once, admitted in policy order (fcfs, shortest- or longest-first) while
    their blocks fit, preempting the newest when a running one needs a block and none is left."""

    mode = "continuous"
    holds_finished = False  # a finished request gives its slot back at once

    def __init__(self, max_batched_tokens: int, pool: BlockPool, policy: str = FCFS, admission: str = PREEMPT) -> None:
        self.max_batched_tokens = max_batched_tokens
        self.pool = pool
        self.waiting = WaitingQueue(policy)
        self.reserve = check_admission(admission) == RESERVE
        self._reasons: dict[str, WaitReason] = {}  # this step's reason for each request the admission looked at
        self._stalled = WaitReason.NO_SLOT  # why this step's admission stopped (the reason of those it did not reach)
        self._joined = itertools.count()
        self._order: dict[str, int] = {}  # running requests' admission order: the newest is preempted first
        self._prompt_blocks: dict[str, list[BlockHash]] = {}  # running requests' full prompt blocks, by hash
        self._preempted_now = False

    def make_room(self, rows: Sequence[Request]) -> list[Request]:
        """Make sure every running request can add a token this step, oldest first: while one cannot, the newest
        running request is preempted (perhaps itself). Returns the preempted, their blocks already freed."""
        pool, preempted = self.pool, []
        live = sorted((r for r in rows if not r.is_finished), key=lambda r: self._order.get(r.request_id, 0))
        while live:
            request = live.pop(0)
            # Taken now, so the next request's check counts it (a decode step's block; a chunk's first).
            while not pool.grow(request.request_id, self._computed(request) + 1) and live:
                preempted.append(self._preempt(live.pop()))
            if pool.missing(request.request_id, self._computed(request) + 1):
                preempted.append(self._preempt(request))  # it alone cannot go on: it waits for room
        self._preempted_now = bool(preempted)
        return preempted

    def admit(self, free_slots: Sequence[int], running: Sequence[Request]) -> list[tuple[Request, int]]:
        """Fill free slots from the waiting queue while each one's first chunk fits in free blocks (after its
        cached prefix); none after a preemption this step, as vLLM does. A request whose next uncached prompt block
        a prefilling request computes (one admitted now, or earlier and still prefilling) keeps its place at the head
        of the queue and lets the next ones in: it joins once that block is cached, so requests arriving together
        with a shared prefix compute it once (SGLang's in-batch prefix caching; what it gained: docs/benchmarks.md).
        """
        self._reasons = {}
        if self._preempted_now or not free_slots or not len(self.waiting):  # every step asks: most have no one to admit
            self._stalled = WaitReason.NO_BLOCKS if self._preempted_now else WaitReason.NO_SLOT
            return []
        self._stalled = WaitReason.NO_SLOT
        budget = self.max_batched_tokens - sum(self._wants(request) for request in running)
        computing = self._blocks_being_computed(running)
        admitted: list[tuple[Request, int]] = []
        deferred: list[Request] = []
        slots = list(free_slots)
        while slots:
            request = self.waiting.pop()
            if request is None:
                break
            ids = request.prefill_ids
            if computing and self.pool.first_uncached(ids) in computing:
                deferred.append(request)
                self._reasons[request.request_id] = WaitReason.PREFIX_PENDING
                if len(deferred) == MAX_DEFERRED:
                    self._stalled = WaitReason.PREFIX_PENDING  # the rest queue behind those
                    break
                continue
            cached = self.pool.adopt_prefix(request.request_id, ids)
            first_chunk = min(len(ids) - cached, max(budget, 1))
            reach = len(request.prompt_ids) + request.max_new_tokens if self.reserve else cached + first_chunk
            if not self.pool.grow(request.request_id, reach):
                self.pool.free(request.request_id)  # its prefix's blocks go back to the cache
                self.waiting.push_front(request)
                self._stalled = WaitReason.NO_BLOCKS  # it, and those queued behind it
                break
            request.prefilled = cached
            if not request.preemptions:  # a return after a preemption is not a new query
                self.pool.count_query(len(ids), cached)
            budget -= first_chunk
            self._order[request.request_id] = next(self._joined)
            self._prompt_blocks[request.request_id] = hashes = self.pool.block_hashes(ids)
            computing.update(hashes)
            admitted.append((request, slots.pop(0)))
        for request in reversed(deferred):  # back at the head, in their order
            self.waiting.push_front(request)
        return admitted

    def _blocks_being_computed(self, running: Sequence[Request]) -> set[BlockHash]:
        """The prompt blocks of the requests still prefilling (the cached ones among them match nothing: a
        request's first uncached block is looked up)."""
        computing: set[BlockHash] = set()
        for request in running:
            if request.state is RequestState.PREFILLING:
                computing.update(self._prompt_blocks.get(request.request_id, ()))
        return computing

    def schedule(self, rows: Sequence[Request]) -> ScheduledBatch:
        """Decode rows one token each; what the budget has left goes to prompt chunks, earliest admitted first, as
        far as free blocks go."""
        budget, pool = self.max_batched_tokens, self.pool
        tokens: list[list[int]] = []
        prefilling: list[tuple[int, int]] = []
        for row, request in enumerate(rows):
            if request.state is RequestState.DECODING:
                tokens.append([request.output_ids[-1]])  # its block was taken by `make_room`
                budget -= 1
            else:
                tokens.append([])
                prefilling.append((self._order.get(request.request_id, 0), row))
        for _, row in sorted(prefilling):
            request = rows[row]
            if budget <= 0:
                self._reasons[request.request_id] = WaitReason.TOKEN_BUDGET
                continue
            room = (len(pool.tables.get(request.request_id, ())) + pool.available) * pool.block_size
            chunk = min(request.remaining_prefill, budget, room - request.prefilled)
            if chunk <= 0:
                self._reasons[request.request_id] = WaitReason.NO_BLOCKS
                continue
            pool.grow(request.request_id, request.prefilled + chunk)
            tokens[row] = request.prefill_ids[request.prefilled : request.prefilled + chunk]
            budget -= chunk
        return ScheduledBatch(tuple(rows), tuple(tokens))

    def leaving(self, running: Sequence[Request]) -> list[Request]:
        """Who gives their slot back after a step: no one, since a finished request left as it finished."""
        return []

    def waiting_now(self, batch: ScheduledBatch) -> tuple[Waiting, ...]:
        """Every request that computes nothing in `batch`, and why: its admitted rows whose chunk did not fit, then
        the queue."""
        stalled = tuple(
            Waiting(request.request_id, self._reasons[request.request_id])
            for row, request in enumerate(batch.requests)
            if not batch.tokens[row] and not request.is_finished and request.request_id in self._reasons
        )
        return stalled + waiting_reasons(self.waiting, self._reasons, self._stalled)

    def forget(self, request: Request) -> None:
        """The request left (finished or preempted)."""
        self._order.pop(request.request_id, None)
        self._prompt_blocks.pop(request.request_id, None)

    def _preempt(self, request: Request) -> Request:
        self.pool.free(request.request_id)
        self.forget(request)
        return request

    def _wants(self, request: Request) -> int:
        """Tokens of this step's budget a running request will take (decode: one; prefill: its next chunk)."""
        if request.is_finished:
            return 0
        return 1 if request.state is RequestState.DECODING else min(request.remaining_prefill, self.max_batched_tokens)

    @staticmethod
    def _computed(request: Request) -> int:
        """Positions of the request's cache in use (a decode step then writes its last token's)."""
        return len(request.all_ids) - 1 if request.state is RequestState.DECODING else request.prefilled


class StaticScheduler:
    """Static batching as the original notebooks did it: fixed waves in arrival order, each member reserving the
    wave's longest prompt plus its largest cap in blocks, as `generate` preallocates its cache."""

    mode = "static"
    holds_finished = True  # a finished member keeps its slot until the whole wave is done

    def __init__(self, pad_token_id: int, pool: BlockPool) -> None:
        self.pad_token_id = pad_token_id
        self.pool = pool
        self.waiting = WaitingQueue(FCFS)  # waves always form in arrival order
        self._stalled = WaitReason.WAVE  # why this step's admission left the queue waiting

    def make_room(self, rows: Sequence[Request]) -> list[Request]:
        """Nothing to do: a wave's blocks were all reserved when it formed."""
        return []

    def admit(self, free_slots: Sequence[int], running: Sequence[Request]) -> list[tuple[Request, int]]:
        """A new wave only once the last one has left every slot: members in arrival order while every member's
        reservation (the wave's longest prompt + its largest cap, then held until the wave ends) fits the pool."""
        self._stalled = WaitReason.WAVE
        if running:
            return []
        wave: list[tuple[Request, int]] = []
        longest = largest = 0
        self._stalled = WaitReason.NO_SLOT  # unless the pool stops the wave first
        for slot in free_slots:
            request = self.waiting.pop()
            if request is None:
                break
            reach = max(longest, len(request.prompt_ids)) + max(largest, request.max_new_tokens)
            if wave and self.pool.blocks_for(reach) * (len(wave) + 1) > self.pool.available:
                self.waiting.push_front(request)
                self._stalled = WaitReason.NO_BLOCKS
                break
            longest, largest = max(longest, len(request.prompt_ids)), max(largest, request.max_new_tokens)
            wave.append((request, slot))
        for request, _ in wave:
            # Always room: the wave's first member alone fits a whole pool (every request was checked against it).
            if not self.pool.grow(request.request_id, longest + largest):
                raise AssertionError(
                    f"static wave member {request.request_id} cannot reserve {longest + largest} positions: "
                    f"{self.pool.available} blocks of {self.pool.block_size} free"
                )
        return wave

    def schedule(self, rows: Sequence[Request]) -> ScheduledBatch:
        pad = self.pad_token_id
        if any(request.state is RequestState.PREFILLING for request in rows):
            # The wave's one prefill: prompts left-padded to the longest (a member cancelled already is all padding).
            prompts = [[] if request.is_finished else request.prompt_ids for request in rows]
            longest = max(len(prompt) for prompt in prompts)
            padding = tuple(longest - len(prompt) for prompt in prompts)
            tokens = tuple([pad] * count + prompt for count, prompt in zip(padding, prompts, strict=True))
            return ScheduledBatch(tuple(rows), tokens, padding)
        return ScheduledBatch(tuple(rows), tuple([pad] if r.is_finished else [r.output_ids[-1]] for r in rows))

    def leaving(self, running: Sequence[Request]) -> list[Request]:
        """Who gives their slot back after a step: the whole wave, once every member is done."""
        wave_over = bool(running) and all(request.is_finished for request in running)
        return list(running) if wave_over else []

    def waiting_now(self, batch: ScheduledBatch) -> tuple[Waiting, ...]:
        """Every request that computes nothing in `batch` (a wave's rows always compute), and why."""
        return waiting_reasons(self.waiting, {}, self._stalled)

    def forget(self, request: Request) -> None:
        """The request left."""


Scheduler = ContinuousScheduler | StaticScheduler
