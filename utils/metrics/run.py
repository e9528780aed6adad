"""Events -> pandas frames and summary figures. The page and the benchmark both read runs through here."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import get_args

import pandas as pd

from batching.engine.events import StepPath, WaitReason
from batching.runs import RunRecord

# A column per wait reason in the steps table and exports: "wait_no_slot", "wait_token_budget", ...
WAIT_COLUMNS = {reason: f"wait_{reason.name.lower()}" for reason in WaitReason}


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between closest ranks (numpy's default); NaN if empty."""
    clean = sorted(v for v in values if v is not None and not math.isnan(v))
    if not clean:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"q={q} is not allowed: must be in [0, 100]")
    rank = (len(clean) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(clean) - 1)
    return clean[low] + (clean[high] - clean[low]) * (rank - low)


def requests_frame(run: RunRecord, order: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per finished request: slot, tokens, reason and latencies (seconds, relative to the run start)."""
    rows = []
    for event in run.finished:
        rows.append(
            {
                "request_id": event.request_id,
                "slot": event.slot,
                "prompt_tokens": event.prompt_tokens,
                "output_tokens": event.output_tokens,
                "finish_reason": event.reason.value,
                "arrival_s": event.arrival - run.start,
                "admitted_s": None if event.admitted is None else event.admitted - run.start,
                "first_token_s": None if event.first_token is None else event.first_token - run.start,
                "finished_s": event.finished - run.start,
                "queue_s": event.queue_s,
                "ttft_s": event.ttft_s,
                "tpot_s": event.tpot_s,
                "e2e_s": event.e2e_s,
                "text": event.text,
                "error": event.error,
            }
        )
    frame = pd.DataFrame(rows, columns=_REQUEST_COLUMNS)
    if order is not None:
        rank = {request_id: i for i, request_id in enumerate(order)}
        frame = frame.sort_values("request_id", key=lambda ids: ids.map(rank)).reset_index(drop=True)
    return frame


_REQUEST_COLUMNS = [
    "request_id",
    "slot",
    "prompt_tokens",
    "output_tokens",
    "finish_reason",
    "arrival_s",
    "admitted_s",
    "first_token_s",
    "finished_s",
    "queue_s",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "text",
    "error",
]


def steps_frame(run: RunRecord) -> pd.DataFrame:
    """One row per engine step: when it ran, how many slots did useful work, and what it computed."""
    rows = [
        {
            "step": event.index,
            "start_s": event.start - run.start,
            "end_s": event.end - run.start,
            "duration_ms": (event.end - event.start) * 1000,
            "active": event.active,
            "held_idle": len(event.idle_held),
            "slots": len(event.slots),
            "occupancy": event.active / len(event.slots) if event.slots else 0.0,
            "prefill_tokens": event.prefill_tokens,
            "decode_tokens": event.decode_tokens,
            "compiled": event.compiled,
            "waiting": len(event.waiting),
            **_wait_counts(event.waiting),
        }
        for event in run.steps
    ]
    return pd.DataFrame(
        rows,
        columns=[
            "step",
            "start_s",
            "end_s",
            "duration_ms",
            "active",
            "held_idle",
            "slots",
            "occupancy",
            "prefill_tokens",
            "decode_tokens",
            "compiled",
            "waiting",
            *WAIT_COLUMNS.values(),
        ],
    )


def _by_reason(waiting: Iterable) -> dict[WaitReason, int]:
    """How many of the waiting entries name each reason, every reason listed, in the reasons' order."""
    counts = dict.fromkeys(WaitReason, 0)
    for entry in waiting:
        counts[entry.reason] += 1
    return counts


def _wait_counts(waiting: Sequence) -> dict[str, int]:
    return {WAIT_COLUMNS[reason]: count for reason, count in _by_reason(waiting).items()}


def wait_reason_counts(run: RunRecord) -> dict[str, int]:
    """Request-steps spent waiting, by reason (a request waiting 3 steps for a slot counts 3), every reason listed."""
    waiting = (entry for step in run.steps for entry in step.waiting)
    return {reason.value: count for reason, count in _by_reason(waiting).items()}


def wait_reasons_frame(runs: dict[str, RunRecord]) -> pd.DataFrame:
    """One row per wait reason, one column per run: request-steps spent waiting for it."""
    table = {mode: wait_reason_counts(run) for mode, run in runs.items()}
    frame = pd.DataFrame(table, index=[reason.value for reason in WaitReason])
    frame.index.name = "why requests waited (request-steps)"
    return frame


def steps_kind(run: RunRecord) -> str:
    """How a run's steps ran, in a few words: eager, compiled, or where its decode steps switched (and how many of
    its steps with prompt chunks ran compiled, when any did; how many called their graph directly, when any did), so
    no figure is read without knowing which."""
    direct = sum(event.path == "direct" for event in run.steps)
    called = f" ({direct} of {len(run.steps)} steps called their graph directly)" if direct else ""
    return _compiled_words(run) + called


def _compiled_words(run: RunRecord) -> str:
    decode = [event for event in run.steps if event.decode_tokens and not event.prefill_tokens]
    prompt = [event for event in run.steps if event.prefill_tokens]
    compiled = [event for event in decode if event.compiled]
    compiled_prompt = sum(event.compiled for event in prompt)
    prompt_note = f", {compiled_prompt} of {len(prompt)} prompt steps compiled" if compiled_prompt else ""
    if not compiled:
        return "eager steps" if not compiled_prompt else f"eager decode steps{prompt_note}"
    if len(compiled) == len(decode):
        return f"compiled decode steps{prompt_note}"
    first = compiled[0].index
    if all(event.compiled for event in decode if event.index >= first):
        return f"eager, then compiled decode steps from step {first + 1}{prompt_note}"
    return f"{len(compiled)} of {len(decode)} decode steps compiled{prompt_note}"


def slot_timeline_frame(run: RunRecord) -> pd.DataFrame:
    """Gantt bars: each stretch of consecutive steps a request sat in a slot, split into working and held-idle."""
    bars: list[dict] = []
    open_bars: dict[int, dict] = {}
    for event in run.steps:
        idle = set(event.idle_held)
        for slot, request_id in enumerate(event.slots):
            state = None if request_id is None else ("held idle" if request_id in idle else "working")
            current = open_bars.get(slot)
            if current and (current["request_id"], current["state"]) == (request_id, state):
                current["end_step"] = event.index + 1
                current["end_s"] = event.end - run.start
                continue
            if current:
                bars.append(open_bars.pop(slot))
            if request_id is not None:
                open_bars[slot] = {
                    "slot": slot,
                    "request_id": request_id,
                    "state": state,
                    "start_step": event.index,
                    "end_step": event.index + 1,
                    "start_s": event.start - run.start,
                    "end_s": event.end - run.start,
                }
    bars.extend(open_bars.values())
    columns = ["slot", "request_id", "state", "start_step", "end_step", "start_s", "end_s"]
    return pd.DataFrame(bars, columns=columns).sort_values(["slot", "start_step"]).reset_index(drop=True)


@dataclass(frozen=True)
class RunSummary:
    """The figures a comparison table shows for one run."""

    mode: str
    wall_s: float
    requests: int
    output_tokens: int
    tokens_per_s: float
    steps: int
    mean_occupancy: float
    ttft_p50: float
    ttft_p99: float
    tpot_p50: float
    tpot_p99: float
    e2e_p50: float
    e2e_p99: float
    waiting: dict[str, int]  # request-steps spent waiting, by reason
    paths: dict[str, int]  # steps by how they ran: eager, compiled (through torch.compile's entry), direct

    def as_dict(self) -> dict:
        return {
            "wall_s": self.wall_s,
            "output_tokens": self.output_tokens,
            "tokens_per_s": self.tokens_per_s,
            "steps": self.steps,
            "mean_occupancy": self.mean_occupancy,
            "ttft_s": {"p50": self.ttft_p50, "p99": self.ttft_p99},
            "tpot_s": {"p50": self.tpot_p50, "p99": self.tpot_p99},
            "e2e_s": {"p50": self.e2e_p50, "p99": self.e2e_p99},
            "waiting_request_steps": dict(self.waiting),
            "steps_by_path": dict(self.paths),
        }


def summarize(run: RunRecord) -> RunSummary:
    """Wall time, throughput, occupancy (working slots / slots, averaged over steps) and latency percentiles."""
    ttft = [e.ttft_s for e in run.finished if e.ttft_s is not None]
    tpot = [e.tpot_s for e in run.finished if e.tpot_s is not None]
    e2e = [e.e2e_s for e in run.finished]
    output_tokens = sum(e.output_tokens for e in run.finished)
    occupancy = [s.active / len(s.slots) for s in run.steps if s.slots]
    wall = run.wall_s
    return RunSummary(
        mode=run.mode,
        wall_s=wall,
        requests=len(run.finished),
        output_tokens=output_tokens,
        tokens_per_s=output_tokens / wall if wall > 0 else math.nan,
        steps=len(run.steps),
        mean_occupancy=sum(occupancy) / len(occupancy) if occupancy else math.nan,
        ttft_p50=percentile(ttft, 50),
        ttft_p99=percentile(ttft, 99),
        tpot_p50=percentile(tpot, 50),
        tpot_p99=percentile(tpot, 99),
        e2e_p50=percentile(e2e, 50),
        e2e_p99=percentile(e2e, 99),
        waiting=wait_reason_counts(run),
        paths={path: sum(step.path == path for step in run.steps) for path in get_args(StepPath)},
    )
