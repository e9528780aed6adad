"""A run's summary figures: how its steps ran (eager, compiled, called directly), in words and counted."""

from __future__ import annotations

from batching.engine.events import StepEvent
from batching.runs import RunRecord
from utils.metrics.run import steps_kind, summarize


def test_steps_kind_says_which_steps_ran_compiled() -> None:
    def run(*steps: tuple[int, bool]) -> RunRecord:
        record = RunRecord("continuous", start=0.0)
        for index, (prefill, compiled) in enumerate(steps):
            decode = 0 if prefill > 8 else 1
            path = "compiled" if compiled else "eager"
            record.add(StepEvent(index, index, index + 1, ("a",), prefill, decode, path=path))
        return record

    assert steps_kind(run((9, False), (0, False), (0, False))) == "eager steps"
    assert steps_kind(run((9, False), (0, True), (0, True))) == "compiled decode steps"
    assert steps_kind(run((9, False), (0, False), (0, True))) == "eager, then compiled decode steps from step 3"
    assert (
        steps_kind(run((9, False), (0, True), (4, True), (0, True)))
        == "compiled decode steps, 1 of 2 prompt steps compiled"
    )
    assert steps_kind(run((9, False), (4, True), (0, False))) == "eager decode steps, 1 of 2 prompt steps compiled"


def test_steps_kind_says_how_many_steps_called_their_graph_directly() -> None:
    record = RunRecord("continuous", start=0.0)
    for index, path in enumerate(["eager", "compiled", "direct", "direct"]):
        record.add(StepEvent(index, index, index + 1, ("a",), 9 if index == 0 else 0, 1, path=path))
    assert steps_kind(record) == "compiled decode steps (2 of 4 steps called their graph directly)"


def test_the_summary_counts_steps_by_how_they_ran() -> None:
    record = RunRecord("compiled", start=0.0)
    for index, path in enumerate(["eager", "compiled", "compiled", "direct"]):
        record.add(StepEvent(index, index, index + 1, ("a",), 0, 1, path=path))
    assert summarize(record).as_dict()["steps_by_path"] == {"eager": 1, "compiled": 2, "direct": 1}
