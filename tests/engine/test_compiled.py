"""Compiled decode steps: token for token equal to `generate`, one graph with no graph breaks, the engine
answering while the graph is made, a ready graph running while another is made and a step its guards refuse
running eager while the graph is made again in the background (no step ever compiles), a small model's decode graph
from the C++ GEMM templates alone (made again with every kernel where they cannot make it), and a graph that cannot
be made, or fails at run time, leaving the steps eager without failing a request. The disk cache: test_graph_cache."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch._dynamo.convert_frame import compile_lock
from torch._dynamo.utils import counters
from transformers import GPT2LMHeadModel, LlamaForCausalLM

from batching.engine import compiled
from batching.engine.batcher import Batcher
from batching.engine.compiled import (
    TEMPLATES_ONLY_MAX_WEIGHT,
    StepCompiler,
    fits_prompt_graph,
    pause_compiles,
    templates_beside,
    templates_only,
)
from batching.engine.events import Event, StepEvent, TokenEvent
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams
from batching.engine.runner import DIRECT_CHECKS, ModelRunner
from batching.runs import RunRecord
from tests.engine.families import family
from tests.engine.helpers import (
    door_open,
    finished_by_id,
    loaded,
    random_prompts,
    ready_path,
    reference,
    run_with_late_arrivals,
    steps_of,
)
from tests.helpers import ROOT
from tests.tiny_models import TINY_CONFIGS, save_tiny_models
from utils.metrics.run import steps_kind

CAPS = [40, 3, 25, 60, 9, 33]
# The C++ GEMM templates need the weights frozen into the graph: through the door only.
door_only = pytest.mark.skipif(not door_open(), reason="the door to torch's internals is closed: no frozen weights")


def test_compiled_steps_equal_generate_token_for_token_with_one_graph_and_no_breaks() -> None:
    # The embedded model with the default, autotuned kernels; every family's graph, untimed, is checked by the
    # families matrix (tests/engine/test_families.py).
    model = loaded(str(ROOT / "model" / "builtin"))
    prompts = random_prompts(len(CAPS), vocab=300, seed=4, longest=30)
    expected = [reference(model.model, p, c, ignore_eos=True) for p, c in zip(prompts, CAPS, strict=True)]
    options = BatcherOptions(max_batch_size=4, max_batched_tokens=24, max_seq_len=128, compile_steps=True)
    batcher = Batcher(model.model, model.tokenizer, options)
    compiler = batcher.runner.compiler
    assert compiler is not None
    graphs, breaks = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
    compiler.compile_now()
    assert compiler.ready and not compiler.failed
    # A small model's decode graph: its linear layers from the C++ templates only (they need frozen weights).
    assert compiler.templates == door_open()
    compiled_before = batcher.runner.compiled_steps
    outputs = run_with_late_arrivals(batcher, prompts, CAPS, late_from=4, join_at_step=3, ignore_eos=True)
    for i, want in enumerate(expected):
        assert outputs[i] == want, f"request {i} (prompt {len(prompts[i])}, cap {CAPS[i]}) differs"
    # Histories from under 32 to over 90 columns, rows from 4 down to 1: still the one graph made up front (two on
    # the public route: traced as it came, then with other sizes, which dynamo made symbolic).
    assert batcher.runner.compiled_steps - compiled_before > 40
    assert counters["stats"]["unique_graphs"] - graphs <= (1 if door_open() else 2)
    assert sum(counters["graph_break"].values()) == breaks


@door_only
def test_small_models_decode_graphs_take_the_cpp_templates_only_when_autotuned_on_a_cpu() -> None:
    small = LlamaForCausalLM(TINY_CONFIGS["llama"])
    assert templates_only(small, autotune=True, kind="decode")
    assert not templates_only(small, autotune=False, kind="decode")  # no autotuning: no templates at all
    assert not templates_only(small, autotune=True, kind="mixed")  # prompt steps keep oneDNN's large-M matmuls
    wide = LlamaForCausalLM(replace(TINY_CONFIGS["llama"], intermediate_size=TEMPLATES_ONLY_MAX_WEIGHT // 64 + 1))
    assert not templates_only(wide, autotune=True, kind="decode")  # one linear weight over the limit
    gpt2 = GPT2LMHeadModel(TINY_CONFIGS["gpt2"])  # its projections are Conv1D weights, not linear layers
    assert not templates_only(gpt2, autotune=True, kind="decode")


@door_only
def test_a_large_models_decode_graph_keeps_the_mix_and_gets_a_second_one_from_the_templates() -> None:
    wide = LlamaForCausalLM(replace(TINY_CONFIGS["llama"], intermediate_size=TEMPLATES_ONLY_MAX_WEIGHT // 64 + 1))
    assert templates_beside(wide, autotune=True, kind="decode") and not templates_only(wide, True, "decode")
    assert not templates_beside(wide, autotune=False, kind="decode")
    assert not templates_beside(wide, autotune=True, kind="mixed")
    small = LlamaForCausalLM(TINY_CONFIGS["llama"])
    assert not templates_beside(small, autotune=True, kind="decode")  # its one graph is the templates' already
    assert not templates_beside(GPT2LMHeadModel(TINY_CONFIGS["gpt2"]), autotune=True, kind="decode")


@door_only
@pytest.mark.long
def test_each_row_counts_decode_steps_take_the_faster_of_two_graphs_token_for_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A model over the limit has a main decode graph (autotuning's mix) and a second from the C++ templates alone;
    # each row count's first steps alternate between the two, then the faster takes them (`graph_choice`, tested
    # with given times). The limit lowered, a tiny model has both; its main graph's autotuning is ATen's kernels alone.
    monkeypatch.setattr(compiled, "TEMPLATES_ONLY_MAX_WEIGHT", 0)
    monkeypatch.setitem(compiled.AUTOTUNE_OPTIONS, "max_autotune_gemm_backends", "ATEN")
    model = loaded(str(save_tiny_models(tmp_path, {"llama": TINY_CONFIGS["llama"]})["llama"]))
    options = BatcherOptions(max_batch_size=4, max_batched_tokens=24, max_seq_len=128, compile_steps=True)
    batcher = Batcher(model.model, model.tokenizer, options)
    runner = batcher.runner
    main, second = runner.compiler, runner.templates_compiler
    assert main is not None and second is not None and runner.compilers() == [main, second]
    assert not main.templates and second.templates and second.what == "C++-template decode step"
    assert all(compiler.compile_now() is not None for compiler in runner.compilers())
    prompts = random_prompts(len(CAPS), vocab=300, seed=6, longest=30)
    expected = [reference(model.model, p, c, ignore_eos=True) for p, c in zip(prompts, CAPS, strict=True)]
    events: list[Event] = []
    outputs = run_with_late_arrivals(
        batcher, prompts, CAPS, late_from=4, join_at_step=3, ignore_eos=True, events=events
    )
    for i, want in enumerate(expected):
        assert outputs[i] == want, f"request {i} (prompt {len(prompts[i])}, cap {CAPS[i]}) differs"
    # Full batches (4 rows) and the last request alone (1 row) ran on both graphs before one was chosen for each.
    assert {1, 4} <= set(runner.graph_choice.chosen())
    assert {step.path for step in steps_of(events)} >= {"direct"} and not second.failed


@door_only
@pytest.mark.long
def test_a_decode_graph_the_templates_cannot_make_alone_is_made_with_every_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Gemma's attention is not the paged operator's: its decode graph holds batched matmuls, which have no C++
    # template. The second try's autotuning is ATen's kernels alone here (seconds, not a minute of timing templates).
    monkeypatch.setitem(compiled.AUTOTUNE_OPTIONS, "max_autotune_gemm_backends", "ATEN")
    folder = save_tiny_models(tmp_path, {"gemma": family("gemma").config()})["gemma"]
    model = loaded(str(folder))
    options = BatcherOptions(max_batch_size=3, max_batched_tokens=32, max_seq_len=64, compile_steps=True)
    batcher = Batcher(model.model, model.tokenizer, options)
    compiler = batcher.runner.compiler
    assert compiler is not None and compiler.templates
    with caplog.at_level(logging.INFO, logger="batching.engine.compiled"):
        assert compiler.compile_now() is not None
    assert compiler.ready and not compiler.failed and not compiler.templates
    assert any("C++ templates alone did not compile" in record.getMessage() for record in caplog.records)
    prompt, cap = [5, 6, 7, 8], 12
    batcher.add(prompt, RequestParams(cap, ignore_eos=True))
    events = list(batcher.run())
    assert [path for path in (step.path for step in steps_of(events)) if path != "eager"]  # the graph ran
    finished = list(finished_by_id(events).values())
    assert list(finished[0].output_ids) == reference(model.model, prompt, cap, ignore_eos=True)


def test_the_prompt_graph_takes_small_steps_and_many_short_chunks_but_not_a_long_chunk_in_a_big_step() -> None:
    assert fits_prompt_graph(128, 128) and fits_prompt_graph(47, 40)  # small steps, whatever their chunks
    assert fits_prompt_graph(312, 39) and fits_prompt_graph(512, 64)  # a first wave of short prompts
    assert not fits_prompt_graph(129, 65) and not fits_prompt_graph(207, 200) and not fits_prompt_graph(300, 300)


def test_the_prompt_graph_takes_every_step_whose_attention_reads_through_the_tables() -> None:
    for tokens, longest in [(47, 40), (129, 65), (207, 200), (300, 300), (512, 505)]:
        assert fits_prompt_graph(tokens, longest, through_tables=True)


@pytest.mark.long
def test_prompts_short_and_long_go_through_the_prompt_graph_when_attention_reads_through_the_tables(
    tiny_model_dirs,
) -> None:
    # Qwen2: graphs made in this process stay in inductor's memory, and the test below times a compile of the llama.
    model = loaded(str(tiny_model_dirs["qwen2"]))
    options = BatcherOptions(
        max_batch_size=4,
        max_batched_tokens=256,
        max_seq_len=256,
        compile_steps=True,
        compile_autotune=False,
        compile_prompt_steps=True,
    )
    batcher = Batcher(model.model, model.tokenizer, options)
    runner = batcher.runner
    assert runner.compiler is not None and runner.mixed_compiler is not None
    assert runner.compiler.compile_now() is not None and runner.mixed_compiler.compile_now() is not None
    assert runner._reading_tables()  # the graphs' compile loaded the paged-decode operator
    rng_prompts = random_prompts(8, vocab=300, seed=21, longest=2)
    waves = {
        "four 40-token prompts (160 tokens)": [[*p, *range(10, 49)] for p in rng_prompts[:4]],
        "a 100-token prompt beside three of 20": [[*rng_prompts[4], *range(10, 109)]]
        + [[*p, *range(50, 69)] for p in rng_prompts[5:]],
        "one 200-token prompt": [[*rng_prompts[0], *range(20, 219)]],
    }
    for wave in waves.values():
        requests = [batcher.add(prompt, RequestParams(6, ignore_eos=True)) for prompt in wave]
        events = list(batcher.run())
        admission = next(event for event in events if isinstance(event, StepEvent))
        assert admission.prefill_tokens == sum(len(prompt) for prompt in wave)  # every prompt whole, in one step
        assert admission.compiled
        for request, prompt in zip(requests, wave, strict=True):
            assert request.output_ids == reference(model.model, prompt, 6, ignore_eos=True)
    assert not runner.mixed_compiler.failed


@pytest.mark.long
def test_the_batcher_answers_while_its_graph_is_made_then_switches_to_it(
    tiny_model_dirs, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # An empty compile cache: one left by an earlier run (torch's default is under /tmp) would make the graph at
    # once, and there would be no compiling to answer through.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    model = loaded(str(tiny_model_dirs["llama"]))
    # Three slots: a shape no other test compiles on this model, so the graph is made here, in the background
    # (without timing its kernels: the autotuned graph is tested above, this is about the steps around the compile).
    options = BatcherOptions(
        max_batch_size=3, max_batched_tokens=64, max_seq_len=512, compile_steps=True, compile_autotune=False
    )
    batcher = Batcher(model.model, model.tokenizer, options)
    compiler = batcher.runner.compiler
    assert compiler is not None and not compiler.ready
    steps_while_compiling = 0
    tokens = 0
    record = RunRecord("continuous", 0.0)
    while not compiler.ready and not compiler.failed:
        if not batcher.has_work:
            batcher.add([5, 6, 7], RequestParams(400, ignore_eos=True))
        events = batcher.step()
        record.extend(events)
        tokens += sum(1 for event in events if isinstance(event, TokenEvent))
        steps_while_compiling += 1
        assert steps_while_compiling < 100_000, "the graph was never made"
    assert not compiler.failed
    # Steps went on, eager, while the graph was made (how many depends on the machine's speed: not asserted).
    assert steps_while_compiling >= 1 and tokens >= 1
    assert not any(step.compiled for step in record.steps)  # and each said so
    assert steps_kind(record) == "eager steps"
    switch = len(record.steps)
    # Five decode steps (a request that ends among them gives way to a new one, whose prompt step runs eager).
    while sum(not step.prefill_tokens for step in record.steps[switch:]) < 5:
        if not batcher.has_work:
            batcher.add([5, 6, 7], RequestParams(400, ignore_eos=True))
        record.extend(batcher.step())
    decode = [step for step in record.steps[switch:] if not step.prefill_tokens]
    # The next decode steps took the graph (through the door, by its direct call, made and checked while the graph
    # was made).
    assert compiler.direct.checked == (DIRECT_CHECKS if door_open() else 0)
    assert [step.path for step in decode] == [ready_path()] * 5
    direct = f" (5 of {len(record.steps)} steps called their graph directly)" if door_open() else ""
    assert steps_kind(record) == f"eager, then compiled decode steps from step {decode[0].index + 1}{direct}"


def thread_cpu_s(native_id: int) -> float:
    """CPU seconds a thread of this process has used (user + system, from /proc)."""
    fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_background_compile_sleeps_while_compiles_are_paused_then_finishes(
    tiny_model_dirs, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # nothing to find: a real compile
    model = loaded(str(tiny_model_dirs["llama"])).model
    # Five slots: a shape no other test compiles.
    runner = ModelRunner(model, capacity=5, max_len=64, pad_token_id=0, compile_steps=True, compile_autotune=False)
    compiler = runner.compiler
    assert compiler is not None
    pause_compiles(True)
    try:
        compiler.start()
        assert compiler._thread is not None and compiler._thread.native_id is not None
        time.sleep(1.0)  # the thread reaches its first Python call and sleeps there
        used = thread_cpu_s(compiler._thread.native_id)
        time.sleep(3.0)
        assert thread_cpu_s(compiler._thread.native_id) - used < 0.1, "the compile went on while paused"
        assert not compiler.ready
    finally:
        pause_compiles(False)
    compiler._thread.join(600)
    assert compiler.ready and not compiler.failed


def test_compiled_steps_are_off_unless_asked() -> None:
    model = loaded(str(ROOT / "model" / "builtin"))
    assert Batcher(model.model, model.tokenizer, BatcherOptions(max_batch_size=2)).runner.compiler is None


@pytest.mark.long
def test_two_models_of_one_architecture_each_step_on_their_own_weights() -> None:
    # Compiled graphs hold the weights as constants and skip guards on modules: a graph made for one model must
    # never serve another of the same class and shapes.
    config = TINY_CONFIGS["llama"]

    def last_logits(model: LlamaForCausalLM, compiled: bool) -> torch.Tensor:
        # Untimed kernels: the weights are frozen into the graph all the same, and it compiles in half the time.
        runner = ModelRunner(model, 4, 64, 0, compile_steps=compiled, compile_autotune=False)
        if runner.compiler is not None:
            assert runner.compiler.compile_now() is not None
        for row in range(3):
            runner.claim(f"r{row}")
        runner.forward([[1, 2, 3], [4, 5], [6]])
        return runner.forward([[7], [8], [9]])

    models = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        models.append(LlamaForCausalLM(config).eval())
    compiled = [last_logits(model, compiled=True) for model in models]
    for model, logits in zip(models, compiled, strict=True):
        torch.testing.assert_close(logits, last_logits(model, compiled=False), atol=1e-4, rtol=1e-4)
    assert (compiled[0] - compiled[1]).abs().max() > 1


def test_a_paused_compile_sleeps_at_a_plain_call_but_never_where_a_frame_may_hold_a_lock() -> None:
    import threading
    import types

    from batching.engine.compiled import _sleep_while_paused

    def call_under(module_name: str) -> threading.Thread:
        """The trace function, called from a frame of `module_name`, in a thread of its own."""
        code = compile("check(sys._getframe(), 'call', None)", f"<{module_name}>", "exec")
        namespace = {"__name__": module_name, "check": _sleep_while_paused, "sys": sys}
        thread = threading.Thread(target=types.FunctionType(code, namespace), daemon=True)
        thread.start()
        return thread

    pause_compiles(True)
    try:
        in_logging = call_under("logging.handlers")  # a handler's lock may be held: no sleep there
        in_logging.join(5)
        assert not in_logging.is_alive()
        plain = call_under("torch._inductor.graph")
        plain.join(1)
        assert plain.is_alive()  # asleep until compiles are released
    finally:
        pause_compiles(False)
    plain.join(5)
    assert not plain.is_alive()


def held_by_another_thread(lock: Any) -> bool:
    """Whether a thread other than this one holds `lock` (an RLock) now."""
    if lock.acquire(blocking=False):
        lock.release()
        return False
    return True


@contextmanager
def held_inside_dynamo(compiler: StepCompiler) -> Iterator[None]:
    """`compiler`'s background compile held (`pause_compiles`, as the engine holds it while a batcher has work) where
    it holds dynamo's one compile lock, until the block ends: any step that compiled, or waited on that lock, would
    wait until then."""
    deadline = time.monotonic() + 600
    while True:
        assert not compiler.ready, "the compile ended before it could be held"
        assert time.monotonic() < deadline, "the compile never took dynamo's compile lock"
        if held_by_another_thread(compile_lock):
            pause_compiles(True)  # it sleeps at its next Python call, inside the compile
            if held_by_another_thread(compile_lock):
                break
            pause_compiles(False)
        time.sleep(0.01)
    try:
        yield
    finally:
        pause_compiles(False)


@contextmanager
def dynamos_compile_lock_held() -> Iterator[None]:
    """Dynamo's compile lock held by another thread, as a compile holds it, until the block ends."""
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with compile_lock:
            taken.set()
            release.wait()

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    taken.wait()
    try:
        yield
    finally:
        release.set()
        holder.join()


