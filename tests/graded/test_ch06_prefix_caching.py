"""Chapter 06 graded tasks: prefix caching on the engine's own pool. Run with `make grade CH=06`."""

import copy
from types import SimpleNamespace

import pytest

from nanoengine.core import BlockRemoved, KVCacheManager, get_request_block_hasher
from nanoengine.course.lru_view import chatbot_prompts, free_queue_ids
from nanoengine.request import Request, RequestStatus
from nanoengine.scheduler import Scheduler, SchedulerConfig

CHAPTER = "ch06_prefix_caching"
BS = 4
HASHER = get_request_block_hasher(BS)


def _engine_longest_cache_hit(pool, block_hashes, num_tokens, block_size):
    """KVCacheManager.get_computed_blocks over the given pool."""
    request = SimpleNamespace(block_hashes=list(block_hashes), num_tokens=num_tokens, num_preemptions=0,
                              all_token_ids=[0] * num_tokens)
    return KVCacheManager(block_size, pool, log_stats=False).get_computed_blocks(request)[0]


def _engine_free_request(pool, blocks):
    """KVCacheManager.free on a manager that holds just these blocks."""
    manager = KVCacheManager(BS, pool, log_stats=False)
    manager.req_to_blocks["r"] = list(blocks)
    manager.free(SimpleNamespace(request_id="r"))


def _engine_admit(manager, request):
    """The scheduler's admission (Scheduler._admit), run by schedule() on a scheduler holding only this request."""
    scheduler = Scheduler(SchedulerConfig(max_num_batched_tokens=request.num_tokens), manager)
    scheduler.add_request(request)
    scheduler.schedule()
    return request.num_cached_tokens if request.status == RequestStatus.RUNNING else None


def _engine_eviction_order(pool, num_blocks):
    """BlockPool.get_new_blocks on a copy of the pool: the popped blocks that still had a hash."""
    clone = copy.deepcopy(pool)
    had_hash = {block.block_id for block in clone.blocks if block.block_hash is not None}
    return [block.block_id for block in clone.get_new_blocks(num_blocks) if block.block_id in had_hash]


NANOENGINE = {
    "longest_cache_hit": _engine_longest_cache_hit,
    "free_request": _engine_free_request,
    "admit": _engine_admit,
    "eviction_order": _engine_eviction_order,
}


def request(req_id, tokens):
    return Request(req_id, list(tokens), block_hasher=HASHER)


def running(manager, req_id, tokens):
    """A request admitted by the engine itself; returns it and its block table."""
    req = request(req_id, tokens)
    assert _engine_admit(manager, req) is not None
    return req, list(manager.get_blocks(req_id))


def pool_state(pool):
    return (free_queue_ids(pool), [(b.block_id, b.ref_cnt, b.block_hash) for b in pool.blocks],
            sorted((h, b.block_id) for h, b in pool.cached_block_hash_to_block.items()), len(pool.kv_event_queue))


def manager_state(manager):
    return (pool_state(manager.block_pool), {r: [b.block_id for b in bs] for r, bs in manager.req_to_blocks.items()},
            dict(manager.num_cached_block))


@pytest.mark.task("06.1", "longest_cache_hit returns the pool's blocks, capped one token short")
def test_longest_cache_hit(impl):
    kv = KVCacheManager(BS, 11)
    a, table = running(kv, "A", range(13))
    kv.free(a)
    pool = kv.block_pool
    before = pool_state(pool)
    hits = impl.longest_cache_hit(pool, a.block_hashes, 13, BS)
    assert [b.block_id for b in hits] == [b.block_id for b in table[:3]], "13 tokens: all 3 full blocks hit"
    assert all(x is y for x, y in zip(hits, table)), "return the pool's own KVCacheBlock objects"
    assert len(impl.longest_cache_hit(pool, a.block_hashes, 12, BS)) == 2, \
        "a 12-token prompt may reuse 8 tokens at most: its last token must be computed"
    assert impl.longest_cache_hit(pool, [b"unknown"] + a.block_hashes[1:], 13, BS) == []
    assert pool_state(pool) == before, "a lookup must not change ref_cnt or the free queue"


@pytest.mark.task("06.1b", "longest_cache_hit stops at the first miss")
def test_lookup_stops_at_first_miss(impl):
    kv = KVCacheManager(BS, 4)  # three usable blocks
    a, table = running(kv, "A", range(12))
    pool = kv.block_pool
    pool.free_blocks([table[1], table[0], table[2]])  # the middle block first in line...
    pool.get_new_blocks(1)  # ...so it alone is evicted
    assert pool.get_cached_block(a.block_hashes[2]) is table[2], "block 2 is still cached"
    hits = impl.longest_cache_hit(pool, a.block_hashes, 13, BS)
    assert [b.block_id for b in hits] == [table[0].block_id], "block 2 is cached but unreachable past the miss"


@pytest.mark.task("06.2", "free_request: unhashed blocks to the head, the chain to the tail, root last")
def test_free_request_order(impl):
    kv = KVCacheManager(BS, 11)
    old, (old_block,) = running(kv, "O", range(50, 54))
    kv.free(old)
    a, table = running(kv, "A", range(14))  # three full blocks and a partial one
    ids = [b.block_id for b in table]
    pool = kv.block_pool
    impl.free_request(pool, table)
    queue = free_queue_ids(pool)
    assert [b.ref_cnt for b in table] == [0, 0, 0, 0]
    assert len(queue) == 10, "every block of the request is free again, once"
    assert queue[0] == ids[3], "the partial block has no hash: it goes to the head, reused first"
    assert queue[-3:] == ids[2::-1], "the chain goes to the tail last block first, so its root is evicted last"
    assert queue.index(old_block.block_id) < queue.index(ids[2]), "blocks freed earlier stay ahead"
    assert pool.get_cached_block(a.block_hashes[0]) is table[0], "freeing keeps the hashes (lazy eviction)"


