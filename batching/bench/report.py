"""The benchmark's figures: speed-ups, per-mode reports, step-time statistics, and the printed tables."""

from __future__ import annotations

import math
import os
import platform
import statistics
from collections.abc import Sequence
from pathlib import Path

import torch
import transformers

from batching.allocator import allocator_state
from batching.bench.plan import ModeRun, Plan
from batching.command_line import text_table
from batching.engine import huge_pages_state
from batching.engine.events import StepEvent
from batching.engine.omp_wait import wait_policy_state
from model.loader import LoadedModel
from utils.metrics.run import percentile, summarize

# The admission order of the modes that do not take ours (static waves go in arrival order).
PEER_POLICIES = {"static": "fcfs", "hf": "fifo", "llamacpp": "fifo", "vllm": "fcfs"}


def speedup_figures(
    static_wall: float, static_steps: int | None, wall: float, steps: int | None
) -> tuple[float, float, float]:
    """Measured speed-up over static, the one the step counts allow (static steps / these steps), and their ratio."""
    speedup = static_wall / wall if wall > 0 else math.nan
    ideal = static_steps / steps if static_steps and steps else math.nan
    return speedup, ideal, speedup / ideal if ideal > 0 else math.nan


def step_time_stats(run: ModeRun, buckets: int = 4) -> dict:
    """Where the time went: steps with prompt tokens vs decode-only steps, time outside any step, and decode-step
    durations against history (first vs last quarter; by the longest sequence in the step).

    A flat decode step (its cost not growing with the sequence length) shows as `last_over_first` near 1 and
    flat `by_kv_len` rows. `full_batch` repeats the quarters over steps with the most rows, so a batch shrinking
    at the end of a run does not hide growth.
    """
    timed = [
        ((step.end - step.start) * 1000, kv_len, sum(1 for rid in step.slots if rid is not None), step.prefill_tokens)
        for step, kv_len in zip(run.record.steps, run.kv_lens, strict=True)
    ]
    prefill = [ms for ms, _, _, prompt_tokens in timed if prompt_tokens]
    steps = [(ms, kv, rows) for ms, kv, rows, prompt_tokens in timed if not prompt_tokens]
    in_steps = sum(ms for ms, *_ in timed) / 1000
    figures = {
        "in_steps_s": in_steps,
        "outside_steps_s": run.record.wall_s - in_steps if timed else math.nan,
        "prefill_steps": len(prefill),
        "prefill_mean_ms": statistics.fmean(prefill) if prefill else math.nan,
        "prefill_share": sum(prefill) / 1000 / in_steps if in_steps else math.nan,
        "decode_steps": len(steps),
    }
    if not steps:
        return figures
    most_rows = max(rows for *_, rows in steps)
    low = min(kv for _, kv, _ in steps)
    width = max(1, math.ceil((max(kv for _, kv, _ in steps) - low + 1) / buckets))
    by_kv = []
    for bucket in range(buckets):
        inside = [(ms, rows) for ms, kv, rows in steps if low + bucket * width <= kv < low + (bucket + 1) * width]
        if inside:
            by_kv.append(
                {
                    "kv_len": f"{low + bucket * width}-{low + (bucket + 1) * width - 1}",
                    "steps": len(inside),
                    "mean_ms": statistics.fmean(ms for ms, _ in inside),
                    "mean_rows": statistics.fmean(rows for _, rows in inside),
                }
            )
    return {
        **figures,
        "mean_ms": statistics.fmean(ms for ms, *_ in steps),
        "p50_ms": percentile([ms for ms, *_ in steps], 50),
        **_quarters([ms for ms, *_ in steps]),
        "full_batch": {"rows": most_rows, **_quarters([ms for ms, _, rows in steps if rows == most_rows])},
        "by_kv_len": by_kv,
    }


def memory_stats(steps: Sequence[StepEvent]) -> dict | None:
    """KV memory over a run, from each step's view of the block pool: peaks, reserved vs holding tokens,
    preemptions and prefix-cache hits. None for a mode whose steps carry no pool (a peer)."""
    views = [step.memory for step in steps if step.memory is not None]
    if not views:
        return None
    last = views[-1]
    pool = last.usage.total
    reserved = sum(view.reserved for view in views)
    peak_blocks = max(view.usage.in_use for view in views)
    peak_tokens = max(view.tokens for view in views)
    return {
        "block_size": last.block_size,
        "pool_blocks": pool,
        "pool_positions": pool * last.block_size,
        "peak_blocks": peak_blocks,
        "peak_blocks_share": peak_blocks / pool if pool else math.nan,
        "peak_tokens": peak_tokens,  # positions holding a token
        "peak_reserved": max(view.reserved for view in views),  # positions in blocks held by requests
        "used_over_reserved": sum(view.tokens for view in views) / reserved if reserved else math.nan,
        "peak_running": max(step.active for step in steps),
        "preemptions": last.preemptions,
        "prefix_queries": last.prefix_queries,
        "prefix_hits": last.prefix_hits,
        "prefix_hit_rate": last.prefix_hits / last.prefix_queries if last.prefix_queries else math.nan,
    }


