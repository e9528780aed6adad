"""Decode attention through the block tables (`paged_decode`) against the gathered path it replaces: the same
attention, row by row, for ragged rows, left padding, sliding windows, a padding row, grouped-query heads and a
value head size other than the keys'; and which models take it."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from batching.engine import paged_decode
from batching.engine.attention import RowMask, attend
from batching.engine.batcher import Batcher, BatcherOptions
from batching.engine.events import StepEvent
from batching.engine.kv_cache import gather_blocks
from batching.engine.params import RequestParams
from tests.engine.helpers import loaded, reference
from tests.tiny_models import TINY_CONFIGS, save_tiny_models

BLOCK = 16
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def operator() -> None:
    assert paged_decode.load(), "the operator could not be built here (g++ and ninja are test dependencies)"


def _gathered(query, key_pool, value_pool, tables, own, first, window, scale) -> torch.Tensor:  # noqa: PLR0913
    """The gathered path: every row's blocks copied side by side, attended over with the additive row mask."""
    keys, values = gather_blocks(key_pool, tables), gather_blocks(value_pool, tables)
    mask = RowMask(own[:, None, None, None], first[:, None, None, None], torch.float32)
    return attend(query[:, :, None], keys, values, mask.additive(window, keys.shape[2]), scale)[:, :, 0]


