"""The peer to beat: transformers' own continuous batching (`init_continuous_batching`), driven like our batchers.

It runs in its own thread and leaves state on the model (the attention implementation, a cached manager), so it
gets its own model instance. Its results become the same events ours emit, so one summary and one chart code path
serve every mode: per-token timestamps give TTFT and TPOT, and a thin wrapper around its generation step records
each step's batch (steps, occupancy, step time).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.continuous_batching.requests import GenerationOutput

from batching.arrivals import AT_ONCE, Schedule
from batching.bench.peers.peer_loop import RequestLoop, request_id
from batching.engine.detokenizer import decode_text
from batching.engine.events import FinishedEvent, StepEvent
from batching.engine.request import FinishReason
from batching.runs import RunRecord

logger = logging.getLogger(__name__)

PAGE_SIZE = 256  # transformers' default page size


@dataclass(frozen=True)
class _RawStep:
    start: float
    end: float
    batch: tuple[tuple[str, bool, int, int], ...]  # (request id, prefilling, new tokens, sequence length)


class HFPeer:
    """transformers' continuous batching with our batch size and per-step token budget, FIFO admission.

    The cache is sized for the workload (`batch_size` requests of `max_len` tokens): its default takes a share of
    the machine's memory and builds a [tokens x cache] attention mask that costs tens of seconds on a CPU.
    Prefix sharing is off, so repeated runs of one workload do not reuse the previous run's cache.
    Use it as a context manager: the generation thread runs from `__enter__` to `__exit__`.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        batch_size: int,
        max_batched_tokens: int,
        max_len: int,
        eos_ids: Iterable[int] = (),
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.eos_ids = sorted(eos_ids)
        self.clock = clock
        config = ContinuousBatchingConfig(
            max_requests_per_batch=batch_size,
            max_batch_tokens=max_batched_tokens,
            num_blocks=batch_size * (math.ceil(max_len / PAGE_SIZE) + 1),
            page_size=PAGE_SIZE,
            allow_block_sharing=False,
            # Its CUDA graphs on a GPU (its own default turns them off for attentions that take a mask, SDPA's).
            use_cuda_graph=True if model.device.type == "cuda" else None,
        )
        generation = GenerationConfig(
            do_sample=False,
            max_new_tokens=max_len,
            eos_token_id=self.eos_ids or -1,
            pad_token_id=tokenizer.pad_token_id,
        )
        # transformers types every model attribute as Module | Tensor; this one is a method of GenerationMixin
        self.manager = model.init_continuous_batching(  # type: ignore[operator]
            generation_config=generation, continuous_batching_config=config
        )
        self._steps: list[_RawStep] = []
        self._instrument()

    def _instrument(self) -> None:
        """Record each generation step's batch and duration (its forward pass and sampling)."""
        manager = self.manager
        step = manager._generation_step

        def timed_step() -> None:
            batch = tuple(
                (
                    future.state.request_id,
                    future.state.generated_len() == 0,  # its status says DECODING already while prefilling
                    future.query_length,
                    len(future.state.initial_tokens) + future.state.generated_len(),
                )
                for future in manager.batch_processor.inputs_and_outputs.requests_in_batch
            )
            start = self.clock()
            step()
            self._steps.append(_RawStep(start, self.clock(), batch))

        manager._generation_step = timed_step

    def __enter__(self) -> HFPeer:
        self.manager.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.manager.stop(block=True, timeout=30)

    def run(
        self,
        prompts: Sequence[Sequence[int]],
        caps: Sequence[int],
        schedule: Schedule,
        ignore_eos: bool,
        mode: str = "hf",
        on_finished: Callable[[FinishedEvent], object] | None = None,
    ) -> tuple[RunRecord, list[int]]:
        """Submit the prompts on `schedule`, wait for all; return the run as events and each step's longest sequence."""
        eos = -1 if ignore_eos or not self.eos_ids else self.eos_ids
        ids = [request_id(index) for index in range(len(prompts))]
        prompt_of = dict(zip(ids, prompts, strict=True))
        cap_of = dict(zip(ids, caps, strict=True))
        arrival_of: dict[str, float] = {}

        def submit(index: int, arrival: float) -> None:
            arrival_of[ids[index]] = arrival
            self.manager.add_request(
                list(prompts[index]),
                request_id=ids[index],
                max_new_tokens=caps[index],
                record_timestamps=True,
                eos_token_id=eos,
            )

        def next_answer(all_sent: bool) -> FinishedEvent | None:
            result = self.manager.get_result(timeout=0.05 if schedule.kind == AT_ONCE else 0.001)
            if result is None:
                if not self.manager.is_running():
                    raise RuntimeError("transformers' continuous batching thread stopped before finishing the run")
                return None
            if not result.is_finished() or result.request_id not in prompt_of:
                return None
            rid = result.request_id
            return self._finished(result, cap_of[rid], len(prompt_of[rid]), arrival_of[rid], eos)

        first_step = len(self._steps)
        loop = RequestLoop(schedule, submit, lambda: len(self._steps), self.clock)
        record = loop.run(mode, self.batch_size, next_answer, on_finished)
        record.end = self.clock()
        # The thread may still be inside its last step's bookkeeping: keep only steps that began in this run.
        raw = [step for step in self._steps[first_step:] if step.start >= record.start]
        kv_lens = []
        for index, step in enumerate(raw):
            record.add(self._step_event(index, step))
            kv_lens.append(max((length for *_, length in step.batch), default=0))
        return record, kv_lens

    def outside_cpu_s(self) -> float:
        """Nothing: its generation thread runs in this process, so the process time counts it already."""
        return 0.0

    def hold(self, paused: bool) -> None:
        """Stop its generation thread while other contenders run, and start it again for its own runs. Alive in
        this process, that thread made our two-thread steps 3.7x slower (seed-blog 570 against 2,089 tok/s), idle
        as it was. Its cache is kept; stopping restores the model's attention implementation, so a restart
        switches it back as transformers does for a manager it reuses."""
        manager = self.manager
        if paused and manager.is_running():
            manager.stop(block=True, timeout=30, keep_for_next_session=True)
        elif not paused and not manager.is_running():
            manager.switch_to_cb_friendly_attn(manager.model, manager.continuous_batching_config.auto_switch_to_flash)
            manager.start()

    def warm_up(self, prompt: Sequence[int], max_new_tokens: int = 4) -> None:
        """One short untimed request: the thread builds its cache and batch tensors on the first one."""
        self.run([prompt], [max_new_tokens], Schedule.at_once(1), ignore_eos=True, mode="warm-up")

    def _finished(
        self, result: GenerationOutput, cap: int, prompt_tokens: int, arrival: float, eos: object
    ) -> FinishedEvent:
        output = list(result.generated_tokens)
        if result.error is not None:
            reason = FinishReason.ERROR
        elif isinstance(eos, list) and output and output[-1] in eos:
            reason = FinishReason.EOS
        else:
            reason = FinishReason.LENGTH if len(output) >= cap else FinishReason.ERROR
        started, finished = result.lifespan
        return FinishedEvent(
            request_id=result.request_id,
            reason=reason,
            output_ids=tuple(output),
            text=decode_text(self.tokenizer, output),
            prompt_tokens=prompt_tokens,
            arrival=arrival,
            admitted=started if started > 0 else None,
            first_token=result.timestamps[0] if result.timestamps else None,
            finished=finished if finished > 0 else self.clock(),
            slot=None,
            error=result.error,
        )

    def _step_event(self, index: int, step: _RawStep) -> StepEvent:
        occupants = tuple(request_id for request_id, *_ in step.batch)
        return StepEvent(
            index=index,
            start=step.start,
            end=step.end,
            slots=occupants + (None,) * max(0, self.batch_size - len(occupants)),
            prefill_tokens=sum(tokens for _, prefilling, tokens, _ in step.batch if prefilling),
            decode_tokens=sum(tokens for _, prefilling, tokens, _ in step.batch if not prefilling),
        )