def _quarters(durations: Sequence[float]) -> dict:
    quarter = max(1, len(durations) // 4)
    first, last = statistics.fmean(durations[:quarter]), statistics.fmean(durations[-quarter:])
    return {"first_quarter_ms": first, "last_quarter_ms": last, "last_over_first": last / first if first else math.nan}


def mode_report(run: ModeRun, plan: Plan, runs: Sequence[ModeRun]) -> dict:
    """One mode's JSON: the summary of its median run, its requests in workload order, and its step times."""
    summary = summarize(run.record).as_dict()
    by_id = {event.request_id: event for event in run.record.finished}
    requests = []
    for index, prompt in enumerate(plan.prompt_ids):
        event = by_id.get(f"q{index}")
        requests.append(
            {
                "request_id": f"q{index}",
                "prompt_ids": list(prompt),
                "output_ids": list(event.output_ids) if event else [],
                "finish_reason": event.reason.value if event else None,
                "prompt_tokens": len(prompt),
                "output_tokens": event.output_tokens if event else 0,
                "max_new_tokens": plan.caps[index],
                "arrival_s": event.arrival - run.record.start if event else None,
                "queue_s": event.queue_s if event else None,
                "ttft_s": event.ttft_s if event else None,
                "tpot_s": event.tpot_s if event else None,
                "e2e_s": event.e2e_s if event else None,
            }
        )
    if not run.record.steps:  # the peer could not report its steps
        summary["steps"] = summary["mean_occupancy"] = summary["steps_by_path"] = None
    return {
        **summary,
        "policy": PEER_POLICIES.get(run.record.mode, plan.options.policy),
        "cpu_s": run.cpu_s,
        "requests_finished": len(run.record.finished),
        "wall_s_runs": [other.record.wall_s for other in runs],
        "step_time": step_time_stats(run),
        "memory": memory_stats(run.record.steps),
        "requests": requests,
    }


def compare(report: dict[str, dict]) -> None:
    """Add speed-up over static, the ideal from step counts, efficiency, and whether outputs match static.

    The same figures from CPU time (`*_cpu`) are steadier than wall time when other work shares the machine.
    """
    static = report.get("static")
    if static is None:
        return
    for mode, figures in report.items():
        if mode == "static":
            continue
        speedup, ideal, efficiency = speedup_figures(
            static["wall_s"], static["steps"], figures["wall_s"], figures["steps"]
        )
        figures["speedup_vs_static"] = speedup
        figures["ideal_speedup"] = ideal
        figures["efficiency"] = efficiency
        speedup_cpu, _, efficiency_cpu = speedup_figures(
            static["cpu_s"], static["steps"], figures["cpu_s"], figures["steps"]
        )
        figures["speedup_cpu_vs_static"] = speedup_cpu
        figures["efficiency_cpu"] = efficiency_cpu
        pairs = zip(static["requests"], figures["requests"], strict=True)
        mismatched = sum(1 for ours, theirs in pairs if ours["output_ids"] != theirs["output_ids"])
        figures["outputs_match_static"] = mismatched == 0
        figures["requests_differing_from_static"] = mismatched


def host_info() -> dict:
    """The machine this process runs on, without a model (a client of remote servers)."""
    return {"cpu_count": os.cpu_count(), "cpu_model": _cpu_model(), "python": platform.python_version()}


def machine_info(loaded: LoadedModel) -> dict:
    return {
        **host_info(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.version.__version__,
        "transformers": transformers.__version__,
        "device": str(loaded.device),
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "huge_pages": huge_pages_state(),
        "omp_wait_policy": wait_policy_state(),
        "allocator": allocator_state(),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# --- printing -----------------------------------------------------------------------------------------------------
def _fmt(value: float | None, scale: float = 1.0, digits: int = 2) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    if isinstance(value, int) and scale == 1.0:
        return str(value)
    return f"{value * scale:.{digits}f}"


def format_report(result: dict) -> str:
    """The summary table, one row per mode, then decode-step time against sequence length."""
    return "\n".join(
        [
            *_setup_lines(result),
            "",
            _summary_table(result["modes"]),
            "",
            "step time: steps with prompt tokens, and decode-only steps against history",
            _step_time_table(result["modes"]),
            *_memory_lines(result["modes"]),
        ]
    )


def _setup_lines(result: dict) -> list[str]:
    """What was run, and on what."""
    machine = result["machine"]
    return [
        f"workload {result['workload']} ({result['requests']} requests, {result['arrivals']}), "
        f"model {result['model']}, batch size {result['batch_size']}, policy {result['policy']}, max batched tokens "
        f"{result['max_batched_tokens']}, ignore EOS {result['ignore_eos']}, median of {result['repeat']}",
        f"machine: {machine['cpu_count']} x {machine['cpu_model']}, torch {machine['torch']} "
        f"({machine['torch_threads']} threads), transformers {machine['transformers']}, device {machine['device']}, "
        f"dtype {machine['dtype']}, huge pages {machine.get('huge_pages', '-')}, idle OpenMP threads "
        f"{machine.get('omp_wait_policy', '-')}, malloc {machine.get('allocator', '-')}",
    ]


def _summary_table(modes: dict) -> str:
    header = ["mode", "wall s", "cpu s", "out tok", "tok/s", "steps", "occup", "TTFT p50/p99 ms", "TPOT p50/p99 ms"]
    header += ["e2e p50/p99 s", "speed-up", "ideal", "effic", "cpu speed-up", "= static"]
    rows = []
    for mode, figures in modes.items():
        ttft, tpot, e2e = figures["ttft_s"], figures["tpot_s"], figures["e2e_s"]
        match = figures.get("outputs_match_static")
        rows.append(
            [
                mode,
                _fmt(figures["wall_s"]),
                _fmt(figures["cpu_s"]),
                _fmt(figures["output_tokens"]),
                _fmt(figures["tokens_per_s"], digits=1),
                _fmt(figures["steps"]),
                _fmt(figures["mean_occupancy"]),
                f"{_fmt(ttft['p50'], 1000, 1)} / {_fmt(ttft['p99'], 1000, 1)}",
                f"{_fmt(tpot['p50'], 1000, 2)} / {_fmt(tpot['p99'], 1000, 2)}",
                f"{_fmt(e2e['p50'])} / {_fmt(e2e['p99'])}",
                _fmt(figures.get("speedup_vs_static")) + ("x" if "speedup_vs_static" in figures else ""),
                _fmt(figures.get("ideal_speedup")) + ("x" if figures.get("ideal_speedup") else ""),
                _fmt(figures.get("efficiency")),
                _fmt(figures.get("speedup_cpu_vs_static")) + ("x" if "speedup_cpu_vs_static" in figures else ""),
                "-" if match is None else ("yes" if match else f"no ({figures['requests_differing_from_static']})"),
            ]
        )
    return text_table(header, rows, gap="  ")


def _memory_lines(modes: dict) -> list[str]:
    """KV memory of our modes (the peers report none): nothing when no mode has a block pool."""
    ours = {mode: figures["memory"] for mode, figures in modes.items() if figures.get("memory")}
    if not ours:
        return []
    header = ["mode", "pool blocks x size", "peak blocks", "peak tokens", "peak reserved", "used/reserved"]
    header += ["most running", "preemptions", "prefix hits / queries (rate)"]
    rows = [
        [
            mode,
            f"{memory['pool_blocks']} x {memory['block_size']}",
            f"{memory['peak_blocks']} ({_fmt(memory['peak_blocks_share'], 100, 0)}%)",
            f"{memory['peak_tokens']} ({_fmt(memory['peak_tokens'] / memory['pool_positions'], 100, 0)}%)",
            str(memory["peak_reserved"]),
            f"{_fmt(memory['used_over_reserved'], 100, 0)}%",
            str(memory["peak_running"]),
            str(memory["preemptions"]),
            f"{memory['prefix_hits']} / {memory['prefix_queries']} ({_fmt(memory['prefix_hit_rate'], 100, 0)}%)",
        ]
        for mode, memory in ours.items()
    ]
    title = "KV memory: blocks held by requests, positions holding tokens, and the pool's reuse"
    return ["", title, text_table(header, rows, gap="  ")]


def _step_time_table(modes: dict) -> str:
    header = ["mode", "outside steps s", "prompt steps", "ms", "share", "decode steps", "mean ms", "1st quarter"]
    header += ["last quarter", "last/1st", "full batch last/1st", "by longest sequence (tokens: ms @ rows)"]
    rows = []
    for mode, figures in modes.items():
        stats = figures["step_time"]
        prompt = [
            _fmt(stats["outside_steps_s"]),
            str(stats["prefill_steps"]),
            _fmt(stats["prefill_mean_ms"]),
            _fmt(stats["prefill_share"]),
        ]
        if not stats["decode_steps"]:
            rows.append([mode, *prompt, "0", *["-"] * 6])
            continue
        full = stats["full_batch"]
        buckets = ", ".join(f"{b['kv_len']}: {b['mean_ms']:.2f} @ {b['mean_rows']:.1f}" for b in stats["by_kv_len"])
        rows.append(
            [
                mode,
                *prompt,
                str(stats["decode_steps"]),
                _fmt(stats["mean_ms"]),
                _fmt(stats["first_quarter_ms"]),
                _fmt(stats["last_quarter_ms"]),
                _fmt(stats["last_over_first"]),
                f"{_fmt(full['last_over_first'])} ({full['rows']} rows)",
                buckets,
            ]
        )
    return text_table(header, rows, gap="  ")
