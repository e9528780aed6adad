"""The block pool's accounting: blocks taken and given back, reference counts of shared prefixes, hashing of full
blocks, eviction of cached blocks oldest-freed first, and refusal when too few are left."""

from __future__ import annotations

import pytest

from batching.engine.blocks import BlockPool, block_hash


def test_blocks_are_taken_as_tokens_arrive_and_all_come_back() -> None:
    pool = BlockPool(num_blocks=6, block_size=4, prefix_caching=False)
    assert pool.grow("a", 1) and pool.tables["a"] == [0]
    assert pool.grow("a", 4) and len(pool.tables["a"]) == 1  # still one block
    assert pool.grow("a", 5) and len(pool.tables["a"]) == 2
    assert pool.grow("b", 16) and len(pool.tables["b"]) == 4
    assert pool.usage().free == 0 and pool.usage().in_use == 6
    assert not pool.grow("c", 1)  # nothing left: nothing taken
    assert "c" not in pool.tables or pool.tables["c"] == []
    pool.check()
    pool.free("a")
    pool.free("b")
    pool.free("c")
    usage = pool.usage()
    assert (usage.free, usage.in_use, usage.cached) == (6, 0, 0)
    pool.check()


def test_a_grow_that_does_not_fit_takes_nothing() -> None:
    pool = BlockPool(num_blocks=3, block_size=2, prefix_caching=False)
    assert pool.grow("a", 2)
    assert not pool.grow("b", 6)  # needs 3, 2 left
    assert pool.tables.get("b", []) == [] and pool.available == 2
    pool.check()


def test_full_blocks_are_hashed_by_their_parent_and_tokens_and_a_prefix_hit_shares_them() -> None:
    pool = BlockPool(num_blocks=10, block_size=4)
    prompt = list(range(100, 111))  # 11 tokens: two full blocks and three tokens
    assert pool.adopt_prefix("a", prompt) == 0
    assert pool.grow("a", 11)
    pool.commit("a", prompt, 11)
    assert [pool.is_cached(block) for block in pool.tables["a"]] == [True, True, False]
    # The same prompt: both full blocks are found, shared, and their tokens are not computed again.
    assert pool.adopt_prefix("b", prompt) == 8
    assert pool.tables["b"] == pool.tables["a"][:2]
    assert [pool.refs(block) for block in pool.tables["a"]] == [2, 2, 1]
    assert pool.usage().shared == 2 and pool.held_twice() == 8
    # A prompt that differs in its second block shares only the first: the hash chains through the parent.
    other = [*prompt[:4], 1, 2, 3, 4, *prompt[8:]]
    assert pool.adopt_prefix("c", other) == 4
    pool.check()


def test_prefix_queries_and_hits_count_what_they_are_told_once() -> None:
    pool = BlockPool(num_blocks=10, block_size=4)
    pool.count_query(11, 8)
    pool.count_query(11, 4)
    assert (pool.prefix_queries, pool.prefix_hits) == (22, 12)
    off = BlockPool(num_blocks=10, block_size=4, prefix_caching=False)
    off.count_query(11, 0)
    assert (off.prefix_queries, off.prefix_hits) == (0, 0)


def test_a_hit_always_leaves_the_last_token_to_compute() -> None:
    pool = BlockPool(num_blocks=10, block_size=4)
    prompt = list(range(8))  # exactly two blocks
    pool.adopt_prefix("a", prompt)
    pool.grow("a", 8)
    pool.commit("a", prompt, 8)
    # Both blocks are cached, but the last token's logits pick the next token: only the first block is a hit.
    assert pool.adopt_prefix("b", prompt) == 4


def test_cached_blocks_outlive_their_request_and_are_evicted_oldest_freed_first() -> None:
    pool = BlockPool(num_blocks=4, block_size=2)
    for name, tokens in (("a", [1, 2, 3]), ("b", [7, 8, 9])):
        pool.adopt_prefix(name, tokens)
        pool.grow(name, 3)
        pool.commit(name, tokens, 3)
    a_block, b_block = pool.tables["a"][0], pool.tables["b"][0]
    pool.free("a")
    pool.free("b")
    usage = pool.usage()
    assert (usage.cached, usage.free, usage.in_use) == (2, 2, 0)
    assert pool.adopt_prefix("again", [1, 2, 5]) == 2  # a's block is still there
    pool.free("again")  # a's block is now freed more recently than b's
    assert pool.grow("big", 6)  # two free blocks and one evicted: b's, freed longest ago
    assert pool.is_cached(a_block) and not pool.is_cached(b_block)
    assert pool.adopt_prefix("b2", [7, 8, 9]) == 0
    pool.check()


def test_two_requests_filling_the_same_block_at_once_keep_one_hash() -> None:
    pool = BlockPool(num_blocks=6, block_size=2)
    tokens = [5, 6, 7]
    for name in ("a", "b"):
        pool.adopt_prefix(name, tokens)
        pool.grow(name, 3)
    pool.commit("a", tokens, 3)
    pool.commit("b", tokens, 3)  # the same content: b's block stays unhashed, and is freed (not cached) later
    assert pool.is_cached(pool.tables["a"][0]) and not pool.is_cached(pool.tables["b"][0])
    pool.free("b")
    assert pool.usage().cached == 0
    pool.check()


def test_a_duplicate_block_does_not_stop_the_hash_chain_of_the_blocks_after_it() -> None:
    pool = BlockPool(num_blocks=8, block_size=2)
    shared, own = [5, 6], [7, 8, 9]
    pool.adopt_prefix("a", [*shared, 0])
    pool.grow("a", 3)
    pool.commit("a", [*shared, 0], 3)
    # b computed the same first block beside a (a duplicate), then a second block of its own.
    tokens = shared + own
    pool.grow("b", 5)
    pool.commit("b", tokens, 4)
    assert not pool.is_cached(pool.tables["b"][0]) and pool.is_cached(pool.tables["b"][1])
    pool.free("b")
    # A later request with b's prompt finds both blocks: a's for the first, b's for the second.
    assert pool.adopt_prefix("c", tokens) == 4
    assert pool.tables["c"] == [pool.tables["a"][0], pool.tables["c"][1]]
    pool.check()


def test_without_prefix_caching_nothing_is_hashed_or_found() -> None:
    pool = BlockPool(num_blocks=4, block_size=2, prefix_caching=False)
    pool.adopt_prefix("a", [1, 2, 3])
    pool.grow("a", 3)
    pool.commit("a", [1, 2, 3], 3)
    pool.free("a")
    assert pool.usage().cached == 0 and pool.adopt_prefix("b", [1, 2, 3]) == 0


def test_hashes_depend_on_every_token_and_the_parent() -> None:
    assert block_hash(None, [1, 2]) != block_hash(None, [2, 1])
    assert block_hash(block_hash(None, [1]), [2]) != block_hash(None, [2])
    assert block_hash(None, [1, 2]) == block_hash(None, [1, 2])


@pytest.mark.parametrize(("blocks", "size"), [(0, 16), (4, 0)])
def test_a_pool_of_nothing_is_refused(blocks: int, size: int) -> None:
    with pytest.raises(ValueError, match="is not allowed"):
        BlockPool(blocks, size)
