"""Who waits, and who gets the next free slot: the admission policies."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from batching.request import Request

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
        self.policy = policy
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

    def requests(self) -> list[Request]:
        """Waiting requests in the order they would be admitted."""
        return [entry[2] for entry in sorted(self._heap) if entry[2].request_id not in self._cancelled]