@pytest.mark.task("06.2b", "free_request leaves shared blocks held and skips the null block")
def test_free_request_shared_and_null(impl):
    kv = KVCacheManager(BS, 11)
    _, table_a = running(kv, "A", range(9))
    _, table_b = running(kv, "B", [*range(8), 99, 98])  # reuses A's first two blocks
    pool = kv.block_pool
    impl.free_request(pool, table_a)
    assert [b.ref_cnt for b in table_a] == [1, 1, 0], "B still holds the first two blocks"
    assert free_queue_ids(pool)[0] == table_a[2].block_id
    assert table_a[0].block_id not in free_queue_ids(pool)
    impl.free_request(pool, [pool.null_block, *table_b])
    assert pool.null_block.ref_cnt == 0 and 0 not in free_queue_ids(pool), "the null block is never freed"
    assert free_queue_ids(pool)[-2:] == [table_b[1].block_id, table_b[0].block_id]
    assert pool.get_num_free_blocks() == 10


@pytest.mark.task("06.2c", "free_request keeps a chatbot's hot prefixes as well as the engine does")
def test_free_request_serves_a_chatbot(impl):
    prompts = chatbot_prompts(60, num_systems=3, system_tokens=12, question_tokens=3, seed=1)

    def hits_with(free):
        kv = KVCacheManager(BS, 10)  # nine usable blocks: three system prompts of 3 cannot all stay
        hits = []
        for i, tokens in enumerate(prompts):
            req, table = running(kv, str(i), tokens)
            hits.append(req.num_cached_tokens)
            del kv.req_to_blocks[req.request_id], kv.num_cached_block[req.request_id]
            free(kv.block_pool, table)
        return hits

    assert hits_with(impl.free_request) == hits_with(_engine_free_request), \
        "with your free_request the same requests must hit the same cached tokens"


@pytest.mark.task("06.3", "admit reuses the cached prefix and allocates only the rest")
def test_admit(impl):
    kv = KVCacheManager(BS, 11)
    a = request("A", range(10))
    assert impl.admit(kv, a) == 0
    assert a.num_computed_tokens == 10 and len(kv.get_blocks("A")) == 3
    b = request("B", [*range(8), 50, 51, 52, 53, 54])
    assert impl.admit(kv, b) == 8
    assert kv.get_blocks("B")[:2] == kv.get_blocks("A")[:2] and [x.ref_cnt for x in kv.get_blocks("B")[:2]] == [2, 2]
    assert len(kv.get_blocks("B")) == 4, "13 tokens need 4 blocks: 2 reused, 2 new"
    kv.free(a)
    kv.free(b)
    c = request("C", range(8))
    assert impl.admit(kv, c) == 4, "C is exactly A's first 8 tokens: its last block is recomputed"
    stats = kv.make_prefix_cache_stats()
    assert (stats.requests, stats.queries, stats.hits) == (3, 31, 12), "one lookup per admission"


@pytest.mark.task("06.3b", "admit is all or nothing, counting hits that must leave the free queue")
def test_admit_all_or_nothing(impl):
    kv = KVCacheManager(BS, 5)  # four usable blocks
    a, _ = running(kv, "A", range(9))
    kv.free(a)  # four free blocks, two of them cached
    b = request("B", [*range(8), *range(50, 59)])  # 2 hits + 3 new blocks: 5 of 4
    before = manager_state(kv)
    assert impl.admit(kv, b) is None, "the hits leave the free queue too: B needs 5 free blocks, 4 are free"
    assert manager_state(kv) == before and b.num_computed_tokens == 0, "a refused admission changes nothing"
    c = request("C", [*range(8), *range(50, 58)])  # 2 hits + 2 new blocks
    assert impl.admit(kv, c) == 8 and kv.block_pool.get_num_free_blocks() == 0


@pytest.mark.task("06.4", "eviction_order predicts lazy eviction along a mini timeline")
def test_eviction_order(impl):
    kv = KVCacheManager(BS, 9, enable_kv_cache_events=True)  # blocks 1..8
    pool = kv.block_pool
    system = list(range(100, 108))  # two blocks
    a, _ = running(kv, "A", [*system, 1, 2, 3])  # blocks 1, 2 cached; 3 partial
    assert impl.eviction_order(pool, 3) == [], "never-cached blocks are taken before any cached one"
    b, _ = running(kv, "B", range(200, 212))  # blocks 4, 5, 6
    kv.free(a)
    kv.free(b)
    assert free_queue_ids(pool) == [3, 7, 8, 2, 1, 6, 5, 4]
    before = pool_state(pool)
    assert impl.eviction_order(pool, 3) == []
    assert impl.eviction_order(pool, 5) == [2, 1], "the older chain goes first, its tail before its root"
    assert impl.eviction_order(pool, 8) == [2, 1, 6, 5, 4]
    assert pool_state(pool) == before, "predicting must not change the pool"
    running(kv, "C", [*system, 9])  # reuses blocks 1 and 2: they leave the free queue
    assert impl.eviction_order(pool, 4) == [6, 5]
    pool.take_events()
    pool.get_new_blocks(4)
    removed = [h for ev in pool.take_events() if isinstance(ev, BlockRemoved) for h in ev.block_hashes]
    assert removed == b.block_hashes[2:0:-1], "and the pool really evicts B's last two blocks, in that order"
    with pytest.raises(ValueError):
        impl.eviction_order(pool, 5)
