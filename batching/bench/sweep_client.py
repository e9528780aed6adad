"""One rate of a sweep against a server, timed as `vllm bench serve` times it.

Each request is sent when its Poisson arrival comes and streamed from `/v1/completions` by the one streaming client
(`batching.remote.stream_pool`: one event loop, so a slow answer never delays the next send), timed exactly as
vLLM's client does (`vllm/benchmarks/lib/endpoint_request_func.py`): the clock starts just before the POST, every
server-sent event with a choice is a chunk (its arrival time kept: the first gives TTFT, the gaps ITL, the last the
latency), and the output tokens are the server's own count from the usage chunk. The prompt goes as token ids when
the sweep tokenised it (servers it started on one model folder: every server gets the same tokens), else as the
same text (servers already running, whose tokenizer this process does not have).

Why our own loop rather than vLLM's or guidellm's: vLLM's client lives in vLLM's environment (its torch and
transformers pins), guidellm draws its own synthetic prompts, and the sweep must send the page's prompt mix, token
for token, and read the per-chunk times its figures need.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence

from batching.arrivals import ArrivalDriver, Schedule
from batching.remote.endpoint import Endpoint
from batching.remote.stream import RemoteRequest, StreamResult, request_body
from batching.remote.stream_pool import StreamPool
from utils.metrics.sweep import RequestTiming


def greedy_request(prompt: Sequence[int] | str, cap: int, ignore_eos: bool) -> RemoteRequest:
    """A greedy completion of token ids (or text), EOS ignored as asked."""
    return RemoteRequest(prompt if isinstance(prompt, str) else tuple(prompt), cap, ignore_eos=ignore_eos)


def timing(result: StreamResult) -> RequestTiming:
    """What the sweep's figures read of an answer: a failed one is not served."""
    tokens = len(result.chunks) if result.completion_tokens is None else result.completion_tokens
    served = result.error is None and bool(result.chunks)
    return RequestTiming(result.started, tuple(result.chunks), tokens if served else 0, ok=served)


def run_remote_rate(
    endpoint: Endpoint,
    model: str,
    requests: Sequence[RemoteRequest],
    schedule: Schedule,
    on_finished: Callable[[], object] = lambda: None,
    clock: Callable[[], float] = time.perf_counter,
    stop: threading.Event | None = None,
) -> tuple[list[RequestTiming], float]:
    """Send request i at `schedule.due[i]` seconds and wait for every answer; their timings (in request order) and
    the run's duration, from its start to the last answer's end (vLLM's benchmark duration). Once `stop` is set
    nothing more is sent (those sent finish)."""
    timings: list[RequestTiming | None] = [None] * len(requests)
    with StreamPool(endpoint, len(requests), clock=clock) as pool:

        def submit(index: int, _arrival: float) -> None:
            def done(result: StreamResult) -> None:
                timings[index] = timing(result)
                on_finished()

            pool.submit(request_body(requests[index], model), done)

        driver = ArrivalDriver(schedule, submit, clock=clock)
        start = driver.start()
        while not driver.done:
            if stop is not None and stop.is_set():
                driver.drop_pending()
                break
            driver.wait_idle()
    done = [each for each in timings if each is not None]
    ends = [each.chunks[-1] for each in done if each.chunks]
    duration = (max(ends) - start) if ends else math.nan
    return done, duration
