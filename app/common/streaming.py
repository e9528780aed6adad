"""The body of the page's streaming loop, without Streamlit: submit prompts as they come due, fold the engine's
events into the run, and decide what the page should redraw (throttled, because every redraw costs the engine
thread time: it shares the GIL with the script drawing the page).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from app.common.live_run import LiveRun, RequestView
from app.common.prompt_queue import QueueItem
from batching.engine.events import Event
from batching.engine.params import RequestParams

# While streaming, answers are redrawn at most this often, and charts at most this often (and then only after
# waiting 4x as long as they took to draw).
TEXT_REDRAW_S = 0.1
CHART_REDRAW_S = 0.5
CHART_COST_FACTOR = 4


class Submission(Protocol):
    """What the engine says of a request it took (`batching.service.Submitted`)."""

    @property
    def request_id(self) -> str: ...

    @property
    def arrival(self) -> float: ...


class EngineSession(Protocol):
    """What the loop needs of a tab's handle on the shared engine (`batching.service.Session`)."""

    def submit(self, prompt: str, params: RequestParams) -> Submission: ...

    def poll(self, timeout: float = 0.0) -> list[Event]: ...


@dataclass(frozen=True)
class Redraw:
    """What changed since the last tick and should be drawn now."""

    now: float
    answers: list[tuple[int, RequestView]] = field(default_factory=list)  # (index on the page, view)
    progress: bool = False
    live_charts: bool = False
    done: bool = False
    superseded: bool = False  # a newer script run of the tab follows the run now: this one stops


def join_new_items(
    run: LiveRun, items: Iterable[QueueItem], joined: set[int], formatted: Callable[[str], str], now: float
) -> list[RequestView]:
    """Queue items not yet in the run join it now (the engine is shared and keeps going); `joined` is updated."""
    views = []
    for item in items:
        if item.item_id not in joined:
            joined.add(item.item_id)
            views.append(run.plan(item.prompt, formatted(item.prompt), item.max_new_tokens, now - run.start))
    return views


def shown(view: RequestView) -> tuple[str, str]:
    """What a prompt's placeholder shows: its status line and its answer so far."""
    return view.status_line(), view.shown_text()


class RedrawPacing:
    """When a streaming loop redraws: answers at most every `text_every_s`, charts at most every `chart_every_s`
    and then only after waiting `CHART_COST_FACTOR` times as long as they took to draw."""

    def __init__(self, clock: Callable[[], float], text_every_s: float, chart_every_s: float) -> None:
        self.clock = clock
        self.text_every_s = text_every_s
        self.chart_every_s = chart_every_s
        self._last_text = 0.0
        self._next_chart = 0.0

    def text_due(self, now: float, done: bool) -> bool:
        """Whether answers are redrawn at `now` (always once the run is done); if so, the interval restarts."""
        if now - self._last_text >= self.text_every_s or done:
            self._last_text = now
            return True
        return False

    def charts_due(self, now: float, done: bool) -> bool:
        return now >= self._next_chart or done

    def charts_drawn(self, started: float) -> None:
        """The page drew the charts of the tick at `started`: the next chart redraw waits in proportion."""
        self._next_chart = started + max(self.chart_every_s, CHART_COST_FACTOR * (self.clock() - started))

    def pause(self) -> float:
        """Seconds to sleep before the next tick, so answers are not redrawn more often than every interval."""
        return max(0.0, self._last_text + self.text_every_s - self.clock())


class RunStream(RedrawPacing):
    """One script run's view of a live run: `tick()` until `Redraw.done`, sleeping `pause()` in between.

    A click elsewhere starts a new script run, which makes a new `RunStream` on the same `LiveRun` (taking its baton,
    `app.common.baton`) before it draws every view afresh, and picks up where the last one left off; the old one's next
    tick says it is superseded, without polling.
    """

    def __init__(
        self,
        run: LiveRun,
        session: EngineSession,
        compare: bool,
        clock: Callable[[], float] = time.perf_counter,
        text_every_s: float = TEXT_REDRAW_S,
        chart_every_s: float = CHART_REDRAW_S,
    ) -> None:
        super().__init__(clock, text_every_s, chart_every_s)
        self.run = run
        self.session = session
        self.compare = compare
        self.follower = run.baton.take()
        self._drawn = {view.number: shown(view) for view in run.views}

    def submit_due(self, now: float) -> None:
        """Send every planned prompt whose arrival time has come; a refusal ends that prompt with the message."""
        for view in self.run.due(now):
            try:
                request = self.session.submit(view.formatted, self.run.params(view))
            except (ValueError, RuntimeError) as exc:
                self.run.refuse(view, str(exc))
            else:
                self.run.submitted(view, request.request_id, request.arrival)

    def tick(self) -> Redraw:
        """Submit what is due, wait up to one text interval for events and fold them in; say what to redraw."""
        run = self.run
        with self.follower.following() as following:
            if not following:
                return Redraw(self.clock(), superseded=True)
            self.submit_due(self.clock())
            run.fold(self.session.poll(timeout=self.text_every_s))
        now = self.clock()
        answers = self._changed_answers(run.views) if self.text_due(now, run.done) else []
        charts = self.charts_due(now, run.done)
        # When the comparison follows, its replays' charts come next: spare the browser a redraw while they run.
        comparing = run.done and self.compare and run.completed
        return Redraw(now, answers, progress=charts, live_charts=charts and not comparing, done=run.done)

    def _changed_answers(self, views: Sequence[RequestView]) -> list[tuple[int, RequestView]]:
        changed = []
        for index, view in enumerate(views):
            now_shown = shown(view)
            if self._drawn.get(view.number) != now_shown:
                self._drawn[view.number] = now_shown
                changed.append((index, view))
        return changed


class RaceEnd(Protocol):
    """The engine's word that a race is over (`batching.service.messages.RaceEnded`): the race view's loop and the
    sweep's read it alike."""

    @property
    def walls(self) -> tuple[tuple[str, float, float], ...]: ...

    @property
    def error(self) -> str | None: ...

    @property
    def clock(self) -> str: ...
