"""The client of the engine process: starts it, and hands out sessions, private batchers and races.

One client per server process (the page keeps it in `st.cache_resource`; every tab is a `Session` of it). It is
made of one part per job:

- `lifecycle`: the process (start, death, restart) and the two pipes to it;
- `router`: who waits for what, and the routing of the engine's outputs to them;
- `admission`: the checks and limits on every request to a shared batcher;
- `private`: private batchers and races.

What is left here is the sessions' own life: opening, closing, and the reaper thread that drops sessions (and
races) that stopped polling, cancelling their requests.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from transformers import PreTrainedTokenizerBase

from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams
from batching.service.admission import Admission
from batching.service.handles import BatcherLoad, Session, Submitted
from batching.service.lifecycle import EngineLifecycle
from batching.service.messages import Cancel, EngineConfig, EngineInfo
from batching.service.private import PrivateRuns
from batching.service.routing import Router
from config.settings import LimitSettings, Settings
from model.loader import ModelLoadError, load_tokenizer, remember_hub_failure, remembered_hub_failure, resolve_source

logger = logging.getLogger(__name__)

REAP_EVERY_S = 0.25


def engine_options(settings: Settings, batch_size: int | None = None, policy: str | None = None) -> BatcherOptions:
    """The shared batcher for a batch size and policy (default: the settings'). The page and the API both ask here,
    so a tab and the API choosing the same ones share one batch."""
    slots = batch_size or settings.batching.max_batch_size
    return BatcherOptions(
        max_batch_size=slots,
        max_batched_tokens=max(settings.batching.max_batched_tokens, slots + 1),
        policy=policy or settings.batching.policy,
        admission=settings.batching.admission,
        max_seq_len=settings.batching.max_seq_len,
        max_prompt_tokens=settings.tokenizer.max_prompt_tokens,
        compile_steps=settings.engine.compile_steps,
        compile_autotune=settings.engine.compile_autotune,
        compile_prompt_steps=settings.engine.compile_prompt_steps,
        cuda_graphs=settings.engine.cuda_graphs,
        block_size=settings.batching.block_size,
        kv_cache_tokens=None if settings.batching.kv_cache_mb else settings.batching.kv_cache_tokens,
        kv_cache_mb=settings.batching.kv_cache_mb,
        prefix_caching=settings.batching.prefix_caching,
    )


class EngineClient:
    """Starts the engine process for `config` and is every caller's way to it (thread-safe). `on_give_up` hears
    when the engine was restarted too often and is no longer restarted (`EngineLifecycle`)."""

    def __init__(
        self,
        config: EngineConfig,
        limits: LimitSettings | None = None,
        on_give_up: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        source = resolve_source(config.model.name_or_path)  # a missing folder fails here, before any process starts
        remembered = remembered_hub_failure(config.model)  # an unreachable hub is not tried again by every tab
        if remembered is not None:
            raise remembered
        self.router = Router()
        try:
            self.lifecycle = EngineLifecycle(config, self.router, on_give_up)
        except ModelLoadError as error:
            remember_hub_failure(config.model, error)
            raise
        self.tokenizer: PreTrainedTokenizerBase = load_tokenizer(source, config.model, config.tokenizer)
        self.admission = Admission(self.lifecycle, self.router, self.tokenizer, limits or LimitSettings())
        self.private = PrivateRuns(self.lifecycle, self.router, self.admission)
        threading.Thread(target=self._reap_loop, name="batchscope-reaper", daemon=True).start()

    # --- the process (`lifecycle`: its state, `ensure_running`, `stats`) -------------------------------------------
    @property
    def info(self) -> EngineInfo:
        """What the engine serves (every view and the API read it)."""
        return self.lifecycle.info

    def close(self) -> None:
        """Stop the engine process (also done at interpreter exit)."""
        self.lifecycle.close()

    # --- sessions on the shared batchers --------------------------------------------------------------------
    def open_session(self, options: BatcherOptions, max_queue: int | None = None) -> Session:
        """A client's handle on the shared batcher for `options`; `max_queue` replaces the per-session limit (the
        API is one session serving many people, held by the total limit alone)."""
        max_queue = max_queue or self.admission.limits.max_queue_per_session
        session = Session(self, self.router.new_id("s"), options, max_queue)
        self.router.add(session)
        return session

    def submit(self, session: Session, prompt: str | Sequence[int], params: RequestParams) -> Submitted:
        return self.admission.submit(session, prompt, params)

    def close_session(self, session: Session) -> None:
        self.cancel(self.router.close_session(session))

    def cancel_all(self, session: Session) -> None:
        self.cancel(self.router.pending(session))

    def cancel(self, request_ids: Sequence[str]) -> None:
        if request_ids:  # a dead engine's requests have ended with an error already
            self.lifecycle.send_if_alive(Cancel(tuple(request_ids)))

    def load(self, options: BatcherOptions) -> BatcherLoad:
        """What the shared batcher for `options` holds now, from its latest step and the requests still pending."""
        return self.router.load(options, self.admission.builder(options).kv_tokens or 0)

    # --- the reaper ------------------------------------------------------------------------------------------
    def _reap_loop(self) -> None:
        while not self.lifecycle.stopping.is_set():
            time.sleep(REAP_EVERY_S)
            self.reap()

    def reap(self) -> int:
        """Drop sessions and races silent for `session_timeout_s`, cancelling their requests; returns how many."""
        if not self.lifecycle.alive:  # while the engine restarts, no one can poll
            return 0
        gone, races = self.router.silent_since(time.monotonic() - self.config.engine.session_timeout_s)
        for session in gone:
            if session.pending:
                logger.info("session %s went away; cancelling %d requests", session.session_id, len(session.pending))
            self.close_session(session)
        for race in races:
            logger.info("race %s went unwatched; closing it", race.race_id)
            race.close()
        return len(gone) + len(races)
