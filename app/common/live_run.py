"""The live view of a run of the queue: `LiveRun` folds the engine's events into what each prompt's placeholder
shows (status, answer so far) and into a `RunRecord`. Plain Python, so it is tested without Streamlit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import pandas as pd

from app.common.baton import Baton
from batching.arrivals import Schedule
from batching.engine.events import Event, FinishedEvent, StepEvent, TokenEvent
from batching.engine.params import RequestParams, SamplingParams
from batching.engine.request import FinishReason
from batching.runs import RunRecord
from model.prompting import extract_answer
from utils.plain_text import escape_markdown

CURSOR = "▌"
# The comparison replays the queue in this order; drift and warm-up then hit both modes alike, and the faster
# replay of each mode is the one shown (the usual way to time on a busy machine).
REPLAY_ORDER = ("continuous", "static", "static", "continuous")


def request_sampling(sampling: SamplingParams, number: int) -> SamplingParams:
    """Request #`number`'s sampling: the chosen parameters with its own seed, derived from the chosen one."""
    return replace(sampling, seed=sampling.seed + number - 1)


@dataclass
class RequestView:
    """One prompt of a run, as its placeholder shows it."""

    number: int
    prompt: str
    formatted: str
    max_new_tokens: int
    offset_s: float
    request_id: str | None = None
    arrival: float | None = None
    text: str = ""
    tokens: int = 0
    slot: int | None = None
    first_token: float | None = None
    finished: FinishedEvent | None = None
    refused: str | None = None

    @property
    def status(self) -> str:
        if self.refused is not None:
            return "refused"
        if self.finished is not None:
            return "done"
        if self.request_id is None:
            return "scheduled"
        return "waiting" if self.slot is None else "running"

    @property
    def answer(self) -> str:
        return extract_answer(self.text)

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token is None or self.arrival is None else self.first_token - self.arrival

    def shown_text(self) -> str:
        """The answer so far, with a cursor while tokens are still coming."""
        return self.answer + CURSOR if self.status == "running" else self.answer

    def status_line(self) -> str:
        """One line of Markdown (a caption); what the engine or a remote server said in it shows as text."""
        status = self.status
        if status == "refused":
            return f"not run: {escape_markdown(str(self.refused))}"
        if status == "scheduled":
            return f"scheduled: joins {self.offset_s:.1f} s after the start"
        if status == "waiting":
            return "waiting for a free slot"
        finished = self.finished
        if finished is None:  # running: in a slot, tokens coming
            parts = [f"in slot {(self.slot or 0) + 1}"]
        else:
            parts = [_REASONS[finished.reason] + ("" if finished.slot is None else f" (slot {finished.slot + 1})")]
        parts.append(f"{self.tokens} tokens")
        if self.ttft_s is not None:
            parts.append(f"TTFT {self.ttft_s:.2f} s")
        if finished is not None:
            parts.append(f"latency {finished.e2e_s:.2f} s")
            if finished.error:
                parts.append(escape_markdown(finished.error))
        return " · ".join(parts)


_REASONS = {
    FinishReason.EOS: "done",
    FinishReason.LENGTH: "done (hit its cap)",
    FinishReason.STOP: "done (stop string)",
    FinishReason.CANCELLED: "cancelled",
    FinishReason.ERROR: "failed",
}


_NOT_DONE = {FinishReason.CANCELLED: "cancelled", FinishReason.ERROR: "failed"}


