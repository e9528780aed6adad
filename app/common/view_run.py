"""What every view's run does alike: it runs until its live view is done and is let go when the person leaves the
view. A run belongs to the view that started it: each view keeps its run under a session-state key of its own
(`KEY` in its folder's `run` module), with how it starts, follows the queue and stops."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict
from typing import Protocol

from app.common.frame import Frame
from batching.arrivals import Schedule
from batching.engine.options import BatcherOptions


class FollowedRun(Protocol):
    """A run's live view (`LiveRun`, `RaceRun`, a sweep's): done once every answer is in or it was stopped."""

    @property
    def stopped(self) -> bool: ...

    @property
    def done(self) -> bool: ...


class ViewRunBase(ABC):
    """What every view's run does alike (`app.common.frame.ViewRun`): it runs until its live view is done, and is
    stopped when the person leaves the view, unless it is over or already stopped."""

    run: FollowedRun

    @abstractmethod
    def stop(self) -> None:
        """Stop the live view and what it sent."""

    @property
    def running(self) -> bool:
        return not self.run.done

    def let_go(self) -> None:
        if self.running and not self.run.stopped:
            self.stop()


def engine_setup(
    frame: Frame, run: str, compare: bool, pause_ms: int, schedule: Schedule, options: BatcherOptions | None = None
) -> dict:
    """What a run on the built-in engine was asked to do (on `options`, default the frame's), for the export."""
    choices = frame.choices
    return {
        "model": frame.service.info.name,
        "run": run,
        "engine": asdict(options or frame.options),
        "sampling": asdict(choices.sampling),
        "arrivals": schedule.description,
        "system_prompt": choices.system_prompt,
        "compare": compare,
        "slow_motion_ms": pause_ms,
    }
