"""Iteration-level scheduling: a finished request frees its slot, and a waiting one takes it on the next step.

Prompts are prefilled in chunks under a per-step token budget, in the same forward pass as the other rows'
decode steps, so a long prompt never stalls the requests already streaming.
"""

from __future__ import annotations

from batching.engine import Batcher
from batching.request import RequestState


class ContinuousBatcher(Batcher):
    """Up to `max_batch_size` requests at once; admission order from the policy (fcfs, shortest- or longest-first)."""

    mode = "continuous"

    def _admit(self) -> None:
        for slot, occupant in enumerate(self.slots):
            if occupant is not None:
                continue
            request = self.waiting.pop()
            if request is None:
                return
            self._start(request, slot)

    def _plan(self) -> tuple[list[list[int]], None]:
        cache = self.runner.cache
        budget = self.max_batched_tokens
        row_tokens: list[list[int]] = []
        prefilling: list[tuple[float, int]] = []
        for row in range(cache.active_rows):
            request = self.running[cache.owner_of(row)]
            if request.state is RequestState.DECODING:
                row_tokens.append([request.output_ids[-1]])
                budget -= 1
            else:
                row_tokens.append([])
                prefilling.append((request.metrics.admitted or 0.0, row))
        # Decode rows always run; what the budget has left goes to prompt chunks, earliest admitted first.
        for _, row in sorted(prefilling):
            if budget <= 0:
                break
            request = self.running[cache.owner_of(row)]
            chunk = min(request.remaining_prefill, budget)
            row_tokens[row] = request.prompt_ids[request.prefilled : request.prefilled + chunk]
            budget -= chunk
        return row_tokens, None

    def _after_step(self) -> None:
        """Nothing to do: finished requests already gave their slot back."""
