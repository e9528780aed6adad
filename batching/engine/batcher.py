"""The batcher: submission and cancellation, and the step loop that runs what its scheduler decides.

`step()` is schedule (make room in KV memory, admit, pick each row's tokens) -> run -> postprocess (sample, finish)
-> collect (free the slots the scheduler lets go, the step's event). Everything but the scheduler (the model runner,
its paged cache and block pool, sampling, finishing, events) is the same for continuous and static batching, so a
comparison measures scheduling alone, on the same KV memory.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from batching.engine.blocks import BlockPool
from batching.engine.detokenizer import IncrementalDetokenizer, decode_text
from batching.engine.events import (
    Event,
    FinishedEvent,
    MemoryView,
    PreemptedEvent,
    StepEvent,
    StepRow,
    TokenEvent,
    Waiting,
)
from batching.engine.geometry import PoolGeometry
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams
from batching.engine.request import FinishReason, Request, RequestState
from batching.engine.runner import ModelRunner
from batching.engine.sampling import RequestSampler, greedy_tokens, sampler_for
from batching.engine.scheduler import ContinuousScheduler, ScheduledBatch, Scheduler, StaticScheduler

logger = logging.getLogger(__name__)

Clock = Callable[[], float]  # seconds; a batcher, a run and its arrivals read the same one
Mode = Literal["continuous", "static"]  # the two lanes every comparison runs: the names are defined here only
MODES: tuple[Mode, ...] = get_args(Mode)


@dataclass(frozen=True)
class _Layout:
    """What a step's event says about the batch as scheduled, read before the step moves its requests on."""

    slots: tuple[str | None, ...]  # the request in each slot
    held: tuple[str, ...]  # finished, still holding their slot (a static wave)
    prefill: int
    decode: int
    rows: tuple[StepRow, ...]
    waiting: tuple[Waiting, ...]


def eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """The ids that end a request: the generation config's EOS (one or several), else the tokenizer's."""
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return frozenset()
    return frozenset([eos] if isinstance(eos, int) else eos)


