"""Every model family: greedy output of both batchers, eager and with compiled decode steps, equals `generate` on
each prompt alone, or the model is refused at build time with one line naming its type and the reason. The matrix
lives in tests/engine/families.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch._dynamo.utils import counters
from transformers.integrations.heterogeneity.configuration_utils import AmbiguousGlobalPerLayerAttributeError

from batching.engine.batcher import MODES, Batcher
from batching.engine.events import Event, FinishedEvent, RowKind
from batching.engine.model_support import (
    UnsupportedModelError,
    attention_features,
    kv_bytes_per_token,
    kv_layers,
    model_context_length,
)
from batching.engine.options import BatcherOptions
from batching.engine.params import RequestParams
from tests.engine.families import FAMILIES, ORIGINAL_CONTEXT, WINDOW
from tests.engine.helpers import (
    loaded,
    one_torch_thread,
    random_prompts,
    reference,
    run_with_late_arrivals,
    steps_of,
)
from tests.helpers import ROOT

EXACT = [family.name for family in FAMILIES if not family.refused]
REFUSED = [family.name for family in FAMILIES if family.refused]
RECURRENT = [family.name for family in FAMILIES if family.recurrent]
CAPS = [1, 60, 3, 17, 40, 2, 25, 9]
LONGEST_PROMPT = 30  # several chunks under the token budget below, and far past the sliding window
COMPILED_CONTEXT = 96  # the longest request (prompt 30, cap 60) fits
# Compiled decode steps of every row count from 1 to this run through the graphs made up front (2 and 4 are small
# hybrids' value-head counts: see families.py).
COMPILED_SLOTS = 4
ONE_TOKEN = (RowKind.DECODE, RowKind.HELD)  # a step whose rows are all these is a decode step
# Families whose steps with prompt chunks also go through a compiled graph here (10-20 s a graph): the plain case,
# a sliding window with soft-capping, attention sinks, MLA's value head size, learned positions, and GPTQ weights.
PROMPT_GRAPH_FAMILIES = ["llama", "gemma2", "gpt_oss", "deepseek_v3", "opt", "gemma4", "llama_gptq"]
# The compiled families the default run keeps (each compile is 8-20 s cold): the plain case, a hybrid's states, GPTQ
# weights; every other family's graphs are `long` checks, run by CI (`python -m pytest -m long`, docs/testing.md).
DEFAULT_COMPILED = {"llama", "lfm2", "llama_gptq"}


def _long_but_default(names: list[str]) -> list[object]:
    """`names` as parameters, all but `DEFAULT_COMPILED`'s marked `long`."""
    return [name if name in DEFAULT_COMPILED else pytest.param(name, marks=pytest.mark.long) for name in names]


def _prompts() -> list[list[int]]:
    prompts = random_prompts(len(CAPS), vocab=300, seed=10, longest=LONGEST_PROMPT)
    prompts[1] = prompts[1] + [7] * (LONGEST_PROMPT - len(prompts[1]))  # one prompt of the longest length
    return prompts


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def _assert_equals_generate(batcher: Batcher, name: str) -> list[Event]:
    """Run the matrix's requests on `batcher`, some joining mid-run, and compare each with `generate` on it alone."""
    model = batcher.model
    prompts = _prompts()
    context = model_context_length(model)
    caps = [min(cap, context - len(prompt)) for prompt, cap in zip(prompts, CAPS, strict=True)]
    ends = [len(p) + c for p, c in zip(prompts, caps, strict=True)]
    assert max(ends) > 4 * WINDOW or max(ends) == context  # windows crossed; a capped context reached
    expected = [reference(model, p, c, ignore_eos=True) for p, c in zip(prompts, caps, strict=True)]
    events: list[Event] = []
    outputs = run_with_late_arrivals(
        batcher, prompts, caps, late_from=5, join_at_step=4, ignore_eos=True, events=events
    )
    for i, want in enumerate(expected):
        assert outputs[i] == want, (
            f"{name} {batcher.mode}: request {i} (prompt {len(prompts[i])}, cap {caps[i]}) differs"
        )
    assert batcher.runner.cache.active_rows == 0
    return events


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", EXACT)
def test_greedy_output_equals_generate_for_every_supported_family(family_model_dirs, name: str, mode: str) -> None:
    model = loaded(str(family_model_dirs[name]))
    # A small token budget forces chunked prefill of the longer prompts alongside other rows' decode steps.
    options = BatcherOptions(max_batch_size=3, max_batched_tokens=12)
    _assert_equals_generate(Batcher(model.model, model.tokenizer, options, mode=mode), name)


