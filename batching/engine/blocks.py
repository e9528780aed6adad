"""The KV block pool: fixed-size blocks of cache positions, who holds which, and which full blocks are cached.

One pool per batcher, owned here and nowhere else; the cache (`kv_cache`) keeps the keys and values of block `b`
at `b` in every layer's tensors, and reads and writes them through the tables kept here.

- A request's *block table* lists its blocks in order: position `p` of its sequence sits in block
  `table[p // block_size]` at offset `p % block_size`. Blocks are taken as its tokens arrive and given back when
  it leaves.
- **Prefix caching**: a block whose every position holds a computed token is hashed by (its parent block's hash,
  its token ids), as vLLM does, so equal hashes mean equal prefixes. A new request whose prompt starts with blocks
  already hashed takes those blocks (their reference count goes up) and skips their tokens' prefill. A block nobody
  holds stays cached, hash and all, until a new block is needed and none is free: the least recently freed goes.
- Counts for the page and `/metrics`: blocks free, in use, cached (held by nobody, kept for hits), shared (held by
  several requests), and prefix queries and hits in tokens.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

BlockHash = bytes
DEFAULT_BLOCK_SIZE = 16  # positions per block, as vLLM's default


@dataclass(frozen=True)
class PoolUsage:
    """The pool at one moment, in blocks (each `block_size` positions)."""

    total: int
    in_use: int  # held by at least one request
    shared: int  # held by two requests or more (a prefix hit); counted in `in_use` too
    cached: int  # held by no one, its tokens kept for a later prefix hit (evicted first-freed-first when needed)
    free: int  # held by no one, nothing kept

    @property
    def available(self) -> int:
        """Blocks a request could take now: free ones and cached ones (evicted to make room)."""
        return self.free + self.cached


def block_hash(parent: BlockHash | None, tokens: Sequence[int]) -> BlockHash:
    """The hash of one full block: its parent's hash and its token ids (16 bytes of BLAKE2b: no collision to fear)."""
    digest = hashlib.blake2b(parent or b"", digest_size=16)
    digest.update(array("q", tokens).tobytes())
    return digest.digest()