class Batcher:
    """Continuous or static batching of one model. Drive it with `step()` or iterate `run()`.

    `submit` and `cancel` may be called from any thread; `step` from one thread at a time.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        options: BatcherOptions | None = None,
        mode: str = "continuous",
        clock: Clock = time.perf_counter,
    ) -> None:
        options = options or BatcherOptions()
        self.options = options
        self.model = model
        self.tokenizer = tokenizer
        self.clock = clock
        self.geometry = PoolGeometry.of(model)
        self.builder = self.geometry.request_builder(tokenizer, options)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        pad_token_id = int(pad or 0)
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} is not allowed: choose one of {', '.join(MODES)}")
        self.mode = mode
        context = self.builder.context_length
        # A static wave's rows also hold left padding (up to the longest prompt); positions never pass the context.
        padding_room = self.builder.max_prompt_tokens if mode == "static" else 0
        self.state_bytes_per_request = self.geometry.state_bytes_per_request  # 0 unless a hybrid keeps states
        # A hybrid's states cannot be cut at a block boundary: its prefixes are never shared.
        prefix_caching = options.prefix_caching and mode == "continuous" and not self.state_bytes_per_request
        self.pool = BlockPool(self.geometry.pool_blocks(options), options.block_size, prefix_caching)
        self.scheduler: Scheduler
        if mode == "continuous":
            self.scheduler = ContinuousScheduler(
                options.max_batched_tokens, self.pool, options.policy, options.admission
            )
        else:
            self.scheduler = StaticScheduler(pad_token_id, self.pool)
        self.preemptions = 0
        self.runner = ModelRunner(
            model,
            capacity=options.max_batch_size,
            max_len=context + padding_room,
            pad_token_id=pad_token_id,
            pool=self.pool,
            max_position=context - 1,
            compile_steps=options.compile_steps,
            compile_autotune=options.compile_autotune,
            compile_prompt_steps=options.compile_prompt_steps,
            cuda_graphs=options.cuda_graphs,
        )
        self.runner.describe_masks = options.step_detail
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.slots: list[Request | None] = [None] * options.max_batch_size
        self.running: dict[str, Request] = {}
        self.step_index = 0
        self._inbox: deque[Request] = deque()
        self._cancels: deque[str] = deque()
        self._lock = threading.Lock()
        self._detokenizers: dict[str, IncrementalDetokenizer] = {}
        self._samplers: dict[str, RequestSampler | None] = {}

    @property
    def max_batch_size(self) -> int:
        return self.options.max_batch_size

    # --- submission (any thread) -------------------------------------------------------------------------
    def make_request(
        self, prompt: str | Sequence[int], params: RequestParams, request_id: str | None = None
    ) -> Request:
        """Validate and tokenise; raises `ValueError` naming the bad value."""
        return self.builder.build(prompt, params, request_id)

    def submit(self, request: Request) -> Request:
        """Queue a request; it joins at the start of the next step. Raises `ValueError` (nothing queued) for one
        that could never fit this batcher's context or pool, whoever built it."""
        self.builder.check(len(request.prompt_ids), request.params.max_new_tokens)
        with self._lock:
            self._inbox.append(request)
        return request

    def add(self, prompt: str | Sequence[int], params: RequestParams, request_id: str | None = None) -> Request:
        """Build and submit in one call."""
        return self.submit(self.make_request(prompt, params, request_id))

    def cancel(self, request_id: str) -> None:
        """Cancel a waiting or running request; it finishes with reason `cancelled` at the next step."""
        with self._lock:
            self._cancels.append(request_id)

    # --- the loop -------------------------------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        return bool(self._inbox or self._cancels or len(self.scheduler.waiting) or self.running)

    def run(self) -> Iterator[Event]:
        """Step until every submitted request has finished, yielding events as they happen."""
        while self.has_work:
            yield from self.step()

    def step(self) -> list[Event]:
        """One forward pass over the rows the scheduler picks: schedule, run, postprocess, collect."""
        events = self._take_inbox()
        rows = [self.running[rid] for rid in self.runner.row_owners()]
        for request in self.scheduler.make_room(rows):
            self._preempt(request, events)
        self._admit(events)
        if not any(not request.is_finished for request in self.running.values()):
            self._release(self.scheduler.leaving(list(self.running.values())))
            return events
        batch = self.scheduler.schedule([self.running[rid] for rid in self.runner.row_owners()])
        layout = self._layout(batch)  # read now: the step moves its requests on
        start = self.clock()
        logits = self._forward(batch, events)
        if logits is not None:
            self._commit_blocks(batch)
            self._postprocess(batch, logits, events)
        self._release(self.scheduler.leaving(list(self.running.values())))
        if logits is not None:
            events.append(self._step_event(layout, start=start, end=self.clock()))
            self.step_index += 1
        return events

    # --- the parts of a step ------------------------------------------------------------------------------------
    def _layout(self, batch: ScheduledBatch) -> _Layout:
        occupants = tuple(request.request_id if request else None for request in self.slots)
        prefill, decode = batch.work()
        return _Layout(
            slots=occupants,
            held=tuple(rid for rid in occupants if rid is not None and self.running[rid].is_finished),
            prefill=prefill,
            decode=decode,
            rows=batch.rows() if self.options.step_detail else (),
            waiting=self.scheduler.waiting_now(batch),
        )

    def _step_event(self, layout: _Layout, *, start: float, end: float) -> StepEvent:
        return StepEvent(
            index=self.step_index,
            start=start,
            end=end,
            slots=layout.slots,
            prefill_tokens=layout.prefill,
            decode_tokens=layout.decode,
            idle_held=layout.held,
            rows=layout.rows,
            token_budget=self.options.max_batched_tokens,
            mask=self.runner.last_mask,  # None without step detail
            path=self.runner.last_path,
            memory=self.memory_view(),
            waiting=layout.waiting,
        )

    def memory_view(self) -> MemoryView:
        """The block pool now (with each running request's table when the batcher records step detail)."""
        pool = self.pool
        detail = self.options.step_detail
        tables = tuple((rid, tuple(pool.tables.get(rid, ()))) for rid in self.running) if detail else ()
        return MemoryView(
            block_size=pool.block_size,
            usage=pool.usage(),
            tokens=self._real_positions() - pool.held_twice(),
            tables=tables,
            preemptions=self.preemptions,
            prefix_queries=pool.prefix_queries,
            prefix_hits=pool.prefix_hits,
            state_bytes_per_request=self.state_bytes_per_request,
            state_bytes=self.state_bytes_per_request * self.runner.cache.active_rows,
        )

    def _real_positions(self) -> int:
        """Cache positions of running requests holding a real token: not a static wave's left padding, nor the
        padding a finished member computes while it holds its slot."""
        cache, total = self.runner.cache, 0
        for row, owner in enumerate(cache.owners()):
            request = self.running.get(owner) if owner is not None else None
            real = cache.lengths[row] - cache.padding[row]
            if request is not None and request.is_finished:
                real = min(real, len(request.prompt_ids) + max(len(request.output_ids) - 1, 0))
            total += real
        return total

    def _take_inbox(self) -> list[Event]:
        """New requests join the waiting queue; cancelled ones finish."""
        events: list[Event] = []
        with self._lock:
            arrivals, self._inbox = list(self._inbox), deque()
            cancels, self._cancels = list(self._cancels), deque()
        for request in arrivals:
            self.scheduler.waiting.push(request)
        for request_id in cancels:
            waiting = self.scheduler.waiting.remove(request_id)
            if waiting is not None:
                self._finish(waiting, FinishReason.CANCELLED, events)
            elif request_id in self.running and not self.running[request_id].is_finished:
                self._finish(self.running[request_id], FinishReason.CANCELLED, events)
        return events

    def _admit(self, events: list[Event]) -> None:
        """Give the requests the scheduler admits a slot and a cache row (a prefix hit's blocks are theirs already).

        A request whose parameters cannot be honoured (its sampler cannot be made) finishes alone with an error,
        giving its slot and blocks back; the others admitted beside it go on."""
        free = [slot for slot, occupant in enumerate(self.slots) if occupant is None]
        for request, slot in self.scheduler.admit(free, list(self.running.values())):
            self.runner.claim(request.request_id, request.prefilled)
            request.slot = slot
            request.state = RequestState.PREFILLING
            self.slots[slot] = request
            self.running[request.request_id] = request
            if request.times.admitted is None:  # first admission (not a return after a preemption)
                request.times.admitted = self.clock()
                request.cached_tokens = request.prefilled
                try:
                    self._samplers[request.request_id] = sampler_for(request, self.runner.device)
                    detokenizer = IncrementalDetokenizer(self.tokenizer, request.prompt_ids)
                    self._detokenizers[request.request_id] = detokenizer
                except Exception as exc:
                    logger.warning("request %s failed at admission: %s", request.request_id, exc)
                    self._finish(request, FinishReason.ERROR, events, f"{type(exc).__name__}: {exc}")

    def _preempt(self, request: Request, events: list[Event]) -> None:
        """A running request the scheduler preempted (its blocks are free): back to the front of the queue."""
        slot = request.slot
        self.runner.release(request.request_id)
        if slot is not None:
            self.slots[slot] = None
        del self.running[request.request_id]
        request.preempt()
        self.scheduler.waiting.push_front(request)
        self.preemptions += 1
        events.append(PreemptedEvent(request.request_id, self.clock(), request.remaining_prefill, slot))

    def _commit_blocks(self, batch: ScheduledBatch) -> None:
        """Hash the blocks this step filled, for later prefix hits (a no-op without prefix caching)."""
        pool, lengths = self.pool, self.runner.cache.lengths
        if not pool.prefix_caching:
            return
        for row, request in enumerate(batch.requests):
            if pool.needs_commit(request.request_id, lengths[row]):
                pool.commit(request.request_id, request.all_ids, lengths[row])

    def _forward(self, batch: ScheduledBatch, events: list[Event]) -> torch.Tensor | None:
        """The model's forward pass; if it fails, no row can be blamed alone, so the requests with tokens in this
        step fail (their cache rows may hold part of the step's writes) and the rows that waited go on."""
        try:
            return self.runner.forward(batch.tokens, batch.padding)
        except Exception as exc:
            logger.exception("forward pass failed")
            for row, request in enumerate(batch.requests):
                if batch.tokens[row] and not request.is_finished:
                    self._finish(request, FinishReason.ERROR, events, f"forward pass failed: {exc}")
            return None

    def _postprocess(self, batch: ScheduledBatch, logits: torch.Tensor, events: list[Event]) -> None:
        """Advance each row by what it computed; rows that completed a token get one sampled."""
        ready: list[tuple[int, Request]] = []
        for row, request in enumerate(batch.requests):
            if request.is_finished or not batch.tokens[row]:
                continue
            if request.state is RequestState.PREFILLING:
                request.prefilled += batch.real_tokens(row)
                if request.remaining_prefill == 0:
                    request.state = RequestState.DECODING
                    ready.append((row, request))
            else:
                ready.append((row, request))
        if not ready:
            return
        greedy = self.runner.last_greedy if self.runner.last_greedy is not None else greedy_tokens(logits)
        now = self.clock()
        for row, request in ready:
            try:  # one bad request ends alone; the others go on
                greedy_token = greedy[row]
                if greedy_token is None:
                    raise FloatingPointError("the model produced NaN or infinite logits")
                sampler = self._samplers[request.request_id]
                token = greedy_token if sampler is None else sampler.choose(logits[row], request.all_ids)
                self._accept(request, token, now, events)
            except Exception as exc:
                logger.warning("request %s failed: %s", request.request_id, exc)
                self._finish(request, FinishReason.ERROR, events, f"{type(exc).__name__}: {exc}")

    def _accept(self, request: Request, token: int, now: float, events: list[Event]) -> None:
        request.output_ids.append(token)
        if request.times.first_token is None:
            request.times.first_token = now
        text = self._detokenizers[request.request_id].push(token)
        request.output_text += text
        events.append(TokenEvent(request.request_id, token, text, len(request.output_ids) - 1, now))
        params = request.params
        if token in self.eos_ids and not params.ignore_eos:
            self._finish(request, FinishReason.EOS, events)
        elif len(request.output_ids) >= params.max_new_tokens:
            self._finish(request, FinishReason.LENGTH, events)
        elif params.stop_strings and _hit_stop(request, len(text)):
            self._finish(request, FinishReason.STOP, events)

    def _finish(self, request: Request, reason: FinishReason, events: list[Event], error: str | None = None) -> None:
        request.state = RequestState.FINISHED
        request.finish_reason = reason
        request.error = error
        times = request.times
        times.finished = self.clock()
        if request.output_ids:
            # The whole decode is the final word (the stream holds back a trailing incomplete character).
            request.output_text = decode_text(self.tokenizer, request.output_ids)
        self._detokenizers.pop(request.request_id, None)
        self._samplers.pop(request.request_id, None)
        if request.request_id in self.running and not self.scheduler.holds_finished:
            self._release([request])
        events.append(
            FinishedEvent(
                request_id=request.request_id,
                reason=reason,
                output_ids=tuple(request.output_ids),
                text=request.output_text,
                prompt_tokens=len(request.prompt_ids),
                arrival=times.arrival,
                admitted=times.admitted,
                first_token=times.first_token,
                finished=times.finished,
                slot=request.slot,
                error=error,
                cached_tokens=request.cached_tokens,
                preemptions=request.preemptions,
            )
        )

    def _release(self, requests: Iterable[Request]) -> None:
        """Free finished requests' slots and cache rows."""
        for request in requests:
            self.runner.release(request.request_id)
            self.scheduler.forget(request)
            if request.slot is not None:
                self.slots[request.slot] = None
            del self.running[request.request_id]


def _hit_stop(request: Request, new_chars: int) -> bool:
    stops = request.params.stop_strings
    tail = request.output_text[-(max(len(stop) for stop in stops) + new_chars) :]
    return any(stop in tail for stop in stops)
