"""Decode attention through the block tables (`paged_decode`) against the gathered path it replaces: the same
attention, row by row, for ragged rows, left padding, sliding windows, a padding row, grouped-query heads and a
value head size other than the keys'; and which models take it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from batching.engine import paged_decode
from batching.engine.attention import RowMask, attend
from batching.engine.kv_cache import gather_blocks
from tests.engine.helpers import loaded

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
    width = -(-max(lengths) // BLOCK)
    order = torch.randperm(blocks, generator=generator).tolist()
    tables = []
    for length in lengths:
        count = -(-length // BLOCK)
        own_blocks, order = order[:count], order[count:]
        tables.append(own_blocks + [blocks] * (width - count))
    tables_tensor = torch.tensor(tables)
    own = torch.tensor([max(length - 1, 0) for length in lengths])
    first_tensor = torch.tensor(first)
    query = torch.randn(len(lengths), heads, dim, generator=generator)
    scale = dim**-0.5
    paged = paged_decode.paged_decode(query, key_pool, value_pool, tables_tensor, own, first_tensor, window, scale)
    gathered = _gathered(query, key_pool, value_pool, tables_tensor, own, first_tensor, window, scale)
    assert paged.shape == (len(lengths), heads, value_dim)
    torch.testing.assert_close(paged, gathered, rtol=1e-5, atol=1e-5)


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


def test_a_lock_file_a_killed_build_left_is_cleared_and_the_operator_loads(tmp_path) -> None:
    """torch's builder waits with no end while its `lock` file exists, and a process killed while building or
    loading (Ctrl-C on a first start) leaves it: without the clearing, this load never returns."""
    folder = tmp_path / "batchscope_paged_decode"
    folder.mkdir()
    (folder / "lock").touch()
    script = "from batching.engine import paged_decode; print(paged_decode.load())"
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    try:  # a fresh process: this one has the operator loaded already; a build from nothing takes about 20 s here
        done = subprocess.run(
            [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the load waited on the dead build's lock file")
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr
    assert "left by a build that was stopped" in done.stderr
    assert not (folder / "lock").exists() and (folder / "batchscope_paged_decode.so").exists()