@dataclass
class LiveRun:
    """A run of the queue on the shared engine: who is where, the answers so far, and everything measured."""

    start: float
    owner_prefix: str
    slots: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    views: list[RequestView] = field(default_factory=list)
    stopped: bool = False
    others_seen: bool = False
    mode: str = "continuous"

    def __post_init__(self) -> None:
        self.record = RunRecord(self.mode, self.start)
        self.record.slots = self.slots
        self._by_id: dict[str, RequestView] = {}
        self.replays: dict[str, RunRecord] = {}  # mode -> the faster replay of the queue on a private batcher
        self.replayed = 0  # how many of REPLAY_ORDER have run
        self.baton = Baton()  # the script run that follows this run (app.common.baton)

    def owns(self, request_id: str | None) -> bool:
        return request_id is not None and request_id.startswith(self.owner_prefix)

    def plan(self, prompt: str, formatted: str, max_new_tokens: int, offset_s: float) -> RequestView:
        view = RequestView(len(self.views) + 1, prompt, formatted, max_new_tokens, offset_s)
        self.views.append(view)
        return view

    def params(self, view: RequestView) -> RequestParams:
        """What the engine is asked for this prompt, live and in the replays alike. Request #n samples with the
        chosen seed + n - 1: identical prompts get different answers, and the same queue the same answers."""
        return RequestParams(view.max_new_tokens, request_sampling(self.sampling, view.number))

    def due(self, now: float) -> list[RequestView]:
        """Planned prompts whose arrival time has come (in order)."""
        elapsed = now - self.start
        return [v for v in self.views if v.status == "scheduled" and v.offset_s <= elapsed]

    def next_due_s(self) -> float | None:
        scheduled = [v.offset_s for v in self.views if v.status == "scheduled"]
        return min(scheduled) if scheduled else None

    def submitted(self, view: RequestView, request_id: str, arrival: float) -> None:
        """The engine took the prompt. `offset_s` stays as planned: a replay submits at the planned times."""
        view.request_id = request_id
        view.arrival = arrival
        self._by_id[request_id] = view

    def refuse(self, view: RequestView, message: str) -> None:
        view.refused = message

    def stop(self) -> None:
        """The Stop button: planned prompts are dropped here; the caller cancels the engine's ones."""
        self.stopped = True
        for view in self.views:
            if view.status == "scheduled":
                view.refused = "stopped before it was sent"

    def fold(self, events: Sequence[Event]) -> None:
        for event in events:
            self.record.add(event)
            if isinstance(event, StepEvent):
                for slot, request_id in enumerate(event.slots):
                    view = self._by_id.get(request_id) if request_id is not None else None
                    if view is not None and view.finished is None:
                        view.slot = slot
                    elif request_id is not None and not self.owns(request_id):
                        self.others_seen = True
                continue
            view = self._by_id.get(event.request_id)
            if view is None:
                continue
            if isinstance(event, TokenEvent):
                view.text += event.text
                view.tokens += 1
                if view.first_token is None:
                    view.first_token = event.time
            elif isinstance(event, FinishedEvent):
                view.finished = event
                view.text = event.text
                view.tokens = event.output_tokens
                if view.slot is None:
                    view.slot = event.slot
        if self.done and math.isnan(self.record.end):
            ends = [e.finished for e in self.record.finished]
            self.record.end = max(ends) if ends else self.start

    @property
    def done(self) -> bool:
        return all(view.status in ("done", "refused") for view in self.views)

    @property
    def completed(self) -> bool:
        """Every prompt ran to its natural end (no Stop, no refusal, no cancellation): fit for a comparison."""
        return (
            self.done
            and not self.stopped
            and bool(self.views)
            and all(
                v.finished is not None and v.finished.reason not in (FinishReason.CANCELLED, FinishReason.ERROR)
                for v in self.views
            )
        )

    def replay_queue(self) -> tuple[list[tuple[str, RequestParams, str]], Schedule]:
        """The same prompts, caps, sampling and planned arrival moments, to replay on a private batcher.

        The comparison replays the queue on private continuous and static batchers in `REPLAY_ORDER`, so both are
        measured the same way (the live run shared its CPU with the page drawing it, and maybe with other users).
        Returns (prompt, params, request id) items and their arrival schedule.
        """
        views = [view for view in self.views if view.request_id is not None]
        items = [(view.formatted, self.params(view), view.request_id) for view in views if view.request_id]
        return items, Schedule.timed([view.offset_s for view in views])

    def keep_replay(self, record: RunRecord) -> None:
        """A replay is over: its record goes to `replays[record.mode]` if it is that mode's fastest."""
        best = self.replays.get(record.mode)
        if best is None or record.wall_s < best.wall_s:
            self.replays[record.mode] = record
        self.replayed += 1

    @property
    def next_replay(self) -> str | None:
        """The mode to replay next for the comparison, or None when it is complete."""
        return REPLAY_ORDER[self.replayed] if self.replayed < len(REPLAY_ORDER) else None

    def counts(self) -> dict[str, int]:
        """How many prompts are where; a cancelled (Stop) or failed request is not counted as done."""
        counts = dict.fromkeys(("scheduled", "waiting", "running", "done", "cancelled", "failed", "refused"), 0)
        for view in self.views:
            status = view.status
            if view.finished is not None and view.finished.reason in _NOT_DONE:
                status = _NOT_DONE[view.finished.reason]
            counts[status] += 1
        return counts

    def progress_line(self, now: float) -> str:
        """One line over the answers: running/finished/stopped, how many are where, and the time so far."""
        counts = self.counts()
        parts = [f"{counts['done']} of {len(self.views)} done", f"{counts['running']} in a slot"]
        parts.append(f"{counts['waiting']} waiting")
        if counts["scheduled"]:
            parts.append(f"{counts['scheduled']} yet to arrive")
        for status in ("cancelled", "failed"):
            if counts[status]:
                parts.append(f"{counts[status]} {status}")
        if counts["refused"]:
            parts.append(f"{counts['refused']} not run")
        verb = "running" if not self.done else "stopped" if self.stopped else "finished"
        elapsed = (self.record.end if self.done else now) - self.start
        return f"**{verb}** · {' · '.join(parts)} · {elapsed:.1f} s"

    def labels(self) -> dict[str, str]:
        """Request id -> the label charts use for it (#number, as on the page)."""
        return {view.request_id: f"#{view.number}" for view in self.views if view.request_id}

    def latency_frame(self, now: float) -> pd.DataFrame:
        """Per submitted prompt: arrival, first token and end (now for those still going), seconds from the start."""
        rows = []
        for view in self.views:
            if view.arrival is None:
                continue
            end = view.finished.finished if view.finished else now
            first = view.first_token if view.first_token is not None else (None if view.finished else now)
            rows.append(
                {
                    "request": f"#{view.number}",
                    "arrival_s": view.arrival - self.start,
                    "first_token_s": None if first is None else first - self.start,
                    "finished_s": end - self.start,
                    "done": view.finished is not None,
                }
            )
        return pd.DataFrame(rows, columns=["request", "arrival_s", "first_token_s", "finished_s", "done"])
