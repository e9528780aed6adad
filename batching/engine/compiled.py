"""Compiled decode steps: `torch.compile` of the model's own forward, one graph per shape bucket.

A decode step (every row one new token) is padded to the batcher's slot count and its cached columns rounded up
to a multiple of `kv_step`, so a few graphs cover every step with static shapes and no graph breaks. Graphs are
made in a background thread on a scratch copy of the cache; until a bucket's graph is ready, steps run eager.
Prompt chunks always run eager: their shapes vary too much to be worth a graph each.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

logger = logging.getLogger(__name__)

Bucket = tuple[int, int]  # (rows, cached columns) of a padded decode step
KV_STEP = 128

_compiled: weakref.WeakKeyDictionary[torch.nn.Module, Callable[..., object]] = weakref.WeakKeyDictionary()
_compilers: weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple[int, int], StepCompiler]] = (
    weakref.WeakKeyDictionary()
)
_compiled_lock = threading.Lock()


def compiled_forward(model: PreTrainedModel) -> Callable[..., object]:
    """One compiled forward per model, shared by every batcher on it (graphs of equal shapes are reused)."""
    with _compiled_lock:
        forward = _compiled.get(model)
        if forward is None:
            forward = torch.compile(model.forward, fullgraph=True, dynamic=False)
            _compiled[model] = forward
        return forward


def step_compiler(model: PreTrainedModel, capacity: int, max_len: int, warm: Callable[[Bucket], None]) -> StepCompiler:
    """The compiler of decode steps of this model, slot count and cache length: batchers of one shape share it,
    so a batcher made after another finds its graphs ready."""
    with _compiled_lock:
        compilers = _compilers.setdefault(model, {})
        compiler = compilers.get((capacity, max_len))
        if compiler is None:
            compiler = compilers[(capacity, max_len)] = StepCompiler(model, capacity, max_len, warm)
        return compiler


@dataclass
class CompileTimes:
    """Seconds spent making each bucket's graph (the benchmark reports them apart from run time)."""

    seconds: dict[Bucket, float] = field(default_factory=dict)

    @property
    def total_s(self) -> float:
        return sum(self.seconds.values())


class StepCompiler:
    """Which decode buckets have a graph ready; compiles a missing one in a background thread when a step asks.

    `warm(bucket)` runs one step of that bucket through the compiled forward on scratch state (the runner
    provides it), which is what makes the graph.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        capacity: int,
        max_len: int,
        warm: Callable[[Bucket], None],
        kv_step: int = KV_STEP,
    ) -> None:
        if kv_step < 1:
            raise ValueError(f"kv_step={kv_step} is not allowed: must be >= 1")
        self.forward = compiled_forward(model)
        self.capacity = capacity
        self.max_len = max_len
        self.kv_step = kv_step
        self.times = CompileTimes()
        self._warm = warm
        self._ready: set[Bucket] = set()
        self._failed: set[Bucket] = set()
        self._queued: set[Bucket] = set()
        self._queue: queue.Queue[Bucket] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def bucket(self, rows: int, kv_len: int) -> Bucket:
        """The padded shape of a decode step with `rows` rows reading `kv_len` cached columns."""
        columns = -(-kv_len // self.kv_step) * self.kv_step
        return self.capacity, min(columns, self.max_len)

    def step(self, bucket: Bucket) -> Callable[..., object] | None:
        """The compiled forward when this bucket's graph is ready; else None (run eager) and its compile is queued."""
        if bucket in self._ready:
            return self.forward
        self._enqueue(bucket)
        return None

    def compile_now(self, buckets: list[Bucket]) -> None:
        """Make these buckets' graphs in this thread (the benchmark does, before it times anything)."""
        for bucket in buckets:
            if bucket not in self._ready:
                self._make(bucket)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every queued compile has finished; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                if not self._queued:
                    return True
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.05)

    @property
    def ready(self) -> frozenset[Bucket]:
        return frozenset(self._ready)

    def _enqueue(self, bucket: Bucket) -> None:
        with self._lock:
            if bucket in self._queued or bucket in self._failed:
                return
            self._queued.add(bucket)
            self._queue.put(bucket)
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="batchscope-compile", daemon=True)
                self._thread.start()

    def _work(self) -> None:
        while True:
            bucket = self._queue.get()
            try:
                self._make(bucket)
            finally:
                with self._lock:
                    self._queued.discard(bucket)

    def _make(self, bucket: Bucket) -> None:
        start = time.perf_counter()
        try:
            self._warm(bucket)
        except Exception:  # a model the compiler cannot handle keeps running eager
            logger.exception("compiling decode steps of shape %s failed; they stay eager", bucket)
            self._failed.add(bucket)
            return
        self.times.seconds[bucket] = time.perf_counter() - start
        self._ready.add(bucket)
        logger.info("decode steps of shape %s compiled in %.1f s", bucket, self.times.seconds[bucket])
