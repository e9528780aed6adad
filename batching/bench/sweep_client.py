"""One rate of a sweep against a server, timed as `vllm bench serve` times it.

Each request is sent when its Poisson arrival comes (one thread each, so a slow answer never delays the next
send), streamed from `/v1/completions`, and timed in its thread exactly as vLLM's client does
(`vllm/benchmarks/lib/endpoint_request_func.py`): the clock starts just before the POST, every server-sent event
with a choice is a chunk (its arrival time kept: the first gives TTFT, the gaps ITL, the last the latency), and the
output tokens are the server's own count from the usage chunk. The prompt goes as token ids when the sweep
tokenised it (servers it started on one model folder: every server gets the same tokens), else as the same text
(servers already running, whose tokenizer this process does not have).

Why our own loop rather than vLLM's or guidellm's: vLLM's client lives in vLLM's environment (its torch and
transformers pins), guidellm draws its own synthetic prompts, and the sweep must send the page's prompt mix, token
for token, and read the per-chunk times its figures need.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx2

from batching.arrivals import ArrivalDriver, Schedule
from utils.metrics.sweep import RequestTiming

REQUEST_TIMEOUT_S = 600.0


def request_body(model: str | None, prompt: Sequence[int] | str, cap: int, ignore_eos: bool) -> dict[str, Any]:
    """A greedy streamed completion of token ids (or text), with the usage chunk at the end (vLLM's `ignore_eos` as
    asked); no model: the server's own (every OpenAI-compatible server but OpenAI's takes that)."""
    body: dict[str, Any] = {
        "prompt": prompt if isinstance(prompt, str) else list(prompt),
        "max_tokens": cap,
        "temperature": 0,
        "ignore_eos": ignore_eos,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return body if model is None else {"model": model, **body}


def stream_timing(
    client: httpx2.Client, url: str, body: dict[str, Any], clock: Callable[[], float] = time.perf_counter
) -> RequestTiming:
    """One streamed completion, timed; a request that fails (HTTP error, no chunk, a broken stream) is not served."""
    chunks: list[float] = []
    tokens: int | None = None
    start = clock()
    try:
        with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            if response.status_code != 200:
                response.read()
                return RequestTiming(start, (), 0, ok=False)
            for event in httpx2.EventSource(response):
                if event.data.strip() == "[DONE]":
                    break
                data = json.loads(event.data)
                if data.get("choices"):
                    chunks.append(clock())
                elif isinstance((usage := data.get("usage")), dict):
                    tokens = usage.get("completion_tokens")
    except (httpx2.HTTPError, httpx2.SSEError, ValueError):
        return RequestTiming(start, tuple(chunks), 0, ok=False)
    return RequestTiming(start, tuple(chunks), len(chunks) if tokens is None else int(tokens), ok=bool(chunks))


def run_remote_rate(
    url: str,
    bodies: Sequence[dict[str, Any]],
    schedule: Schedule,
    on_finished: Callable[[], object] = lambda: None,
    clock: Callable[[], float] = time.perf_counter,
    headers: Mapping[str, str] | None = None,
    stop: threading.Event | None = None,
) -> tuple[list[RequestTiming], float]:
    """Send body i (`request_body`) at `schedule.due[i]` seconds and wait for every answer; their timings (in
    request order) and the run's duration, from its start to the last answer's end (vLLM's benchmark duration).
    `headers` go with every request (an API key); once `stop` is set nothing more is sent (those sent finish)."""
    timings: list[RequestTiming | None] = [None] * len(bodies)
    threads: list[threading.Thread] = []
    limits = httpx2.Limits(max_connections=len(bodies), max_keepalive_connections=len(bodies))
    timeout = httpx2.Timeout(REQUEST_TIMEOUT_S, connect=10.0)
    with httpx2.Client(timeout=timeout, limits=limits, headers=dict(headers or {})) as client:

        def send(index: int) -> None:
            timings[index] = stream_timing(client, url, bodies[index], clock)
            on_finished()

        def submit(index: int, _arrival: float) -> None:
            thread = threading.Thread(target=send, args=(index,), daemon=True)
            thread.start()
            threads.append(thread)

        driver = ArrivalDriver(schedule, submit, clock=clock)
        start = driver.start()
        while not driver.done:
            if stop is not None and stop.is_set():
                driver.drop_pending()
                break
            driver.wait_idle()
        for thread in threads:
            thread.join()
    done = [timing for timing in timings if timing is not None]
    ends = [timing.chunks[-1] for timing in done if timing.chunks]
    duration = (max(ends) - start) if ends else math.nan
    return done, duration
