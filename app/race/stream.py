"""The body of the race's streaming loop, without Streamlit: fold both lanes' steps in as the engine sends them, and
decide what the page should redraw (paced as every streaming loop is, `app.common.streaming.RedrawPacing`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from app.common.live_run import RequestView
from app.common.streaming import CHART_REDRAW_S, TEXT_REDRAW_S, RaceEnd, RedrawPacing, shown
from app.race.lanes import RaceRun
from batching.race import LaneStep


class RaceSource(Protocol):
    """What the loop needs of a race in the engine (`batching.service.RaceHandle`)."""

    def poll(self, timeout: float = 0.0) -> Sequence[LaneStep | RaceEnd]: ...


@dataclass(frozen=True)
class RaceRedraw:
    """What changed in a race since the last tick: answers by (lane, index on the page, view), and whether the
    progress line and the lanes' charts are due."""

    now: float
    answers: list[tuple[str, int, RequestView]] = field(default_factory=list)
    charts: bool = False
    done: bool = False
    superseded: bool = False  # a newer script run of the tab follows the race now: this one stops


class RaceStream(RedrawPacing):
    """One script run's view of a race: `tick()` until `RaceRedraw.done`, sleeping `pause()` in between.

    Like `RunStream`, a new script run makes a new `RaceStream` on the same `RaceRun` (taking its baton) and picks up
    where it was.
    """

    def __init__(
        self,
        race: RaceRun,
        source: RaceSource,
        clock: Callable[[], float] = time.perf_counter,
        text_every_s: float = TEXT_REDRAW_S,
        chart_every_s: float = CHART_REDRAW_S,
    ) -> None:
        super().__init__(clock, text_every_s, chart_every_s)
        self.race = race
        self.source = source
        self.follower = race.baton.take()
        self._drawn = {(mode, view.number): shown(view) for mode, lane in race.lanes.items() for view in lane.views}

    def tick(self) -> RaceRedraw:
        """Wait up to one text interval for lane steps and fold them in; say what to redraw."""
        race = self.race
        with self.follower.following() as following:
            if not following:
                return RaceRedraw(self.clock(), superseded=True)
            try:
                messages = self.source.poll(timeout=self.text_every_s)
            except RuntimeError as exc:  # the engine stopped: the race ends with its message
                race.end((), str(exc))
                messages = []
            for message in messages:
                if isinstance(message, LaneStep):
                    race.apply(message.mode, message.events, message.arrived, message.elapsed)
                else:
                    race.end(message.walls, message.error)
        now = self.clock()
        answers = []
        if self.text_due(now, race.done):
            for mode, lane in race.lanes.items():
                for index, view in enumerate(lane.views):
                    now_shown = shown(view)
                    if self._drawn.get((mode, view.number)) != now_shown:
                        self._drawn[(mode, view.number)] = now_shown
                        answers.append((mode, index, view))
        return RaceRedraw(now, answers, charts=self.charts_due(now, race.done), done=race.done)
