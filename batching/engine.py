"""What both batchers share: submission and cancellation, the step loop, sampling, finishing, and events.

A batcher only decides which rows run and with which tokens (`_admit`, `_plan`, `_after_step`); everything
else, including the model runner, is the same for both, so a comparison measures scheduling alone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from batching.builder import RequestBuilder
from batching.detokenizer import IncrementalDetokenizer
from batching.events import Event, FinishedEvent, StepEvent, TokenEvent
from batching.request import FinishReason, Request, RequestState, SamplingParams
from batching.runner import ModelRunner
from batching.sampling import RequestSampler, finite_rows, greedy_tokens, sampler_for
from batching.scheduler import WaitingQueue, check_policy
from model.loader import model_context_length

logger = logging.getLogger(__name__)

Clock = Callable[[], float]


def eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """The ids that end a request: the generation config's EOS (one or several), else the tokenizer's."""
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return frozenset()
    return frozenset([eos] if isinstance(eos, int) else eos)


class Batcher:
    """Base of the continuous and static batchers. Drive it with `step()` or iterate `run()`.

    `submit` and `cancel` may be called from any thread; `step` from one thread at a time.
    """

    mode = "base"

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        max_batch_size: int = 8,
        max_batched_tokens: int = 512,
        policy: str = "fcfs",
        max_seq_len: int = 2048,
        max_prompt_tokens: int = 512,
        clock: Clock = time.perf_counter,
    ) -> None:
        if not 1 <= max_batch_size <= 1024:
            raise ValueError(f"max_batch_size={max_batch_size} is not allowed: must be in [1, 1024]")
        if max_batched_tokens <= max_batch_size:
            raise ValueError(
                f"max_batched_tokens={max_batched_tokens} is not allowed: must exceed max_batch_size="
                f"{max_batch_size}, so prompts still get prefilled while every slot decodes"
            )
        context = min(model_context_length(model), max_seq_len)
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.max_batched_tokens = max_batched_tokens
        self.policy = check_policy(policy)
        self.clock = clock
        self.builder = RequestBuilder(tokenizer, context, max_prompt_tokens)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_token_id = int(pad or 0)
        self.runner = ModelRunner(model, capacity=max_batch_size, max_len=context, pad_token_id=self.pad_token_id)
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.waiting = WaitingQueue(policy)
        self.slots: list[Request | None] = [None] * max_batch_size
        self.running: dict[str, Request] = {}
        self.step_index = 0
        self._inbox: deque[Request] = deque()
        self._cancels: deque[str] = deque()
        self._lock = threading.Lock()
        self._detokenizers: dict[str, IncrementalDetokenizer] = {}
        self._samplers: dict[str, RequestSampler | None] = {}

    # --- submission (any thread) -------------------------------------------------------------------------
    def make_request(
        self,
        prompt: str | Sequence[int],
        max_new_tokens: int,
        sampling: SamplingParams | None = None,
        stop_strings: Sequence[str] = (),
        request_id: str | None = None,
        ignore_eos: bool = False,
    ) -> Request:
        """Validate and tokenise; raises `ValueError` naming the bad value."""
        return self.builder.build(prompt, max_new_tokens, sampling, stop_strings, request_id, ignore_eos)

    def submit(self, request: Request) -> Request:
        """Queue a request; it joins at the start of the next step."""
        with self._lock:
            self._inbox.append(request)
        return request

    def add(self, prompt: str | Sequence[int], max_new_tokens: int, **options: object) -> Request:
        """Build and submit in one call."""
        return self.submit(self.make_request(prompt, max_new_tokens, **options))

    def cancel(self, request_id: str) -> None:
        """Cancel a waiting or running request; it finishes with reason `cancelled` at the next step."""
        with self._lock:
            self._cancels.append(request_id)

    # --- the loop -------------------------------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        return bool(self._inbox or self._cancels or len(self.waiting) or self.running)

    def run(self) -> Iterator[Event]:
        """Step until every submitted request has finished, yielding events as they happen."""
        while self.has_work:
            yield from self.step()

    def step(self) -> list[Event]:
        """Admit, run one forward pass over the rows in use, sample, finish; return what happened."""
        events: list[Event] = []
        self._take_inbox(events)
        self._admit()
        if not self.running:
            return events
        row_tokens, padding = self._plan()
        prefill, decode = self._count_work(row_tokens, padding)
        occupants = tuple(request.request_id if request else None for request in self.slots)
        idle = tuple(rid for rid in occupants if rid is not None and self.running[rid].is_finished)
        start = self.clock()
        try:
            logits = self.runner.forward(row_tokens, padding)
        except Exception as exc:  # a failed forward pass cannot be pinned on one request
            logger.exception("forward pass failed")
            for request in list(self.running.values()):
                if not request.is_finished:
                    self._finish(request, FinishReason.ERROR, events, f"forward pass failed: {exc}")
            self._after_step()
            return events
        self._consume(row_tokens, padding, logits, events)
        self._after_step()
        events.append(
            StepEvent(
                index=self.step_index,
                start=start,
                end=self.clock(),
                slots=occupants,
                prefill_tokens=prefill,
                decode_tokens=decode,
                idle_held=idle,
            )
        )
        self.step_index += 1
        return events

    # --- hooks for the two batchers ----------------------------------------------------------------------
    def _admit(self) -> None:
        raise NotImplementedError

    def _plan(self) -> tuple[list[list[int]], list[int] | None]:
        raise NotImplementedError

    def _after_step(self) -> None:
        raise NotImplementedError

    # --- shared machinery ------------------------------------------------------------------------------------
    def _count_work(self, row_tokens: list[list[int]], padding: list[int] | None) -> tuple[int, int]:
        """Prompt tokens and decode tokens this step computes for live requests (padding is not work)."""
        cache = self.runner.cache
        prefill = decode = 0
        for row, tokens in enumerate(row_tokens):
            request = self.running[cache.owner_of(row)]
            if request.state is RequestState.PREFILLING:
                prefill += len(tokens) - (padding[row] if padding else 0)
            elif request.state is RequestState.DECODING:
                decode += len(tokens)
        return prefill, decode

    def _take_inbox(self, events: list[Event]) -> None:
        with self._lock:
            arrivals, self._inbox = list(self._inbox), deque()
            cancels, self._cancels = list(self._cancels), deque()
        for request in arrivals:
            self.waiting.push(request)
        for request_id in cancels:
            waiting = self.waiting.remove(request_id)
            if waiting is not None:
                self._finish(waiting, FinishReason.CANCELLED, events)
            elif request_id in self.running and not self.running[request_id].is_finished:
                self._finish(self.running[request_id], FinishReason.CANCELLED, events)

    def _start(self, request: Request, slot: int) -> None:
        """Give a waiting request a slot and a cache row."""
        self.runner.cache.claim(request.request_id)
        request.slot = slot
        request.state = RequestState.PREFILLING
        request.metrics.admitted = self.clock()
        self.slots[slot] = request
        self.running[request.request_id] = request
        self._detokenizers[request.request_id] = IncrementalDetokenizer(self.tokenizer, request.prompt_ids)
        self._samplers[request.request_id] = sampler_for(request, self.runner.device)

    def _release(self, request: Request) -> None:
        """Free a finished request's slot and cache row."""
        self.runner.cache.release(request.request_id)
        self.slots[request.slot] = None
        del self.running[request.request_id]

    def _consume(
        self, row_tokens: list[list[int]], padding: list[int] | None, logits: torch.Tensor, events: list[Event]
    ) -> None:
        """Advance each row's request by what it computed; rows that completed a token get one sampled."""
        cache = self.runner.cache
        ready: list[tuple[int, Request]] = []
        for row, tokens in enumerate(row_tokens):
            request = self.running[cache.owner_of(row)]
            if request.is_finished or not tokens:
                continue
            if request.state is RequestState.PREFILLING:
                request.prefilled += len(tokens) - (padding[row] if padding else 0)
                if request.remaining_prefill == 0:
                    request.state = RequestState.DECODING
                    ready.append((row, request))
            else:
                ready.append((row, request))
        if not ready:
            return
        greedy = greedy_tokens(logits)
        finite = finite_rows(logits)
        now = self.clock()
        for row, request in ready:
            try:
                if not finite[row]:
                    raise FloatingPointError("the model produced NaN or infinite logits")
                sampler = self._samplers[request.request_id]
                token = greedy[row] if sampler is None else sampler.choose(logits[row], request.all_ids)
                self._accept(request, token, now, events)
            except Exception as exc:
                logger.warning("request %s failed: %s", request.request_id, exc)
                self._finish(request, FinishReason.ERROR, events, f"{type(exc).__name__}: {exc}")

    def _accept(self, request: Request, token: int, now: float, events: list[Event]) -> None:
        request.output_ids.append(token)
        if request.metrics.first_token is None:
            request.metrics.first_token = now
        text = self._detokenizers[request.request_id].push(token)
        request.output_text += text
        events.append(TokenEvent(request.request_id, token, text, len(request.output_ids) - 1, now))
        if token in self.eos_ids and not request.ignore_eos:
            self._finish(request, FinishReason.EOS, events)
        elif len(request.output_ids) >= request.max_new_tokens:
            self._finish(request, FinishReason.LENGTH, events)
        elif request.stop_strings and _hit_stop(request, len(text)):
            self._finish(request, FinishReason.STOP, events)

    def _finish(self, request: Request, reason: FinishReason, events: list[Event], error: str | None = None) -> None:
        request.state = RequestState.FINISHED
        request.finish_reason = reason
        request.error = error
        request.metrics.finished = self.clock()
        request.metrics.output_tokens = len(request.output_ids)
        if request.output_ids:
            # The whole decode is the final word (the stream holds back a trailing incomplete character).
            request.output_text = self.tokenizer.decode(request.output_ids, skip_special_tokens=True)
        self._detokenizers.pop(request.request_id, None)
        self._samplers.pop(request.request_id, None)
        self._on_finished(request)
        metrics = request.metrics
        events.append(
            FinishedEvent(
                request_id=request.request_id,
                reason=reason,
                output_ids=tuple(request.output_ids),
                text=request.output_text,
                prompt_tokens=len(request.prompt_ids),
                arrival=metrics.arrival,
                admitted=metrics.admitted,
                first_token=metrics.first_token,
                finished=metrics.finished,
                slot=request.slot,
                error=error,
            )
        )

    def _on_finished(self, request: Request) -> None:
        """Continuous batching frees the slot at once; the static baseline overrides this to hold it."""
        if request.request_id in self.running:
            self._release(request)


def _hit_stop(request: Request, new_chars: int) -> bool:
    longest = max(len(stop) for stop in request.stop_strings)
    tail = request.output_text[-(longest + new_chars) :]
    return any(stop in tail for stop in request.stop_strings)