class BlockPool:
    """`num_blocks` blocks of `block_size` positions, the block table of every request holding some, and the cache
    of full blocks by hash (when `prefix_caching`)."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True) -> None:
        if block_size < 1:
            raise ValueError(f"block_size={block_size} is not allowed: must be >= 1")
        if num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks} is not allowed: must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self._free: deque[int] = deque(range(num_blocks))
        self._refs = [0] * num_blocks
        self._cached: OrderedDict[int, None] = OrderedDict()  # held by no one but hashed: oldest freed first
        self._hash_of: dict[int, BlockHash] = {}
        self._block_of: dict[BlockHash, int] = {}
        self._shared = 0
        self._extra_refs = 0  # references beyond the first, over all blocks: tokens held twice are counted once
        self.tables: dict[str, list[int]] = {}
        self._hashed: dict[str, int] = {}  # how many leading blocks of each table are hashed
        self._chain: dict[str, BlockHash] = {}  # each table's hash chain so far (its last hashed block's hash)
        self.prefix_queries = 0  # prompt tokens looked up
        self.prefix_hits = 0  # of those, tokens found cached

    # --- sizes --------------------------------------------------------------------------------------------
    def blocks_for(self, tokens: int) -> int:
        """Blocks that hold `tokens` positions."""
        return -(-tokens // self.block_size)

    def missing(self, request_id: str, tokens: int) -> int:
        """Blocks the request lacks to hold `tokens` positions in all."""
        return max(0, self.blocks_for(tokens) - len(self.tables.get(request_id, ())))

    def held_twice(self) -> int:
        """Positions that more than one request holds, counted once per extra holder (shared blocks are full)."""
        return self._extra_refs * self.block_size

    def usage(self) -> PoolUsage:
        cached = len(self._cached)
        free = len(self._free)
        return PoolUsage(self.num_blocks, self.num_blocks - cached - free, self._shared, cached, free)

    @property
    def available(self) -> int:
        return len(self._free) + len(self._cached)

    # --- taking and giving back ---------------------------------------------------------------------------
    def grow(self, request_id: str, tokens: int) -> bool:
        """Give the request blocks to hold `tokens` positions in all; False (nothing taken) when too few are left."""
        needed = self.missing(request_id, tokens)
        if needed > self.available:
            return False
        table = self.tables.setdefault(request_id, [])
        self._hashed.setdefault(request_id, 0)
        for _ in range(needed):
            table.append(self._take())
        return True

    def free(self, request_id: str) -> None:
        """Give back every block the request holds (its last blocks are the first evicted later: least useful)."""
        table = self.tables.pop(request_id, [])
        self._hashed.pop(request_id, None)
        self._chain.pop(request_id, None)
        for block in reversed(table):
            self._drop(block)

    def _take(self) -> int:
        if self._free:
            block = self._free.popleft()
        else:
            block, _ = self._cached.popitem(last=False)  # evict the block freed longest ago
            del self._block_of[self._hash_of.pop(block)]
        self._refs[block] = 1
        return block

    def _hold(self, block: int) -> None:
        if self._refs[block] == 0:
            del self._cached[block]
        else:
            self._extra_refs += 1
            self._shared += self._refs[block] == 1
        self._refs[block] += 1

    def _drop(self, block: int) -> None:
        self._refs[block] -= 1
        if self._refs[block] >= 1:
            self._extra_refs -= 1
            self._shared -= self._refs[block] == 1
        elif self._refs[block] == 0:
            if block in self._hash_of:
                self._cached[block] = None
            else:
                self._free.append(block)

    # --- prefix caching -----------------------------------------------------------------------------------
    def cached_prefix(self, token_ids: Sequence[int]) -> list[int]:
        """The blocks holding the longest cached prefix of `token_ids`, whole blocks only, leaving at least the
        last token to compute (its logits pick the next token)."""
        blocks = []
        for digest in self._prefix_chain(token_ids):
            block = self._block_of.get(digest)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def _prefix_chain(self, token_ids: Sequence[int]) -> Iterator[BlockHash]:
        """The hashes of `token_ids`' full blocks in order, made as they are read (lookups stop at the first miss),
        leaving the last token out (its logits pick the next token); none without prefix caching."""
        if not self.prefix_caching:
            return
        size, parent = self.block_size, None
        for index in range((len(token_ids) - 1) // size):
            parent = block_hash(parent, token_ids[index * size : (index + 1) * size])
            yield parent

    def block_hashes(self, token_ids: Sequence[int]) -> list[BlockHash]:
        """The hashes the full blocks of `token_ids` get once computed (the blocks `cached_prefix` looks up)."""
        return list(self._prefix_chain(token_ids))

    def first_uncached(self, token_ids: Sequence[int]) -> BlockHash | None:
        """The hash of the first full block of `token_ids` that is not cached (None: every one is, or none is full)."""
        return next((digest for digest in self._prefix_chain(token_ids) if digest not in self._block_of), None)

    def adopt_prefix(self, request_id: str, token_ids: Sequence[int]) -> int:
        """Start the request's table with the cached blocks of its prefix (shared, not copied); returns the tokens
        they hold. The query is counted by `count_query`, once the request is in."""
        if self.tables.get(request_id):
            raise ValueError(f"request {request_id!r} already holds blocks")
        blocks = self.cached_prefix(token_ids)
        for block in blocks:
            self._hold(block)
        self.tables[request_id] = list(blocks)
        self._hashed[request_id] = len(blocks)
        if blocks:
            self._chain[request_id] = self._hash_of[blocks[-1]]
        return len(blocks) * self.block_size

    def count_query(self, prompt_tokens: int, cached_tokens: int) -> None:
        """Count one request's prefix lookup: its prompt tokens and those found cached. Once per request, at its first
        admission (vLLM's rule: a return after a preemption, or a retry when blocks ran out, is not a new query)."""
        if self.prefix_caching:
            self.prefix_queries += prompt_tokens
            self.prefix_hits += cached_tokens

    def needs_commit(self, request_id: str, computed: int) -> bool:
        """Whether `computed` positions fill a block of the request's not hashed yet (cheap: checked every step)."""
        done = self._hashed.get(request_id)
        return self.prefix_caching and done is not None and computed // self.block_size > done

    def commit(self, request_id: str, token_ids: Sequence[int], computed: int) -> None:
        """Hash the request's blocks that `computed` positions (holding `token_ids`) have filled since last time.

        A block whose hash another block already has (two requests computed the same prefix at once) stays
        unhashed: it is freed, not cached, when its request leaves. The chain goes on past it (a hash depends on the
        tokens alone), so the request's later blocks are still cached.
        """
        if not self.prefix_caching:
            return
        table = self.tables[request_id]
        size, done = self.block_size, self._hashed[request_id]
        full = min(computed // size, len(table))
        if full <= done:
            return
        parent = self._chain.get(request_id)
        for index in range(done, full):
            parent = block_hash(parent, token_ids[index * size : (index + 1) * size])
            if parent not in self._block_of:
                self._block_of[parent] = table[index]
                self._hash_of[table[index]] = parent
        self._hashed[request_id] = full
        if parent is not None:
            self._chain[request_id] = parent

    # --- for tests and the page ----------------------------------------------------------------------------
    def refs(self, block: int) -> int:
        return self._refs[block]

    def is_cached(self, block: int) -> bool:
        return block in self._hash_of

    def check(self) -> None:
        """Raise if the accounting is inconsistent: every block free, cached or held as many times as tables list."""
        held = [0] * self.num_blocks
        for table in self.tables.values():
            for block in table:
                held[block] += 1
        if held != self._refs:
            raise AssertionError("block reference counts do not match the block tables")
        idle = set(self._free) | set(self._cached)
        if len(idle) != len(self._free) + len(self._cached) or any(held[block] for block in idle):
            raise AssertionError("a block is listed free or cached while held")
        if len(idle) + sum(1 for count in held if count) != self.num_blocks:
            raise AssertionError("a block is neither held, free nor cached")
