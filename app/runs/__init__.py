"""Each view's run: how it starts, follows the queue, stops, and where it is kept. A run belongs to the view that
started it: each view keeps its run under a session-state key of its own (`KEY` in its module)."""

from __future__ import annotations

from dataclasses import asdict

from app.frame import Frame
from batching.arrivals import Schedule


def engine_setup(frame: Frame, run: str, compare: bool, pause_ms: int, schedule: Schedule) -> dict:
    """What a run on the built-in engine was asked to do, for the export."""
    choices = frame.choices
    return {
        "model": frame.service.info.name,
        "run": run,
        "engine": asdict(frame.options),
        "sampling": asdict(choices.sampling),
        "arrivals": schedule.description,
        "system_prompt": choices.system_prompt,
        "compare": compare,
        "slow_motion_ms": pause_ms,
    }
