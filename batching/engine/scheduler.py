"""Who runs this step: admission into free slots, each row's new tokens, and when a slot is given back.

One scheduler per policy family, composed into the batcher; the batcher runs whatever it decides, so the two
families differ here and nowhere else.

- `ContinuousScheduler`: iteration-level. A finished request frees its slot at once and a waiting one (in policy
  order) takes it on the next step. Decode rows get one token each; what the per-step token budget has left goes
  to prompt chunks, so a long prompt is prefilled over several steps while the others keep decoding.
- `StaticScheduler`: the baseline. Waves of `max_batch_size` in arrival order, prompts left-padded to the
  longest; a finished member keeps its slot (computing padding) until the wave's longest member is done.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from batching.engine.events import RowKind, StepRow
from batching.engine.request import Request, RequestState

POLICIES: dict[str, Callable[[Request], int]] = {
    "fcfs": lambda request: 0,
    "shortest-first": lambda request: request.max_new_tokens,
    "longest-first": lambda request: -request.max_new_tokens,
}


def check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise ValueError(f"policy={policy!r} is not allowed: choose one of {', '.join(POLICIES)}")
    return policy


class WaitingQueue:
    """Requests waiting for a slot, popped in the policy's order (arrival order among equals)."""

    def __init__(self, policy: str = "fcfs") -> None:
        self._key = POLICIES[check_policy(policy)]
        self._heap: list[tuple[int, int, Request]] = []
        self._order = itertools.count()
        self._cancelled: set[str] = set()

    def push(self, request: Request) -> None:
        heapq.heappush(self._heap, (self._key(request), next(self._order), request))

    def pop(self) -> Request | None:
        while self._heap:
            request = heapq.heappop(self._heap)[2]
            if request.request_id in self._cancelled:
                self._cancelled.discard(request.request_id)
                continue
            return request
        return None

    def remove(self, request_id: str) -> Request | None:
        """Take a waiting request out (it was cancelled); None if it is not waiting."""
        for _, _, request in self._heap:
            if request.request_id == request_id and request_id not in self._cancelled:
                self._cancelled.add(request_id)
                return request
        return None

    def __len__(self) -> int:
        return len(self._heap) - len(self._cancelled)

    def fill(self, free_slots: Sequence[int]) -> list[tuple[Request, int]]:
        """Pop one request per free slot, while any wait."""
        admitted = []
        for slot in free_slots:
            request = self.pop()
            if request is None:
                break
            admitted.append((request, slot))
        return admitted


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
    """Up to `max_batch_size` requests at once, admitted in policy order (fcfs, shortest- or longest-first)."""

    mode = "continuous"
    holds_finished = False  # a finished request gives its slot back at once

    def __init__(self, max_batched_tokens: int, policy: str = "fcfs") -> None:
        self.max_batched_tokens = max_batched_tokens
        self.waiting = WaitingQueue(policy)

    def admit(self, free_slots: Sequence[int], running: int) -> list[tuple[Request, int]]:
        """Fill every free slot from the waiting queue."""
        return self.waiting.fill(free_slots)

    def schedule(self, rows: Sequence[Request]) -> ScheduledBatch:
        budget = self.max_batched_tokens
        tokens: list[list[int]] = []
        prefilling: list[tuple[float, int]] = []
        for row, request in enumerate(rows):
            if request.state is RequestState.DECODING:
                tokens.append([request.output_ids[-1]])
                budget -= 1
            else:
                tokens.append([])
                prefilling.append((request.times.admitted or 0.0, row))
        # Decode rows always run; what the budget has left goes to prompt chunks, earliest admitted first.
        for _, row in sorted(prefilling):
            if budget <= 0:
                break
            request = rows[row]
            chunk = min(request.remaining_prefill, budget)
            tokens[row] = request.prompt_ids[request.prefilled : request.prefilled + chunk]
            budget -= chunk
        return ScheduledBatch(tuple(rows), tuple(tokens))

    def leaving(self, running: Sequence[Request]) -> list[Request]:
        """Who gives their slot back after a step: no one, since a finished request left as it finished."""
        return []


class StaticScheduler:
    """Static batching as the original notebooks did it: fixed waves in arrival order."""

    mode = "static"
    holds_finished = True  # a finished member keeps its slot until the whole wave is done

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id
        self.waiting = WaitingQueue("fcfs")  # waves always form in arrival order

    def admit(self, free_slots: Sequence[int], running: int) -> list[tuple[Request, int]]:
        """A new wave only once the last one has left every slot."""
        return [] if running else self.waiting.fill(free_slots)

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


Scheduler = ContinuousScheduler | StaticScheduler
