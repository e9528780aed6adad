"""The third peer: vLLM's own server (batching/bench/vllm_server.py) on the same model folder, driven over HTTP with
the same requests and caps as our batchers.

Each request is the same token ids with the same cap (`max_tokens`), greedy, with vLLM's `ignore_eos` as asked,
streamed from `/v1/completions` with `return_token_ids`, so the answer's token ids come back exactly and the first
token's arrival is seen by the client (TTFT). Requests are submitted on the same arrival schedule; a per-step
schedule counts the server's engine steps from its `/metrics` (`vllm:iteration_tokens_total`, one observation per
step). The server does not report its batches: the run has no step events, and no request has a known queue time.
"""

from __future__ import annotations

import json
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx2

from batching.arrivals import Schedule
from batching.bench.peers.local_server import LocalServer
from batching.bench.peers.peer_loop import RequestLoop, from_queue, request_id
from batching.engine.events import FinishedEvent
from batching.engine.request import FinishReason
from batching.remote.prometheus import read_metrics
from batching.runs import RunRecord

REQUEST_TIMEOUT_S = 600.0
STEPS_METRIC = "vllm:iteration_tokens_total_count"
_REASONS = {"length": FinishReason.LENGTH, "abort": FinishReason.CANCELLED}


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
        threads: list[threading.Thread] = []
        limits = httpx2.Limits(max_connections=len(prompts), max_keepalive_connections=len(prompts))
        with httpx2.Client(timeout=httpx2.Timeout(REQUEST_TIMEOUT_S, connect=10.0), limits=limits) as client:

            def submit(index: int, arrival: float) -> None:
                body = self._body(prompts[index], caps[index], ignore_eos)
                args = (client, request_id(index), len(prompts[index]), body, arrival, finished)
                thread = threading.Thread(target=self._complete, args=args, daemon=True)
                thread.start()
                threads.append(thread)

            loop = RequestLoop(schedule, submit, self.engine_steps, self.clock)
            record = loop.run(mode, self.slots, from_queue(finished, lambda event: event), on_finished)
            for thread in threads:
                thread.join()
        record.end = max(event.finished for event in record.finished) if record.finished else self.clock()
        return record, []

    def _body(self, prompt: Sequence[int], cap: int, ignore_eos: bool) -> dict[str, Any]:
        return {
            "model": self.model,
            "prompt": list(prompt),  # token ids, taken as they are
            "max_tokens": cap,
            "ignore_eos": ignore_eos,
            "temperature": 0,  # greedy
            "stream": True,
            "return_token_ids": True,  # each chunk carries its tokens' ids
        }

    def _complete(
        self,
        client: httpx2.Client,
        request_id: str,
        prompt_tokens: int,
        body: dict[str, Any],
        arrival: float,
        finished: queue.Queue[FinishedEvent],
    ) -> None:
        """One streamed completion; always puts exactly one event (an error event when anything fails)."""
        tokens: list[int] = []
        pieces: list[str] = []
        first_token: float | None = None
        reason, error = FinishReason.ERROR, None
        try:
            with client.stream("POST", f"{self.url}/v1/completions", json=body) as response:
                if response.status_code != 200:
                    raise ValueError(f"HTTP {response.status_code}: {response.read().decode(errors='replace')[:200]}")
                for event in httpx2.EventSource(response):
                    if event.data.strip() == "[DONE]":
                        break
                    for choice in json.loads(event.data).get("choices") or ():
                        ids = [int(token) for token in choice.get("token_ids") or ()]
                        if ids and first_token is None:
                            first_token = self.clock()
                        tokens += ids
                        pieces.append(choice.get("text") or "")
                        if choice.get("finish_reason"):
                            reason = _reason(choice["finish_reason"], choice.get("stop_reason"))
            if reason is FinishReason.ERROR:
                error = "the stream ended without a known finish reason"
        except (httpx2.HTTPError, httpx2.SSEError, ValueError, KeyError, TypeError) as exc:
            reason, error = FinishReason.ERROR, f"{type(exc).__name__}: {exc}"
        finished.put(
            FinishedEvent(
                request_id=request_id,
                reason=reason,
                output_ids=tuple(tokens),
                text="".join(pieces),
                prompt_tokens=prompt_tokens,
                arrival=arrival,
                admitted=None,  # vLLM does not say when a request got its place in the batch
                first_token=first_token,
                finished=self.clock(),
                slot=None,
                error=error,
            )
        )


def _reason(finish_reason: str, stop_reason: object) -> FinishReason:
    """OpenAI's finish reason as ours: vLLM's "stop" is EOS when no stop string or token id caused it."""
    if finish_reason == "stop":
        return FinishReason.EOS if stop_reason is None else FinishReason.STOP
    return _REASONS.get(finish_reason, FinishReason.ERROR)