def _scattered_tables(lengths: list[int], blocks: int, generator: torch.Generator) -> torch.Tensor:
    """Each row's blocks for `lengths` columns, drawn at random from a pool of `blocks`; the rest of its table the
    scratch block (index `blocks`)."""
    width = -(-max(lengths) // BLOCK)
    order = torch.randperm(blocks, generator=generator).tolist()
    tables = []
    for length in lengths:
        count = -(-length // BLOCK)
        own_blocks, order = order[:count], order[count:]
        tables.append(own_blocks + [blocks] * (width - count))
    return torch.tensor(tables)


@pytest.mark.parametrize("window", [None, 24])
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "value_dim"),
    [
        (8, 2, 32, 32),  # the embedded model's: 16-wide vectors where the CPU has them, as below
        (14, 2, 64, 64),  # Qwen2-0.5B's: 7 groups
        (32, 2, 128, 128),  # 16 groups: more than one pass of 8 (scores) and of 2 (values)
        (4, 4, 16, 16),  # sizes the vector path does not take
        (6, 2, 24, 40),
    ],
)
def test_it_equals_the_gathered_attention(window, heads, kv_heads, dim, value_dim) -> None:
    generator = torch.Generator().manual_seed(heads * dim + (window or 0))
    blocks = 60
    key_pool = torch.randn(kv_heads, blocks + 1, BLOCK, dim, generator=generator)
    value_pool = torch.randn(kv_heads, blocks + 1, BLOCK, value_dim, generator=generator)
    # Ragged rows (1 to 300 columns), one with 7 columns of left padding, and a padding row that reads the scratch
    # block's column 0 alone; each row's blocks scattered over the pool, the rest of its table the scratch block.
    lengths, first = [300, 41, 1, 130, 17, 0], [0, 0, 0, 7, 0, 0]
    tables_tensor = _scattered_tables(lengths, blocks, generator)
    own = torch.tensor([max(length - 1, 0) for length in lengths])
    first_tensor = torch.tensor(first)
    query = torch.randn(len(lengths), heads, dim, generator=generator)
    scale = dim**-0.5
    paged = paged_decode.paged_decode(query, key_pool, value_pool, tables_tensor, own, first_tensor, window, scale)
    gathered = _gathered(query, key_pool, value_pool, tables_tensor, own, first_tensor, window, scale)
    assert paged.shape == (len(lengths), heads, value_dim)
    torch.testing.assert_close(paged, gathered, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "value_dim", "lengths"),
    [
        (8, 2, 32, 32, [300, 41, 1, 130, 17, 0, 290, 250]),  # the embedded model's shape, enough work to split
        (14, 2, 64, 64, [3, 5, 1, 2]),  # too little work to split: one thread whatever torch has
        (6, 3, 24, 40, [200, 7, 160, 90, 33]),  # sizes the vector path does not take, 3 key heads
    ],
)
def test_every_thread_count_gives_the_same_bits_and_the_gathered_attention(
    heads, kv_heads, dim, value_dim, lengths
) -> None:
    """Each (row, key head) is computed alone, whichever thread takes it: 1 to 4 threads agree bit for bit."""
    generator = torch.Generator().manual_seed(len(lengths) * heads + dim)
    width = -(-max(lengths) // BLOCK)
    blocks = width * len(lengths)
    key_pool = torch.randn(kv_heads, blocks + 1, BLOCK, dim, generator=generator)
    value_pool = torch.randn(kv_heads, blocks + 1, BLOCK, value_dim, generator=generator)
    tables_tensor, first = _scattered_tables(lengths, blocks, generator), torch.zeros(len(lengths), dtype=torch.long)
    own = torch.tensor([max(length - 1, 0) for length in lengths])
    query = torch.randn(len(lengths), heads, dim, generator=generator)
    scale = dim**-0.5
    before = torch.get_num_threads()
    outputs = {}
    try:
        for count in (1, 2, 3, 4):
            torch.set_num_threads(count)
            outputs[count] = paged_decode.paged_decode(
                query, key_pool, value_pool, tables_tensor, own, first, None, scale
            )
    finally:
        torch.set_num_threads(before)
    for count in (2, 3, 4):
        assert torch.equal(outputs[count], outputs[1]), f"{count} threads differ from one"
    gathered = _gathered(query, key_pool, value_pool, tables_tensor, own, first, None, scale)
    torch.testing.assert_close(outputs[1], gathered, rtol=1e-5, atol=1e-5)


def test_it_reads_only_the_columns_a_row_may_see() -> None:
    """A key past a row's own column, before its first real one, or outside its window changes nothing."""
    key_pool, value_pool = torch.randn(1, 5, BLOCK, 8), torch.randn(1, 5, BLOCK, 8)
    tables, own, first = torch.tensor([[2, 0, 3]]), torch.tensor([30]), torch.tensor([5])
    query = torch.randn(1, 2, 8)
    before = paged_decode.paged_decode(query, key_pool, value_pool, tables, own, first, 20, 0.3)
    key_pool[0, 2, :11] = 1e4  # columns 0-10: padding (0-4) and outside the 20-column window (5-10)
    key_pool[0, 3, 0] = 1e4  # column 32: not yet written for this row
    value_pool[0, 3] = 1e4
    after = paged_decode.paged_decode(query, key_pool, value_pool, tables, own, first, 20, 0.3)
    torch.testing.assert_close(after, before)


def test_plain_float32_families_on_the_cpu_take_it_and_the_others_gather(tiny_model_dirs) -> None:
    assert paged_decode.supports(loaded(str(tiny_model_dirs["llama"])).model)
    assert not paged_decode.supports(loaded(str(tiny_model_dirs["gpt2"])).model)  # not in the checked families
    in_bfloat16 = AutoModelForCausalLM.from_pretrained(tiny_model_dirs["llama"], dtype=torch.bfloat16)
    assert not paged_decode.supports(in_bfloat16)


# The fresh processes below build the operator for AVX2 (torch told so by ATEN_CPU_CAPABILITY) in one extension cache
# they share: the first builds it (about a minute here), the next loads that build.
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2"}


@pytest.fixture(scope="module")
def extensions(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The extension cache the fresh processes of this module build the operator in."""
    return tmp_path_factory.mktemp("extensions")


def _capability_under_avx2() -> str:
    """The capability torch runs at when told AVX2: AVX2 where the CPU has it, else the CPU's own."""
    native = torch.backends.cpu.get_cpu_capability()
    return "AVX2" if native in ("AVX2", "AVX512") else native


@pytest.mark.long
def test_a_lock_file_a_killed_build_left_is_cleared_and_the_operator_loads(extensions: Path) -> None:
    """torch's builder waits with no end while its `lock` file exists, and a process killed while building or
    loading (Ctrl-C on a first start) leaves it: without the clearing, this load never returns."""
    name = paged_decode.build_target(_capability_under_avx2())[0]
    folder = extensions / name
    folder.mkdir()
    (folder / "lock").touch()
    script = "from batching.engine import paged_decode; print(paged_decode.load())"
    env = {**os.environ, **AVX2, "TORCH_EXTENSIONS_DIR": str(extensions)}
    try:  # a fresh process: this one has the operator loaded already
        done = subprocess.run(
            [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the load waited on the dead build's lock file")
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr
    assert "left by a build that was stopped" in done.stderr
    assert not (folder / "lock").exists() and (folder / f"{name}.so").exists()


def test_a_build_is_named_for_the_instruction_sets_it_holds_never_for_whatever_machine_built_it() -> None:
    builds = {capability: paged_decode.build_target(capability) for capability in ("AVX512", "AVX2", "DEFAULT")}
    names = [name for name, _ in builds.values()]
    assert [name.split("_")[3] for name in names] == ["avx512", "avx2", "base"] and len(set(names)) == 3
    assert all("-march=native" not in flags for _, flags in builds.values())
    assert [any(flag.startswith("-mavx512") for flag in flags) for _, flags in builds.values()] == [True, False, False]
    assert not any(flag.startswith("-mavx") for flag in builds["DEFAULT"][1])
    assert paged_decode.build_target("VSX") == builds["DEFAULT"]  # a capability without flags of its own: the base
    assert paged_decode.build_target() == paged_decode.build_target(torch.backends.cpu.get_cpu_capability())


_LOAD_FOR_AVX2 = """
import json, os, torch
from batching.engine import paged_decode
loaded = paged_decode.load()
maps = open("/proc/self/maps").read()
libraries = sorted({line.split()[-1] for line in maps.splitlines() if "batchscope_paged_decode" in line})
print(json.dumps([loaded, torch.backends.cpu.get_cpu_capability(), libraries]))
"""


def test_a_build_made_for_other_instruction_sets_is_never_loaded(extensions: Path) -> None:
    """A shared extension cache holding the AVX-512 build, and one from before builds were named for their target,
    both planted as files that cannot load: a process on an AVX2 CPU (torch told so by ATEN_CPU_CAPABILITY) builds
    (or finds, built by the test above) and loads its own, which holds no AVX-512 instruction."""
    planted = {}
    for name in (paged_decode.build_target("AVX512")[0], "batchscope_paged_decode"):
        (extensions / name).mkdir()
        planted[name] = extensions / name / f"{name}.so"
        planted[name].write_bytes(b"an AVX-512 build: SIGILL on this CPU")
    env = {**os.environ, **AVX2, "TORCH_EXTENSIONS_DIR": str(extensions)}
    done = subprocess.run(
        [sys.executable, "-c", _LOAD_FOR_AVX2], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    loaded_it, capability, libraries = json.loads(done.stdout.strip().splitlines()[-1])
    name = paged_decode.build_target(capability)[0]
    assert loaded_it and libraries == [str(extensions / name / f"{name}.so")], done.stderr[-3000:]
    assert all(path.read_bytes().startswith(b"an AVX-512 build") for path in planted.values())
    code = subprocess.run(["objdump", "-d", libraries[0]], capture_output=True, text=True, check=True).stdout
    assert "%zmm" not in code  # capability: AVX2 on an x86 CPU that has it; elsewhere torch's own, without AVX-512
    assert ("%ymm" in code) is (capability == "AVX2")  # an AVX2 build's vectors; none in a base build


@pytest.mark.long
def test_a_build_that_fails_leaves_compiled_steps_on_the_gathered_path_token_for_token(
    tmp_path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An extension cache that cannot be written (its folder is a file): the build fails, the decode graph is made
    on the gathered path, and every answer equals `generate`."""
    (tmp_path / "extensions").write_text("not a folder")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    monkeypatch.setattr(paged_decode, "_state", {})  # this process loaded it already (the fixture above)
    # A model of its own: its graph is made here, with the operator not loaded.
    model = loaded(str(save_tiny_models(tmp_path, {"llama": TINY_CONFIGS["llama"]})["llama"]))
    options = BatcherOptions(
        max_batch_size=2, max_batched_tokens=16, max_seq_len=96, compile_steps=True, compile_autotune=False
    )
    batcher = Batcher(model.model, model.tokenizer, options)
    assert batcher.runner.reads_through_tables  # a family that reads through the tables where the operator loads
    compiler = batcher.runner.compiler
    with caplog.at_level(logging.WARNING, logger="batching.engine.paged_decode"):
        assert compiler is not None and compiler.compile_now() is not None
    assert not paged_decode.ready()
    (line,) = [record.getMessage() for record in caplog.records if record.name == "batching.engine.paged_decode"]
    assert line.startswith("paged decode attention unavailable, steps gather blocks: ")
    prompts, cap = [[5, 6, 7, 8], [9, 10, 11]], 30
    requests = [batcher.add(prompt, RequestParams(cap, ignore_eos=True)) for prompt in prompts]
    steps = [event for event in batcher.run() if isinstance(event, StepEvent)]
    assert sum(step.compiled for step in steps) >= cap - 2 and not batcher.runner.cache.plan.paged
    for request, prompt in zip(requests, prompts, strict=True):
        assert request.output_ids == reference(model.model, prompt, cap, ignore_eos=True)
