"""The page's view of a race (`batching.race`): the same prompts on a continuous and a static lane, each folded into
a `LiveRun` of its own, on that lane's clock (seconds from 0). Plain Python, tested without Streamlit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import pandas as pd

from app.common.baton import Baton
from app.common.live_run import LiveRun, RequestView
from batching.engine.batcher import MODES
from batching.engine.events import Event, FinishedEvent
from batching.engine.params import RequestParams, SamplingParams
from batching.runs import RunRecord
from utils.metrics.run import steps_kind


@dataclass
class RaceRun:
    """A race of the queue: one `LiveRun` per lane over the same prompts, and each lane's clock so far."""

    prefix: str  # request ids are prefix + prompt number, the same on every lane
    slots: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stopped: bool = False
    error: str | None = None
    ended: bool = False

    def __post_init__(self) -> None:
        self.lanes: dict[str, LiveRun] = {
            mode: LiveRun(0.0, self.prefix, self.slots, self.sampling, mode=mode) for mode in MODES
        }
        self.elapsed: dict[str, float] = dict.fromkeys(MODES, 0.0)
        self._views: dict[str, dict[str, RequestView]] = {mode: {} for mode in MODES}
        self.baton = Baton()  # the script run that follows this race (app.common.baton)

    @property
    def views(self) -> list[RequestView]:
        """The prompts, as the first lane shows them (headings and numbers are the same on every lane)."""
        return self.lanes[MODES[0]].views

    def plan(self, prompt: str, formatted: str, max_new_tokens: int, offset_s: float) -> str:
        """Plan a prompt on every lane; returns its request id (the same on every lane)."""
        request_id = ""
        for mode, lane in self.lanes.items():
            view = lane.plan(prompt, formatted, max_new_tokens, offset_s)
            request_id = f"{self.prefix}{view.number}"
            self._views[mode][request_id] = view
        return request_id

    def params(self, request_id: str) -> RequestParams:
        mode = MODES[0]
        return self.lanes[mode].params(self._views[mode][request_id])

    def items(self) -> list[tuple[str, RequestParams, str]]:
        """(prompt, params, request id) of every planned prompt, to start the race with."""
        views = self._views[MODES[0]]
        return [(view.formatted, self.params(request_id), request_id) for request_id, view in views.items()]

    def apply(self, mode: str, events: Sequence[Event], arrived: Iterable[tuple[str, float]], elapsed: float) -> None:
        """Fold one lane step in: the requests that arrived before it, then its events."""
        lane = self.lanes[mode]
        for request_id, arrival in arrived:
            view = self._views[mode].get(request_id)
            if view is not None and view.request_id is None:
                lane.submitted(view, request_id, arrival)
        for event in events:  # a request that failed without arriving (added just as the race ended)
            if isinstance(event, FinishedEvent):
                view = self._views[mode].get(event.request_id)
                if view is not None and view.request_id is None:
                    lane.submitted(view, event.request_id, self.elapsed[mode])
        lane.fold(events)
        self.elapsed[mode] = max(self.elapsed[mode], elapsed)

    def end(self, walls: Iterable[tuple[str, float, float]], error: str | None = None) -> None:
        """The engine says the race is over: each lane's clock at its last step (its wall time), or why it failed."""
        self.ended = True
        self.error = error
        for mode, start, end in walls:
            record = self.lanes[mode].record
            record.start, record.end = start, end
            self.elapsed[mode] = end
        if error is not None:
            for lane in self.lanes.values():
                for view in lane.views:
                    if view.finished is None and view.refused is None:
                        view.refused = f"the race failed: {error}"

    def stop(self) -> None:
        """The Stop button: prompts yet to arrive on a lane will not; the caller tells the engine."""
        self.stopped = True
        for lane in self.lanes.values():
            lane.stop()

    @property
    def done(self) -> bool:
        """The engine said the race is over (its walls are then each lane's clock at its last step)."""
        return self.ended

    @property
    def completed(self) -> bool:
        """Every prompt ran to its end on every lane: the speed-up is a fair one."""
        return not self.stopped and self.error is None and all(lane.completed for lane in self.lanes.values())

    def runs(self) -> dict[str, RunRecord]:
        return {mode: lane.record for mode, lane in self.lanes.items()}

    def labels(self) -> dict[str, str]:
        return self.lanes[MODES[0]].labels()

    def latency_frame(self, mode: str) -> pd.DataFrame:
        """A lane's latency bars; its unfinished requests end at the lane's clock now."""
        return self.lanes[mode].latency_frame(self.elapsed[mode])

    def lane_line(self, mode: str) -> str:
        counts = self.lanes[mode].counts()
        clock = self.elapsed[mode]
        kind = steps_kind(self.lanes[mode].record)
        return f"{mode}: {counts['done']} of {len(self.views)} done at {clock:.2f} s ({kind})"

    def progress_line(self) -> str:
        """Where each lane stands, on its own clock: both clocks are kept within one step of each other."""
        verb = "running" if not self.done else "stopped" if self.stopped else "finished"
        parts = [self.lane_line(mode) for mode in self.lanes]
        running = [self.elapsed[m] for m, lane in self.lanes.items() if not lane.done]
        if len(running) > 1:
            parts.append("at the same compute time")
        return f"**{verb}** · " + " · ".join(parts)

    def speedup(self) -> float:
        """Static's clock over continuous's, once both are done (nan before)."""
        walls = {mode: lane.record.wall_s for mode, lane in self.lanes.items()}
        if not all(math.isfinite(w) and w > 0 for w in walls.values()):
            return math.nan
        return walls["static"] / walls["continuous"]