def steps_in_a_thread(batcher: Batcher, count: int) -> list[StepEvent]:
    """`count` steps of `batcher` in a thread of their own, with their step events. A step that compiled, or waited on
    dynamo's compile lock while a compile holds it, would never end: that fails here (after 10 minutes)."""
    events: list[Event] = []
    worker = threading.Thread(target=lambda: [events.extend(batcher.step()) for _ in range(count)], daemon=True)
    worker.start()
    worker.join(600)
    assert not worker.is_alive(), "a step waited on dynamo's compile lock: it tried to compile"
    return steps_of(events)


@contextmanager
def tf32_flipped() -> Iterator[None]:
    """TF32 matmuls switched: a global flag every graph's guards check (a CPU step ignores it), so every step misses
    the guards of the graphs made before."""
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = not tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


@pytest.mark.long
def test_a_ready_graph_keeps_running_while_another_is_made_and_no_step_ever_compiles(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A model of its own: its graphs, and the one made again below, are the only ones on its code objects (another
    # graph there would leave no direct call to make).
    model = loaded(str(save_tiny_models(tmp_path, {"llama": TINY_CONFIGS["llama"]})["llama"]))
    options = BatcherOptions(
        max_batch_size=7,
        max_batched_tokens=64,
        max_seq_len=256,
        compile_steps=True,
        compile_autotune=False,
        compile_prompt_steps=True,
    )
    batcher = Batcher(model.model, model.tokenizer, options)
    decode, prompt_graph = batcher.runner.compiler, batcher.runner.mixed_compiler
    assert decode is not None and prompt_graph is not None
    assert decode.compile_now() is not None and not prompt_graph.started
    prompt, cap = [5, 6, 7, 8], 40
    request = batcher.add(prompt, RequestParams(cap, ignore_eos=True))
    events = batcher.step()  # the first prompt step starts the prompt-step graph's compile, and runs eager
    assert prompt_graph.started and [step.path for step in steps_of(events)] == ["eager"]
    # The case: the decode graph is ready while the prompt-step graph is made (held, and holding dynamo's
    # lock, as while the engine is busy). The decode steps go on through the ready graph (through the door, by its
    # direct call, made and checked with the graph), which neither compiles nor needs the lock.
    with held_inside_dynamo(prompt_graph):
        steps = steps_in_a_thread(batcher, 8)
        assert not prompt_graph.ready
    assert [step.path for step in steps] == [ready_path()] * 8
    assert prompt_graph._thread is not None
    prompt_graph._thread.join(600)  # released: made (before TF32 is switched below, which a trace must not see)
    assert prompt_graph.ready
    # A step the graph's guards refuse (TF32 switched) runs eager, the graph is made again for it in the background
    # (waiting here on dynamo's lock), and the ready graph serves the step it admits once made again.
    with tf32_flipped(), caplog.at_level(logging.INFO, logger="batching.engine.compiled"):
        with dynamos_compile_lock_held():
            missed = steps_in_a_thread(batcher, 3)
            assert [step.path for step in missed] == ["eager"] * 3
            assert decode.remakes == 1  # one re-make at a time, not one per step
        assert decode._thread is not None
        decode._thread.join(600)
        remade = steps_in_a_thread(batcher, 3)
    assert [step.path for step in remade] == ["compiled"] * 3  # the new graph (the direct call keeps the first)
    assert any("making it again in the background" in record.getMessage() for record in caplog.records)
    assert [step.path for step in steps_in_a_thread(batcher, 2)] == [ready_path()] * 2  # TF32 back: the first graph
    assert not decode.failed
    second = batcher.add([9, 10, 11], RequestParams(5, ignore_eos=True))
    joined = batcher.step()  # its prompt step, beside the first request's decode row, through the prompt graph
    assert [step.path for step in steps_of(joined)] == [ready_path()]  # its direct call made with it
    events += [*joined, *batcher.run()]
    finished = finished_by_id(events)
    assert list(finished[request.request_id].output_ids) == reference(model.model, prompt, cap, ignore_eos=True)
    assert list(finished[second.request_id].output_ids) == reference(model.model, [9, 10, 11], 5, ignore_eos=True)


# Two slots (rows stay static: a short compile) and a cache length no other test compiles.
FALLBACK = BatcherOptions(
    max_batch_size=2, max_batched_tokens=16, max_seq_len=96, compile_steps=True, compile_autotune=False
)


@contextmanager
def dynamo_refusing_a_re_trace() -> Iterator[None]:
    """The next compiled call re-traces, and dynamo refuses to: a real failure of a compiled call at run time.

    The re-trace comes from TF32 matmuls switched on, a global flag the graph's guards check and a CPU step ignores.
    """
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = not tf32
    try:
        with torch._dynamo.config.patch(error_on_recompile=True):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def _failures(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if "steps stay eager" in record.getMessage()]


def test_a_decode_graph_that_cannot_be_made_leaves_the_steps_eager_and_is_not_tried_again(
    tiny_model_dirs, caplog: pytest.LogCaptureFixture
) -> None:
    model = loaded(str(tiny_model_dirs["llama"]))
    # A graph on this model already: a cache of another block size is a re-trace of it, which dynamo refuses below.
    Batcher(model.model, model.tokenizer, FALLBACK).runner.compiler.compile_now()
    batcher = Batcher(model.model, model.tokenizer, replace(FALLBACK, block_size=FALLBACK.block_size // 2))
    compiler = batcher.runner.compiler
    assert compiler is not None
    prompt, cap = [9, 10, 11], 20
    with caplog.at_level(logging.WARNING, logger="batching.engine.compiled"), dynamo_refusing_a_re_trace():
        assert compiler.compile_now() is None
        request = batcher.add(prompt, RequestParams(cap, ignore_eos=True))
        events = list(batcher.run())
        assert compiler.compile_now() is None
    # Not tried again: no compile running, none made since.
    assert not any(thread.name == "batchscope-compile" for thread in threading.enumerate()) and not compiler.ready
    finished = finished_by_id(events)[request.request_id]
    assert list(finished.output_ids) == reference(model.model, prompt, cap, ignore_eos=True)
    assert batcher.runner.compiled_steps == 0 and compiler.failed
    (line,) = _failures(caplog)
    assert line.startswith("compiling the decode step failed, steps stay eager: RecompileError: ")
