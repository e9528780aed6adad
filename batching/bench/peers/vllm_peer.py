"""The third peer: vLLM's own server (`vllm_server.py`) on the same model folder, driven over HTTP with the
same requests and caps as our batchers.

Each request is the same token ids with the same cap (`max_tokens`), greedy, with vLLM's `ignore_eos` as asked, streamed
from `/v1/completions` with `return_token_ids` by the one streaming client (`batching.remote.stream_pool`), so the
answer's token ids come back exactly and the first token's arrival is seen by the client (TTFT). Requests are submitted
on the same arrival schedule; a per-step schedule counts the server's engine steps from its `/metrics`
(`vllm:iteration_tokens_total`, one observation per step). The server does not report its batches: the run has no step
events, and no request has a known queue time.
"""

from __future__ import annotations

import math
import queue
import time
from collections.abc import Callable, Sequence

from batching.arrivals import Schedule
from batching.bench.peers.local_server import LocalServer
from batching.bench.peers.peer_loop import RequestLoop, from_queue, request_id
from batching.engine.events import FinishedEvent
from batching.remote.endpoint import local_endpoint
from batching.remote.prometheus import read_metrics
from batching.remote.stream import RemoteRequest, StreamResult, request_body
from batching.remote.stream_pool import StreamPool
from batching.runs import RunRecord

STEPS_METRIC = "vllm:iteration_tokens_total_count"


class VllmPeer:
    """A client of a running vLLM server (`url`, serving `model` with `slots` sequences) that runs a plan's requests."""

    def __init__(
        self,
        url: str,
        model: str,
        slots: int,
        server: LocalServer | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.url = url
        self.model = model
        self.slots = slots
        self.server = server  # None: a server started elsewhere, neither timed nor paused
        self.clock = clock

    def outside_cpu_s(self) -> float:
        """CPU seconds the server's processes (API server, engine core, worker) have used so far."""
        return math.nan if self.server is None else self.server.cpu_s()

    def hold(self, paused: bool) -> None:
        """Pause or resume the server we started (`LocalServer.hold`)."""
        if self.server is not None:
            self.server.hold(paused)

    def engine_steps(self) -> int:
        """How many engine steps the server has taken so far, from its /metrics."""
        steps = read_metrics(self.url).total(STEPS_METRIC)
        if steps is None:
            raise ValueError(f"vLLM's /metrics has no {STEPS_METRIC}")
        return int(steps)

    def warm_up(self, prompt: Sequence[int], max_new_tokens: int = 4) -> None:
        """A full batch of short untimed requests: vLLM's first steps after its start are slow."""
        count = self.slots
        self.run([prompt] * count, [max_new_tokens] * count, Schedule.at_once(count), ignore_eos=True, mode="warm-up")

    def run(
        self,
        prompts: Sequence[Sequence[int]],
        caps: Sequence[int],
        schedule: Schedule,
        ignore_eos: bool,
        mode: str = "vllm",
        on_finished: Callable[[FinishedEvent], object] | None = None,
    ) -> tuple[RunRecord, list[int]]:
        """Submit the prompts on `schedule` and wait for every answer; the run as events, no step lengths."""
        finished: queue.Queue[FinishedEvent] = queue.Queue()
        with StreamPool(local_endpoint(self.url), len(prompts), clock=self.clock) as pool:

            def submit(index: int, arrival: float) -> None:
                request = RemoteRequest(tuple(prompts[index]), caps[index], ignore_eos=ignore_eos, token_ids=True)

                def done(result: StreamResult) -> None:
                    finished.put(answer_event(result, request_id(index), len(prompts[index]), arrival))

                pool.submit(request_body(request, self.model), done)

            loop = RequestLoop(schedule, submit, self.engine_steps, self.clock)
            record = loop.run(mode, self.slots, from_queue(finished, lambda event: event), on_finished)
        record.end = max(event.finished for event in record.finished) if record.finished else self.clock()
        return record, []


def answer_event(result: StreamResult, request_id: str, prompt_tokens: int, arrival: float) -> FinishedEvent:
    """A streamed answer as our engine's event: its token ids and text, the first token's arrival; an error event
    when it failed. vLLM does not say when a request got its place in the batch, nor in which slot."""
    return FinishedEvent(
        request_id=request_id,
        reason=result.reason,
        output_ids=tuple(result.token_ids),
        text=result.text,
        prompt_tokens=prompt_tokens,
        arrival=arrival,
        admitted=None,
        first_token=result.first_token,
        finished=result.ended if result.ended is not None else result.started,
        slot=None,
        error=result.error,
    )
