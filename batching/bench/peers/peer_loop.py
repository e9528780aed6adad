"""The request loop every peer runs a plan in (transformers, llama.cpp, vLLM): arrivals released on the schedule, a
per-step schedule counting the peer's own engine steps, and each answer recorded as it comes, until all are in."""

from __future__ import annotations

import queue
from collections.abc import Callable
from typing import TypeVar

from batching.arrivals import PER_STEP, ArrivalDriver, Schedule
from batching.engine.events import FinishedEvent
from batching.runs import RunRecord

Answer = TypeVar("Answer")
# The next answer if one came within a short wait, else None; its argument says whether every request is sent.
NextAnswer = Callable[[bool], FinishedEvent | None]


def request_id(index: int) -> str:
    """A peer's id for the request at `index` of the plan."""
    return f"q{index}"


class RequestLoop:
    """Submits a plan's requests (`submit(index, arrival)`) on `schedule` and records the answers. `steps_taken`
    counts the peer's engine steps so far; it is read only for a per-step schedule, and only until all are sent."""

    def __init__(
        self,
        schedule: Schedule,
        submit: Callable[[int, float], object],
        steps_taken: Callable[[], int],
        clock: Callable[[], float],
    ) -> None:
        self.per_step = schedule.kind == PER_STEP
        self.steps_taken = steps_taken
        self.first_step = steps_taken() if self.per_step else 0
        self.driver = ArrivalDriver(schedule, submit, clock=clock)
        self.count = len(schedule)

    def run(
        self, mode: str, slots: int, next_answer: NextAnswer, on_finished: Callable[[FinishedEvent], object] | None
    ) -> RunRecord:
        """Start the clock and collect every answer (`on_finished` sees each); the record's answers in plan order."""
        driver = self.driver
        record = RunRecord(mode=mode, start=driver.start(), slots=slots)
        while len(record.finished) < self.count:
            driver.release(self.steps_taken() - self.first_step if self.per_step and not driver.done else 0)
            if driver.submitted == len(record.finished) and not driver.done:
                driver.wait_idle()
                continue
            event = next_answer(driver.done)
            if event is None:
                continue
            record.add(event)
            if on_finished is not None:
                on_finished(event)
        order = {request_id(index): index for index in range(self.count)}
        record.finished.sort(key=lambda event: order[event.request_id])
        return record


def from_queue(answers: queue.Queue[Answer], finished: Callable[[Answer], FinishedEvent]) -> NextAnswer:
    """The next answer that request threads put on `answers`: a short wait while requests are still to be sent (so
    the next one is not late), a longer one after."""

    def next_answer(all_sent: bool) -> FinishedEvent | None:
        try:
            answer = answers.get(timeout=1.0 if all_sent else 0.005)
        except queue.Empty:
            return None
        return finished(answer)

    return next_answer
