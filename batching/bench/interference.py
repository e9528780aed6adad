"""Prefill/decode interference, measured (a table and JSON, not a test):

    python -m batching.bench interference --threads 1 --json interference.json

Seven requests decode on a continuous batcher; after a few steps a long prompt arrives. A step that computes its
prompt computes the decoding rows too, so every decoding request waits for that step: its inter-token gap jumps.
The per-step token budget (vLLM's max_num_batched_tokens, the chunk size of chunked prefill) decides how much of
the prompt one step takes. For each budget: the long prompt's steps, the decoding requests' worst and median gap,
and the long prompt's time to first token, on the batcher's own clock (eager steps, the embedded model by default).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence

import torch

from batching.bench import options
from batching.bench.options import BadInput
from batching.engine.batcher import Batcher
from batching.engine.events import RowKind, StepEvent, TokenEvent
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams
from config.settings import ModelSettings, load_settings
from model.loader import LoadedModel, load_model
from utils.export import json_safe

DECODERS = 7
DECODE_CAP = 48
JOIN_AT_STEP = 8


def measure(loaded: LoadedModel, budget: int, prompt_tokens: int) -> dict:
    """One run at one token budget: seven decoding requests, then the long prompt joining at step 8."""
    options = BatcherOptions(max_batch_size=DECODERS + 1, max_batched_tokens=budget, max_prompt_tokens=prompt_tokens)
    batcher = Batcher(loaded.model, loaded.tokenizer, options)
    vocab = len(loaded.tokenizer)
    for index in range(DECODERS):
        batcher.add([10 + index, 20 + index, 30 + index], RequestParams(DECODE_CAP, ignore_eos=True))
    long_prompt = [3 + (index * 7) % (vocab - 3) for index in range(prompt_tokens)]
    joined, events = None, []
    while batcher.has_work:
        if batcher.step_index == JOIN_AT_STEP and joined is None:
            joined = batcher.add(long_prompt, RequestParams(4, ignore_eos=True))
        events += batcher.step()
    assert joined is not None
    long_id = joined.request_id
    steps = [e for e in events if isinstance(e, StepEvent)]
    prompt_steps = [s for s in steps if any(r.request_id == long_id and r.kind is RowKind.PREFILL for r in s.rows)]
    last: dict[str, float] = {}
    gaps, stalled = [], []
    windows = [(s.start, s.end) for s in prompt_steps]
    for token in (e for e in events if isinstance(e, TokenEvent) and e.request_id != long_id):
        before = last.get(token.request_id)
        last[token.request_id] = token.time
        if before is not None:
            gap = token.time - before
            gaps.append(gap)
            if any(start < token.time <= end + 1e-9 for start, end in windows):
                stalled.append(gap)
    first = next(e.time for e in events if isinstance(e, TokenEvent) and e.request_id == long_id)
    return {
        "budget": budget,
        "prompt_tokens": prompt_tokens,
        "prompt_steps": len(prompt_steps),
        "worst_gap_ms": max(stalled or gaps) * 1000,
        "median_gap_ms": statistics.median(gaps) * 1000,
        "long_prompt_ttft_ms": (first - joined.times.arrival) * 1000,
    }


def format_table(rows: Sequence[dict]) -> str:
    header = (
        "| token budget | prompt steps | decoders' worst gap (ms) | decoders' median gap (ms) | long prompt TTFT (ms) |"
    )
    lines = [header, "|---|---|---|---|---|"]
    for row in rows:
        lines.append(
            f"| {row['budget']} | {row['prompt_steps']} | {row['worst_gap_ms']:.1f} | {row['median_gap_ms']:.1f} "
            f"| {row['long_prompt_ttft_ms']:.1f} |"
        )
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Interference's flags."""
    options.add(parser, "--model", said="the settings', the embedded one")
    parser.add_argument("--budgets", default="512,128,32", help="token budgets to compare (comma-separated)")
    parser.add_argument("--prompt-tokens", type=int, default=480, help="the long prompt's length in tokens")
    options.add(parser, "--repeat", 3)
    options.add(parser, "--threads", 1)
    options.add_all(parser, "--json")


def run(args: argparse.Namespace) -> int:
    """`python -m batching.bench interference`: each budget's median run, as a table."""
    budgets = [int(value) for value in args.budgets.split(",")]
    if any(budget <= DECODERS + 1 for budget in budgets):
        raise BadInput(f"--budgets={args.budgets} is not allowed: each must exceed {DECODERS + 1} (the slots)")
    torch.set_num_threads(args.threads)
    settings = load_settings()
    model_settings = settings.model if args.model is None else ModelSettings(name_or_path=args.model)
    loaded = load_model(model_settings.model_copy(update={"device": "cpu", "dtype": "float32"}))
    rows = []
    for budget in budgets:
        runs = sorted(
            (measure(loaded, budget, args.prompt_tokens) for _ in range(args.repeat)), key=lambda r: r["worst_gap_ms"]
        )
        rows.append(runs[len(runs) // 2])
    print(
        f"{loaded.name}, {DECODERS} requests decoding, a {args.prompt_tokens}-token prompt joining at step "
        f"{JOIN_AT_STEP}, {args.threads} thread(s), median of {args.repeat}"
    )
    print(format_table(rows))
    if args.json:
        args.json.write_text(json.dumps(json_safe(rows), indent=2), encoding="utf-8")
    return 0
