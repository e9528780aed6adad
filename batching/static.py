"""The baseline: waves of `max_batch_size` requests in arrival order, left-padded, run until the longest is done.

A finished member keeps its slot (computing padding) until the whole wave ends; only then does the next wave
start. Same runner, sampling and events as the continuous batcher: only the scheduling differs.
"""

from __future__ import annotations

from batching.engine import Batcher
from batching.request import Request, RequestState
from batching.scheduler import WaitingQueue


class StaticBatcher(Batcher):
    """Static batching as the original notebooks did it."""

    mode = "static"

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.waiting = WaitingQueue("fcfs")  # waves always form in arrival order

    def _admit(self) -> None:
        if self.running:
            return
        for slot in range(self.max_batch_size):
            request = self.waiting.pop()
            if request is None:
                return
            self._start(request, slot)

    def _plan(self) -> tuple[list[list[int]], list[int] | None]:
        cache = self.runner.cache
        wave = [self.running[cache.owner_of(row)] for row in range(cache.active_rows)]
        if any(request.state is RequestState.PREFILLING for request in wave):
            # The wave's one prefill: prompts left-padded to the longest (a member cancelled already is all padding).
            prompts = [[] if request.is_finished else request.prompt_ids for request in wave]
            longest = max(len(prompt) for prompt in prompts)
            padding = [longest - len(prompt) for prompt in prompts]
            return [[self.pad_token_id] * pad + prompt for pad, prompt in zip(padding, prompts, strict=True)], padding
        return [[self.pad_token_id] if request.is_finished else [request.output_ids[-1]] for request in wave], None

    def _on_finished(self, request: Request) -> None:
        """A finished member holds its slot until the wave ends; a waiting one just leaves."""

    def _after_step(self) -> None:
        if self.running and all(request.is_finished for request in self.running.values()):
            for request in list(self.running.values()):
                self._release(request)