@pytest.mark.parametrize("name", EXACT)
def test_preemption_and_prefix_hits_stay_exact_for_every_supported_family(family_model_dirs, name: str) -> None:
    """A pool too small for three requests at once (preemptions, recomputed) and prompts sharing a 12-token prefix
    (the late ones find its blocks cached): every answer still equals `generate`, every block comes back."""
    _assert_exact_through_preemptions_and_prefix_hits(family_model_dirs, name, compiled=False)


@pytest.mark.slow
@pytest.mark.long
def test_gemma4s_compiled_decode_steps_stay_exact_through_preemptions_and_prefix_hits(family_model_dirs) -> None:
    """The same with compiled decode steps, for the family whose layers share keys and values: a preempted request's
    recomputed blocks and a prefix hit's shared ones are read by the reusing layers through the graph too."""
    _assert_exact_through_preemptions_and_prefix_hits(family_model_dirs, "gemma4", compiled=True)


def _assert_exact_through_preemptions_and_prefix_hits(family_model_dirs, name: str, compiled: bool) -> None:
    model = loaded(str(family_model_dirs[name]))
    shared = list(range(200, 212))
    prompts = [shared + tail for tail in random_prompts(len(CAPS), vocab=300, seed=12, longest=10)]
    context = model_context_length(model.model)
    caps = [min(cap, context - len(prompt)) for prompt, cap in zip(prompts, CAPS, strict=True)]
    expected = [reference(model.model, p, c, ignore_eos=True) for p, c in zip(prompts, caps, strict=True)]
    # Room for the longest request and three blocks more (24 blocks where no context caps the caps): two requests
    # at once already run out, even sharing the prefix's blocks (the second waits for them to be cached).
    longest = max(-(-(len(prompt) + cap) // 4) for prompt, cap in zip(prompts, caps, strict=True))
    options = BatcherOptions(
        max_batch_size=3,
        max_batched_tokens=12,
        block_size=4,
        kv_blocks=longest + 3,
        compile_steps=compiled,
        compile_autotune=False,
    )
    batcher = Batcher(model.model, model.tokenizer, options)
    if compiled:
        assert batcher.runner.compiler is not None and batcher.runner.compiler.compile_now() is not None
    events: list[Event] = []
    outputs = run_with_late_arrivals(
        batcher, prompts, caps, late_from=5, join_at_step=4, ignore_eos=True, events=events
    )
    for i, want in enumerate(expected):
        assert outputs[i] == want, f"{name}: request {i} (prompt {len(prompts[i])}, cap {caps[i]}) differs"
    finished = [event for event in events if isinstance(event, FinishedEvent)]
    assert any(event.preemptions for event in finished), "the pool was meant to run out"
    if name in RECURRENT:  # a conv or SSM state cannot be cut at a block: prefix caching is off for hybrids
        assert not batcher.pool.prefix_caching and all(event.cached_tokens == 0 for event in finished)
    else:
        assert any(event.cached_tokens >= 8 for event in finished), "no request found the shared prefix cached"
    batcher.pool.check()
    assert batcher.pool.usage().in_use == 0
    if compiled:  # every decode step compiled (a prompt's one last token after a prefix hit goes through it too)
        decode_steps = [step for step in steps_of(events) if all(row.kind in ONE_TOKEN for row in step.rows)]
        assert all(step.compiled for step in decode_steps) and len(decode_steps) > 20


def _compiled_options(mode: str, prompt_steps: bool = False, slots: int = COMPILED_SLOTS) -> BatcherOptions:
    """The matrix's slots and budget with compiled steps, the kernels untimed (a compile of half the time).

    Both batchers get caches of one length, so they share one graph (a compiler per slot count and cache length):
    the static cache's room for left padding is the continuous one's longer context. Phi-3's context is capped
    below both, so its two batchers make a graph each.
    """
    context = COMPILED_CONTEXT + LONGEST_PROMPT if mode == "continuous" else COMPILED_CONTEXT
    return BatcherOptions(
        max_batch_size=slots,
        max_batched_tokens=12,
        max_seq_len=context,
        max_prompt_tokens=LONGEST_PROMPT,
        compile_steps=True,
        compile_autotune=False,
        compile_prompt_steps=prompt_steps,
    )


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", _long_but_default(EXACT))
def test_compiled_decode_steps_equal_generate_for_every_supported_family(family_model_dirs, name, mode) -> None:
    model = loaded(str(family_model_dirs[name]))
    batcher = Batcher(model.model, model.tokenizer, _compiled_options(mode), mode=mode)
    compiler = batcher.runner.compiler
    assert compiler is not None
    # 8-15 s a family here; the static batcher finds its family's graph made (but for Phi-3's).
    assert compiler.compile_now() is not None, f"{name}: its decode graph was not made"
    graphs, breaks = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
    events = _assert_equals_generate(batcher, name)
    decode_steps = [step for step in steps_of(events) if all(row.kind in ONE_TOKEN for row in step.rows)]
    # Every decode step went through the graphs made up front: none ran eager, none re-traced one, none broke one.
    assert batcher.runner.compiled_steps == len(decode_steps) > 20 and not compiler.failed
    if mode == "continuous":  # every row count a decode step can have (a static wave holds its rows to its end)
        counts = {sum(row.kind == RowKind.DECODE for row in step.rows) for step in decode_steps}
        assert set(range(1, COMPILED_SLOTS + 1)) <= counts, counts
    assert counters["stats"]["unique_graphs"] == graphs and sum(counters["graph_break"].values()) == breaks


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", _long_but_default(PROMPT_GRAPH_FAMILIES))
def test_compiled_prompt_steps_equal_generate(family_model_dirs, name, mode) -> None:
    model = loaded(str(family_model_dirs[name]))
    # Three slots: the eight requests make three static waves, a prompt step each (four slots would make two).
    batcher = Batcher(model.model, model.tokenizer, _compiled_options(mode, prompt_steps=True, slots=3), mode=mode)
    runner = batcher.runner
    assert runner.compiler is not None and runner.mixed_compiler is not None
    assert runner.compiler.compile_now() is not None and runner.mixed_compiler.compile_now() is not None
    graphs, breaks = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
    steps = steps_of(_assert_equals_generate(batcher, name))
    prompt_steps = [step for step in steps if not all(row.kind in ONE_TOKEN for row in step.rows)]
    # Every step went through a graph: prompt chunks beside decode rows, chunks alone, a static wave's left-padded
    # rows; none re-traced a graph, none broke one. The first step too where the pools were allocated up front
    # (the families that read through the tables); elsewhere it allocates them, eager.
    eager = 0 if runner.reads_through_tables else 1
    assert all(step.compiled for step in steps[eager:]) and (eager == 0 or not steps[0].compiled)
    assert len(prompt_steps) >= 3 and runner.compiled_steps == len(steps) - eager
    assert counters["stats"]["unique_graphs"] == graphs and sum(counters["graph_break"].values()) == breaks


@pytest.mark.parametrize("name", REFUSED)
def test_an_unsupported_family_is_refused_with_one_line_naming_it(family_model_dirs, name: str) -> None:
    family = next(f for f in FAMILIES if f.name == name)
    model = loaded(str(family_model_dirs[name]))
    with pytest.raises(UnsupportedModelError) as refused:
        Batcher(model.model, model.tokenizer, BatcherOptions(max_batch_size=2))
    message = str(refused.value)
    assert message.startswith(f"model type {model.model.config.model_type} is not supported: ")
    assert family.refused in message and "\n" not in message


def test_attention_features_name_windows_softcap_sinks_and_head_sizes(family_model_dirs) -> None:
    def features(name: str) -> str:
        return attention_features(loaded(str(family_model_dirs[name])).model)

    assert features("llama") == ""
    assert features("mistral") == f"sliding window {WINDOW} on 2 of 2 layers"
    assert features("gemma2") == f"sliding window {WINDOW} on 1 of 2 layers, soft-cap 1"
    assert features("gpt_oss") == f"sliding window {WINDOW} on 1 of 2 layers, attention sinks"
    assert features("deepseek_v3") == "key head 24, value head 20"
    assert features("phi3") == f"longrope, context capped at its original {ORIGINAL_CONTEXT}"
    assert features("llama4") == f"chunked attention {WINDOW} on 1 of 2 layers"
    reuse = "2 of 4 layers reuse earlier layers' keys and values"
    assert features("gemma4") == f"sliding window {WINDOW} on 2 of 4 layers, head sizes 16/32, {reuse}"


def test_gemma4s_pool_holds_each_layers_own_shape_read_through_that_layers_config(family_model_dirs) -> None:
    """Gemma 4's layers differ: its full-attention layers have another head size and key-head count, and its last
    layers reuse the keys and values of earlier ones. Every per-layer attribute, read through the layer's own config
    (the global one refuses to answer), is what the pool holds for that layer; a layer reusing another's holds none,
    and the bytes a token takes count the writing layers only."""
    loaded_model = loaded(str(family_model_dirs["gemma4"]))
    model = loaded_model.model
    config = model.config.get_text_config()
    assert config.per_layer_attributes == {"head_dim", "num_key_value_heads"}
    for attribute in config.per_layer_attributes:
        with pytest.raises(AmbiguousGlobalPerLayerAttributeError):
            getattr(config, attribute)
    writers = [layer for layer, mode in enumerate(config.kv_sharing_modes) if mode != "reuse"]
    assert writers == [0, 1]  # layers 2 and 3 reuse them
    batcher = Batcher(model, loaded_model.tokenizer, BatcherOptions(max_batch_size=2, max_batched_tokens=12))
    run_with_late_arrivals(batcher, _prompts()[:3], [5, 5, 5], late_from=2, join_at_step=2, ignore_eos=True)
    held = {
        index: (layer.keys.shape[0], layer.keys.shape[3], layer.values.shape[0], layer.values.shape[3])
        for index, layer in enumerate(batcher.runner.cache.paged_layers)
        if layer.is_initialized
    }
    expected = {}
    for index in writers:
        own = config.per_layer_config[index]
        expected[index] = (own.num_key_value_heads, own.head_dim, own.num_key_value_heads, own.head_dim)
    assert held == expected and len(set(expected.values())) == 2  # the two writers' shapes differ
    per_token = sum(heads * (keys + values) for heads, keys, _, values in held.values())
    assert kv_bytes_per_token(model) == per_token * model.dtype.itemsize


def test_falcons_routed_attention_caches_each_key_head_once(family_model_dirs) -> None:
    """Falcon's own cache holds each key head broadcast over its query group; routed through the attention
    interface, the pool holds it once (grouped-query attention reads it for the group)."""
    loaded_model = loaded(str(family_model_dirs["falcon"]))
    model = loaded_model.model
    config = model.config
    assert config.num_kv_heads < config.num_attention_heads
    batcher = Batcher(model, loaded_model.tokenizer, BatcherOptions(max_batch_size=2))
    run_with_late_arrivals(batcher, _prompts()[:2], [4, 4], late_from=2, join_at_step=0, ignore_eos=True)
    assert [layer.keys.shape[0] for layer in batcher.runner.cache.initialized_layers()] == [config.num_kv_heads] * 2
    assert all(layer.kv_heads == config.num_kv_heads for layer in kv_layers(model))


def test_a_longrope_request_that_would_cross_the_original_context_is_refused(family_model_dirs) -> None:
    model = loaded(str(family_model_dirs["phi3"]))
    batcher = Batcher(model.model, model.tokenizer, BatcherOptions(max_batch_size=2))
    assert batcher.builder.context_length == ORIGINAL_CONTEXT
    with pytest.raises(ValueError, match=r"context is 48 \(capped where its longrope switches to the long factors\)"):
        batcher.add([5] * 10, RequestParams(ORIGINAL_CONTEXT - 9))
    batcher.add([5] * 10, RequestParams(ORIGINAL_CONTEXT - 10))  # up to the switch is fine


def test_the_docs_table_of_families_is_what_the_matrix_prints() -> None:

    from tests.engine.families_table import rows, summary

    models = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")
    stale = "docs/models.md is stale: paste the output of python -m tests.engine.families_table"
    assert "\n".join(rows()) in models, stale
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "\n".join(summary()) in readme, "the README's model table is stale: paste the second table printed"


@pytest.mark.parametrize("name", ["gemma2", "gpt_oss", "mistral", "falcon", "llama4", "gemma4"])
def test_generate_on_a_model_switched_to_the_engine_attention_still_matches_its_own(family_model_dirs, name) -> None:
    from batching.engine.attention import ATTENTION_NAME

    model = loaded(str(family_model_dirs[name])).model
    Batcher(model, loaded(str(family_model_dirs[name])).tokenizer, BatcherOptions(max_batch_size=1))
    assert model.config._attn_implementation == ATTENTION_NAME
    prompt = _prompts()[1]
    with torch.inference_mode():  # no plan: soft-cap and sinks take the eager path, windows come in the mask
        ours = model.generate(
            torch.tensor([prompt], device=model.device), max_new_tokens=20, do_sample=False, eos_token_id=None
        )
    assert ours[0, len(prompt) :].tolist() == reference(model, prompt, 20, ignore_eos=True)
