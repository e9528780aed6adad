"""Hand-made runs the metrics, chart and export tests read: a static wave that holds a finished slot, and a
continuous run on a shared engine beside another session's request."""

from __future__ import annotations

import pytest

from batching.engine.events import FinishedEvent, StepEvent, TokenEvent
from batching.engine.request import FinishReason
from batching.runs import RunRecord


def finished(request_id: str, tokens: int, first: float, end: float, slot: int) -> FinishedEvent:
    return FinishedEvent(
        request_id=request_id,
        reason=FinishReason.EOS,
        output_ids=tuple(range(tokens)),
        text=f" answer of {request_id}\nQ: more",
        prompt_tokens=4,
        arrival=0.0,
        admitted=0.0,
        first_token=first,
        finished=end,
        slot=slot,
    )


@pytest.fixture
def static_run() -> RunRecord:
    """A static wave of two: `a` finishes after 1 step and holds its slot idle while `b` runs 2 more."""
    run = RunRecord("static", start=0.0)
    run.extend(
        [
            TokenEvent("a", 1, " x", 0, 0.1),
            TokenEvent("b", 1, " y", 0, 0.1),
            StepEvent(0, 0.0, 0.1, ("a", "b"), prefill_tokens=8, decode_tokens=0),
            finished("a", 1, 0.1, 0.1, 0),
            StepEvent(1, 0.1, 0.2, ("a", "b"), prefill_tokens=0, decode_tokens=1, idle_held=("a",)),
            finished("b", 2, 0.1, 0.3, 1),
            StepEvent(2, 0.2, 0.3, ("a", "b"), prefill_tokens=0, decode_tokens=1, idle_held=("a",)),
        ]
    )
    run.end = 0.3
    return run


@pytest.fixture
def shared_run() -> RunRecord:
    """A continuous run on a shared engine: this session owns `s1/*`, another session's request sits in slot 3."""
    run = RunRecord("continuous", start=10.0)
    run.extend(
        [
            StepEvent(7, 10.0, 10.1, ("s1/1", None, "s2/1"), prefill_tokens=6, decode_tokens=0),
            finished("s1/1", 1, 10.1, 10.1, 0),
            StepEvent(8, 10.1, 10.2, ("s1/2", None, "s2/1"), prefill_tokens=3, decode_tokens=1),
            finished("s1/2", 1, 10.2, 10.2, 0),
        ]
    )
    run.end = 10.2
    return run
