"""What may enter the engine: every request checked here, before it crosses the pipe.

A request is tokenised and checked with the engine's own `RequestBuilder`, so a bad prompt is a `ValueError` at
once; then the limits (all requests to this engine pass through this client): one session's queue, everyone's, and
how many shared batchers may be busy at once.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import cache

from transformers import PreTrainedTokenizerBase

from batching.engine.builder import RequestBuilder
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams
from batching.service.handles import EngineDeadError, QueueFullError, Session, Submitted
from batching.service.lifecycle import EngineLifecycle
from batching.service.messages import Submit
from batching.service.routing import Router
from config.settings import LimitSettings


class Admission:
    """Checks and admits requests to the shared batchers of `lifecycle`'s engine, recording them in `router`."""

    def __init__(
        self,
        lifecycle: EngineLifecycle,
        router: Router,
        tokenizer: PreTrainedTokenizerBase,
        limits: LimitSettings,
    ) -> None:
        self.lifecycle = lifecycle
        self.router = router
        self.tokenizer = tokenizer
        self.limits = limits
        self.builder = cache(self._builder)

    def _builder(self, options: BatcherOptions) -> RequestBuilder:
        """What a batcher with `options` accepts (the engine's own checks, run here)."""
        return self.lifecycle.info.geometry.request_builder(self.tokenizer, options)

    def submit(self, session: Session, prompt: str | Sequence[int], params: RequestParams) -> Submitted:
        """Check and send a request; raises ValueError (bad input), QueueFullError (limits) or EngineDeadError."""
        self.lifecycle.ensure_running()
        session.last_seen = time.monotonic()
        request = self.builder(session.options).build(prompt, params, session.next_request_id())
        rid = request.request_id
        with self.lifecycle.send_lock:  # bookkeeping and sending in one order, so a cancel never overtakes its submit
            with self.router.lock:
                self._check(session)
                self.router.record(session, rid)
            try:
                self.lifecycle.send_unlocked(Submit(session.options, request))
            except EngineDeadError:
                self.router.forget(session, rid)
                raise
        return Submitted(rid, request.times.arrival, tuple(request.prompt_ids), params)

    def _check(self, session: Session) -> None:
        """Raise QueueFullError or ValueError if `session` may not add a request now (the caller holds the
        router's lock)."""
        if session.closed:
            raise ValueError("this session is closed (it went silent): open a new one")
        in_flight = self.router.owner
        limits = self.limits
        if len(in_flight) >= limits.max_queue_total:
            raise QueueFullError(
                f"the engine is full: {len(in_flight)} requests are queued or running for everyone "
                f"(max_queue_total={limits.max_queue_total}); try again in a moment"
            )
        if len(session.pending) >= session.max_queue:
            raise QueueFullError(
                f"you already have {len(session.pending)} requests queued or running, the most one person may "
                f"have (max_queue_per_session={session.max_queue}): wait for some to finish"
            )
        busy = {owner.pending[rid] for rid, owner in in_flight.items()}  # shared batchers with requests in flight
        most = self.lifecycle.config.engine.max_shared_batchers
        if session.options not in busy and len(busy) >= most:
            raise QueueFullError(
                f"all {most} shared batchers (max_shared_batchers={most}) are busy with other batch sizes or policies: "
                "pick one in use, or try again when one is free"
            )
