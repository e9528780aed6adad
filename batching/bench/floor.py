"""The raw-matmul floor of a decode step, and our decode step beside it, measured alternately in one run.

The floor is the same maths as the model's linear layers for one `rows`-row decode step, done as one raw matmul
per input width over all the weights of that width (every weight read once, no attention, no elementwise ops), and
each quantised layer's own kernel called once on its packed weights: what a step would cost with zero overhead.
Beneath it, the stream: one pass reading as many bytes as the weights take, the memory's own floor for a step that
must read every weight once. Our step is a real `ModelRunner` decode step over `history` cached
tokens, eager and (once its graph is made) compiled; on a GPU the compiled step replays its CUDA graph, and is timed
without it too.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from batching.engine.runner import ModelRunner
from model.gptq import layer_width, quantized_layers

ROUNDS = 7
CALLS = 20


def floor_step(model: PreTrainedModel, rows: int) -> Callable[[], object]:
    """One raw matmul per input width over every linear weight of that width (the LM head included)."""
    widths: dict[int, list[torch.Tensor]] = {}
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            widths.setdefault(module.in_features, []).append(module.weight.detach())
    weights = [torch.cat(group).t().contiguous() for group in widths.values()]
    inputs = [torch.randn(rows, weight.shape[0], dtype=weight.dtype, device=weight.device) for weight in weights]
    quantised = quantized_layers(model)
    dtype = next(model.parameters()).dtype
    layer_inputs = [torch.randn(rows, layer_width(layer)[0], dtype=dtype, device=model.device) for layer in quantised]

    def step() -> object:
        raw = [torch.mm(x, weight) for x, weight in zip(inputs, weights, strict=True)]
        return raw + [layer(x) for layer, x in zip(quantised, layer_inputs, strict=True)]

    return step


def stream_step(model: PreTrainedModel) -> Callable[[], object]:
    """One read of as many bytes as the model's weights (parameters and packed buffers) take."""
    size = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    data = torch.ones(size // 4, dtype=torch.float32, device=model.device)
    return data.sum


def decode_step(
    model: PreTrainedModel,
    rows: int,
    history: int,
    token_id: int,
    compiled: bool,
    autotune: bool = True,
    cuda_graphs: bool = False,
) -> Callable[[], object]:
    """A decode step of `rows` rows over `history` cached tokens on a runner of its own; the cache never grows."""
    runner = ModelRunner(
        model,
        rows,
        history + 64,
        token_id,
        compile_steps=compiled,
        compile_autotune=autotune,
        cuda_graphs=cuda_graphs,
    )
    for row in range(rows):
        runner.claim(f"floor{row}")
    with torch.inference_mode():
        runner.forward([[token_id] * history] * rows)
    if runner.compiler is not None:
        runner.compiler.compile_now()
    tokens = [[token_id]] * rows

    def step() -> object:
        logits = runner.forward(tokens)
        for row in range(rows):
            runner.cache.lengths[row] -= 1
        return logits

    return step


def measure_floor(
    model: PreTrainedModel, rows: int = 8, history: int = 100, token_id: int = 0, autotune: bool = True
) -> dict:
    """Median ms per call of the floor and our eager and compiled decode steps, rounds alternating between them
    (on a GPU the compiled step with its CUDA graph and without, each call's kernels finished before the clock)."""
    gpu = model.device.type == "cuda"
    steps = {
        "stream": stream_step(model),
        "floor": floor_step(model, rows),
        "eager": decode_step(model, rows, history, token_id, compiled=False),
        "compiled": decode_step(model, rows, history, token_id, compiled=True, autotune=autotune, cuda_graphs=gpu),
    }
    if gpu:
        steps["compiled_no_graphs"] = decode_step(model, rows, history, token_id, compiled=True, autotune=autotune)
    times: dict[str, list[float]] = {name: [] for name in steps}
    with torch.inference_mode():
        for _ in range(ROUNDS):
            for name, step in steps.items():
                step()
                _finish(model)
                start = time.perf_counter()
                for _ in range(CALLS):
                    step()
                _finish(model)
                times[name].append((time.perf_counter() - start) / CALLS * 1000)
    medians = {f"{name}_ms": statistics.median(values) for name, values in times.items()}
    floor = medians["floor_ms"]
    return {
        "rows": rows,
        "history": history,
        **medians,
        **{f"{name}_over_floor": medians[f"{name}_ms"] / floor for name in steps if name not in ("floor", "stream")},
        "compiled_over_stream": medians["compiled_ms"] / medians["stream_ms"],
    }


def _finish(model: PreTrainedModel) -> None:
    """Wait for the device's queued work (a GPU runs a step's kernels after the call returns)."""
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)


def format_floor(figures: dict) -> str:
    return (
        f"floor: a {figures['rows']}-row decode step over {figures['history']} cached tokens, median ms of "
        f"alternating rounds: reading the weights' bytes once {figures['stream_ms']:.2f}, raw matmuls "
        f"{figures['floor_ms']:.2f}, ours eager {figures['eager_ms']:.2f} "
        f"({figures['eager_over_floor']:.2f}x the floor), compiled {figures['compiled_ms']:.2f} "
        f"({figures['compiled_over_floor']:.2f}x the floor, {figures['compiled_over_stream']:.2f}x the stream)"
        + (
            f", compiled without CUDA graphs {figures['compiled_no_graphs_ms']:.2f} "
            f"({figures['compiled_no_graphs_over_floor']:.2f}x)"
            if "compiled_no_graphs_ms" in figures
            else ""
        )
    )
