"""How many torch threads a model's steps run on, chosen by timing its own decode steps at each count.

A small model's ops last microseconds: on more threads each one forks and joins the others, and a thread the OS has
not scheduled (shared cores) stalls the whole op, so a second thread can make a step several times slower; a large
model's matmuls split well. Which side of that line a model falls on depends on the model, the CPU and what else
runs, so it is measured: a few real decode steps (8 rows, eager) at 1, 2, 4, ... up to the most allowed, the counts
taken in turn, round after round (a slow spell of the machine lands on every count), the median of each kept.
`choose` then keeps the fewest threads within `MARGIN` of the fastest: never a count measured clearly slower than one
thread. Compiled steps take the most threads unless their eager steps there take twice the fastest count's time
(`COMPILED_MARGIN`): eager steps do not predict the graph's, only a machine where threads wait for each other.
Inductor bakes the thread count into the C++ it generates, so the choice comes before any graph is made.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

MARGIN = 0.05  # more threads are kept only when at least this much faster than fewer
# Compiled steps: more threads are kept unless their eager steps are this much slower than the fastest count's. The
# eager probe does not predict the compiled graph: on the quiet 2-vCPU machine the embedded model's eager step at two
# threads against one measured 0.87-1.85x as long (1.09-1.33x in four starts of one night) while the compiled graphs
# at two ran whole workloads 1.05-1.4x faster; on shared cores two were 4.7x slower.
COMPILED_MARGIN = 1.0
ROWS = 8  # decode rows the probe steps (the batchers' default slot count)
ROUNDS = 3  # each count timed this many times, in turn with the others
STEPS = 4  # decode steps per timing at most: fewer where one step lasts over a quarter of `CALL_S`
CALL_S = 0.05  # what one timing should last: a large model's eager step (0.2 s at the 0.5B shape) is timed alone,
# so the probe takes 3 s of a server's start there, not 11


def counts_up_to(most: int) -> list[int]:
    """The thread counts tried: 1, 2, 4, ... and `most` itself."""
    counts, count = [], 1
    while count < most:
        counts.append(count)
        count *= 2
    return [*counts, max(most, 1)]


def choose(seconds: Mapping[int, float], compiled: bool = False) -> int:
    """Among the thread counts whose time is within `MARGIN` of the fastest count's (`seconds`: count -> time of the
    same eager work), the fewest; for compiled steps the most within `COMPILED_MARGIN`. Eager steps: one thread is
    among them when measured, so the choice is never slower than one thread was. Compiled steps gain from threads
    where the eager probe ties or nearly does: on a quiet machine the embedded model's eager step took 7.75 ms at
    one thread and 7.74 at two (6.26 and 8.34 another time), its compiled step 1.4x less at two (so did seed-blog's
    whole run); a count measured clearly slower (on shared cores, where a thread waits for another the OS has not
    scheduled) is never taken."""
    fastest = min(seconds.values())
    margin = COMPILED_MARGIN if compiled else MARGIN
    near = [count for count, took in seconds.items() if took <= fastest * (1 + margin)]
    return max(near) if compiled else min(near)


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch on `count` threads inside the block, what it was after."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def time_counts(
    work: Callable[[], None],
    counts: Sequence[int],
    rounds: int = ROUNDS,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[int, float]:
    """The median time of `work` at each thread count, the counts taken in turn for `rounds` rounds (the order
    rotated each round), each after one untimed call at that count (its threads woken, its buffers made)."""
    taken: dict[int, list[float]] = {count: [] for count in counts}
    for round_index in range(rounds):
        shift = round_index % len(counts)
        for count in [*counts[shift:], *counts[:shift]]:
            with torch_threads(count):
                work()
                start = clock()
                work()
                taken[count].append(clock() - start)
    return {count: statistics.median(times) for count, times in taken.items()}


def decode_work(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, calls: int
) -> tuple[Callable[[], None], int]:
    """Real decode steps of `ROWS` rows of `model` for `calls` calls (eager, a KV pool of its own just big enough), the
    rows' prompts computed before the first; and the steps each call takes: as many of `STEPS` as fit in `CALL_S`,
    at least one, by one step timed first."""
    from batching.engine.batcher import Batcher  # the batcher imports this module's users, not this module
    from batching.engine.options import BatcherOptions
    from batching.engine.params import RequestParams

    cap = calls * STEPS + 2
    options = BatcherOptions(
        max_batch_size=ROWS, max_batched_tokens=512, step_detail=False, kv_cache_tokens=ROWS * (cap + 64)
    )
    batcher = Batcher(model, tokenizer, options)
    for index in range(ROWS):
        batcher.add(f"Question {index}: how do threads share a step?", RequestParams(cap, ignore_eos=True))
    while len(batcher.running) < ROWS or not all(request.output_ids for request in batcher.running.values()):
        batcher.step()  # the prompts, until every row decodes
    start = time.perf_counter()
    batcher.step()
    steps = max(1, min(STEPS, round(CALL_S / (time.perf_counter() - start))))

    def work() -> None:
        for _ in range(steps):
            batcher.step()

    return work, steps


@dataclass(frozen=True)
class ThreadChoice:
    """The thread count chosen, the most allowed, and what each count measured (seconds a decode step)."""

    threads: int
    most: int
    step_s: Mapping[int, float]

    def line(self) -> str:
        """One line for a log: the choice and every count's time."""
        if not self.step_s:
            return f"torch runs on {self.threads} thread(s) (not timed)"
        timings = ", ".join(f"{count}: {took * 1e3:.2f} ms" for count, took in self.step_s.items())
        return (
            f"torch runs on {self.threads} of {self.most} thread(s), the fastest decode step of {ROWS} rows measured"
            f" (median of {ROUNDS}, by thread count: {timings})"
        )


def pick_threads(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, most: int, compiled: bool = False
) -> ThreadChoice:
    """Time `model`'s decode steps at up to `most` threads and choose among the fastest (`choose`: for `compiled`
    steps the most of them); torch's own count is left as it was. A model on a GPU, or `most` 1, takes `most`
    untimed."""
    most = max(most, 1)
    if model.device.type != "cpu" or most == 1:
        return ThreadChoice(most, most, {})
    counts = counts_up_to(most)
    with torch.inference_mode():
        work, steps = decode_work(model, tokenizer, 2 * ROUNDS * len(counts))
        seconds = time_counts(work, counts)
    choice = ThreadChoice(
        choose(seconds, compiled=compiled), most, {count: took / steps for count, took in seconds.items()}
    )
    logger.info("%s", choice.line())
    return choice
