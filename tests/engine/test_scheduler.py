"""The continuous scheduler's admission, without a model: requests sharing a prompt block that another request is
computing wait for it to be cached, the others go in, and a long queue of such requests is scanned only so far."""

from __future__ import annotations

from batching.engine.blocks import BlockPool
from batching.engine.params import RequestParams
from batching.engine.request import Request, RequestState
from batching.engine.scheduler import MAX_DEFERRED, ContinuousScheduler

SHARED = list(range(100, 120))  # two full blocks of 8, then a partial one


def request(name: str, ids: list[int]) -> Request:
    return Request(name, ids, RequestParams(5))


def admitted(scheduler: ContinuousScheduler, slots: int, running: list[Request]) -> list[str]:
    names = []
    for item, _ in scheduler.admit(list(range(slots)), running):
        item.state = RequestState.PREFILLING  # as the batcher does on admission
        running.append(item)
        names.append(item.request_id)
    return names


def test_a_request_waits_while_its_next_uncached_block_is_computed_and_joins_once_it_is_cached() -> None:
    pool = BlockPool(64, 8)
    scheduler = ContinuousScheduler(512, pool)
    for name, ids in [("a", [*SHARED, 1]), ("b", [*SHARED, 2]), ("c", list(range(200, 230))), ("d", [*SHARED, 3])]:
        scheduler.waiting.push(request(name, ids))
    running: list[Request] = []
    assert admitted(scheduler, 4, running) == ["a", "c"]  # b and d share a's blocks: they wait
    assert admitted(scheduler, 2, running) == []  # a is still prefilling: its blocks are not cached yet
    first = running[0]
    pool.commit("a", first.prompt_ids, len(first.prompt_ids))  # a's step ran: its full blocks are hashed
    assert admitted(scheduler, 2, running) == ["b", "d"]  # in their order, each with a's two blocks cached
    assert [item.prefilled for item in running[2:]] == [16, 16]
    pool.check()


def test_a_request_that_shares_only_cached_blocks_is_not_held_back() -> None:
    pool = BlockPool(64, 8)
    scheduler = ContinuousScheduler(512, pool)
    scheduler.waiting.push(request("a", [*SHARED, 1]))
    running: list[Request] = []
    assert admitted(scheduler, 1, running) == ["a"]
    pool.commit("a", running[0].prompt_ids, 16)
    # b shares a's two cached blocks; a is still prefilling its third, partial block, which b does not share.
    scheduler.waiting.push(request("b", [*SHARED, 9, 9, 9, 9, 9]))
    assert admitted(scheduler, 1, running) == ["b"]
    assert running[1].prefilled == 16


def test_a_long_queue_of_waiting_sharers_is_scanned_only_so_far() -> None:
    pool = BlockPool(256, 8)
    scheduler = ContinuousScheduler(4096, pool)
    scheduler.waiting.push(request("first", [*SHARED, 0]))
    sharers = [request(f"s{index}", [*SHARED, index]) for index in range(MAX_DEFERRED + 4)]
    for item in sharers:
        scheduler.waiting.push(item)
    scheduler.waiting.push(request("other", list(range(300, 330))))
    running: list[Request] = []
    # Behind MAX_DEFERRED passed-over sharers the scan stops: the last sharers and the unrelated request wait too.
    assert admitted(scheduler, 8, running) == ["first"]
    assert len(scheduler.waiting) == len(sharers) + 1
    assert scheduler.waiting.pop() is sharers[0]  # the queue's order is kept


def test_without_prefix_caching_no_request_waits_for_another() -> None:
    pool = BlockPool(64, 8, prefix_caching=False)
    scheduler = ContinuousScheduler(512, pool)
    for name in ("a", "b"):
        scheduler.waiting.push(request(name, [*SHARED, 1]))
    assert admitted(scheduler, 2, []) == ["a", "b"]
