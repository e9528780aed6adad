"""The API server's KV pool: sized for serving (whole contexts for every slot, within a share of the memory
available) unless the KV memory is given, and said in one line with how many whole-context requests it holds."""

from __future__ import annotations

from batching.engine.geometry import PoolGeometry
from batching.engine.options import BatcherOptions
from batching.serve.kv_budget import CONTEXTS_PER_SLOT, MEMORY_SHARE, serving_pool

# The embedded model's shape: a context of 1,024 positions, 3,072 bytes of keys and values a token.
GEOMETRY = PoolGeometry(context_length=1024, kv_bytes_per_token=3072)
DEMO = BatcherOptions(max_batch_size=8, kv_cache_tokens=1024)  # the page's race pool, which the settings default to
GIB = 2**30


def test_a_server_pool_holds_whole_contexts_for_every_slot_not_the_demo_pool() -> None:
    options, line = serving_pool(DEMO, GEOMETRY, given=False, available=16 * GIB)
    assert GEOMETRY.kv_tokens(options) == CONTEXTS_PER_SLOT * 8 * 1024  # 32 requests of the whole context
    assert GEOMETRY.full_contexts(options) == CONTEXTS_PER_SLOT * 8
    assert options.kv_cache_tokens is None and options.kv_cache_mb == 96.0
    assert line == (
        "KV cache: 96.0 MiB (4 whole contexts a slot, at most 25% of the 16.0 GiB available; --kv-cache-mb sets it): "
        "2,048 blocks of 16, 32,768 positions, 32 requests of the whole 1,024-token context at once"
    )


def test_a_server_on_a_small_machine_takes_its_share_of_the_memory_available() -> None:
    available = 200 * 2**20  # a quarter is 50 MiB: less than the 96 MiB of four contexts a slot
    options, _ = serving_pool(DEMO, GEOMETRY, given=False, available=available)
    assert options.kv_cache_mb == MEMORY_SHARE * available / 2**20
    assert GEOMETRY.pool_blocks(options) == (50 * 2**20 // (3072 * 16))
    assert GEOMETRY.full_contexts(options) == GEOMETRY.pool_blocks(options) // 64


def test_a_pool_given_is_the_pool_served() -> None:
    given = BatcherOptions(max_batch_size=8, kv_cache_mb=2.0)
    options, line = serving_pool(given, GEOMETRY, given=True, available=16 * GIB)
    assert options == given
    assert line.startswith("KV cache: 2.0 MiB (as set): 42 blocks of 16, 672 positions, 0 requests of the whole")
