"""KVCacheManager: admission, allocation, caching and stats as in vLLM 0.33.

Block size 4; the `manager` fixture has the null block plus blocks 1..10.
"""

from __future__ import annotations

import pytest

from nanoengine.core import BlockRemoved, KVCacheBlocks, KVCacheManager, get_request_block_hasher
from nanoengine.request import Request

SYSTEM = list(range(100, 116))  # a 16-token system prompt: 4 full blocks


def ids(blocks):
    """Block ids of group 0, the only KV cache group of these tests' managers."""
    return [b.block_id for b in (blocks.blocks[0] if isinstance(blocks, KVCacheBlocks) else blocks)]


def map_entries(manager):
    return sorted((h, b.block_id) for h, b in manager.block_pool.cached_block_hash_to_block.items())


def assert_map_consistent(manager):
    for block_hash, block in manager.block_pool.cached_block_hash_to_block.items():
        assert block.block_hash == block_hash


def test_blog_post_eviction_timeline(manager, make_request, run_step, free_ids):
    """The prefix-caching blog post's t=0..t=6, on the real pool (its blocks 0-7 are our 1-10)."""
    pool = manager.block_pool
    # t=0: A's system prompt fills 4 blocks, cached as they fill.
    a = make_request("A", SYSTEM)
    assert ids(run_step(manager, a)) == [1, 2, 3, 4]
    assert len(manager.block_pool.cached_block_hash_to_block) == 4
    # t=1: A completes; its blocks become evictable, chain tail first.
    manager.free(a)
    assert free_ids(pool) == [5, 6, 7, 8, 9, 10, 4, 3, 2, 1]
    # t=2: B shares the prompt: all 4 blocks hit and leave the free queue.
    b = make_request("B", SYSTEM + [7])
    hits, num_hit_tokens = manager.get_computed_blocks(b)
    assert ids(hits) == [1, 2, 3, 4] and num_hit_tokens == 16
    run_step(manager, b)
    assert manager.get_block_ids("B") == ([1, 2, 3, 4, 5],)
    assert free_ids(pool) == [6, 7, 8, 9, 10]
    # t=3: C's different prompt misses and takes 4 never-cached blocks.
    c = make_request("C", range(500, 516))
    assert ids(run_step(manager, c)) == [6, 7, 8, 9]
    # t=4: B completes: its unhashed partial block goes to the head.
    manager.free(b)
    assert free_ids(pool) == [5, 10, 4, 3, 2, 1]
    # t=5: C completes. Two uncached free blocks (5, 10), 8 cached ones.
    manager.free(c)
    assert free_ids(pool) == [5, 10, 4, 3, 2, 1, 9, 8, 7, 6]
    pool.take_events()
    # t=6: a request needing 6 blocks takes the 2 free ones, then evicts the
    # system prompt, the least recently used.
    e = make_request("E", range(900, 924))
    assert ids(run_step(manager, e)) == [5, 10, 4, 3, 2, 1]
    removed = [ev for ev in pool.take_events() if isinstance(ev, BlockRemoved)]
    assert [ev.block_hashes for ev in removed] == [[h] for h in reversed(a.block_hashes)]
    # The next request with the system prompt pays the full prefill ...
    assert [
        ids(x) if i == 0 else x for i, x in enumerate(manager.get_computed_blocks(make_request("F", SYSTEM + [7])))
    ] == [[], 0]
    # ... while C's prompt is still cached (3 blocks: the last is recomputed).
    assert ids(manager.get_computed_blocks(make_request("G", range(500, 516)))[0]) == [6, 7, 8]


def test_hit_is_capped_at_num_tokens_minus_one(manager, make_request, run_step):
    a = make_request("A", range(8))
    run_step(manager, a)
    manager.free(a)
    assert manager.get_computed_blocks(make_request("B", range(8)))[1] == 4
    assert manager.get_computed_blocks(make_request("C", range(9)))[1] == 8


def test_fully_cached_block_aligned_prompt_recomputes_last_block(manager, make_request, run_step):
    a = make_request("A", range(8))
    run_step(manager, a)
    manager.free(a)
    b = make_request("B", range(8))
    hits, num_hit_tokens = manager.get_computed_blocks(b)
    assert num_hit_tokens == 4 and b.num_tokens - num_hit_tokens == 4
    new_blocks = manager.allocate_slots(b, 4, num_hit_tokens, hits)
    assert len(ids(new_blocks)) == 1
    # The recomputed last block is a second copy of A's; both stay mapped.
    dup = b.block_hashes[1]
    copies = [blk for h, blk in manager.block_pool.cached_block_hash_to_block.items() if h == dup]
    assert ids(copies) == [2, *ids(new_blocks)]
    assert_map_consistent(manager)


def test_lookup_stops_at_the_first_miss(make_request, run_step):
    manager = KVCacheManager(4, 4)
    a = make_request("A", range(12))
    run_step(manager, a)
    blocks = manager.coordinator.single_type_managers[0].req_to_blocks.pop("A")
    manager.coordinator.single_type_managers[0].num_cached_block.pop("A")
    # Put A's middle block at the head so that it alone is evicted.
    manager.block_pool.free_blocks([blocks[1], blocks[0], blocks[2]])
    manager.block_pool.get_new_blocks(1)
    assert manager.block_pool.get_cached_block(a.block_hashes[2]) is blocks[2]
    hits, num_hit_tokens = manager.get_computed_blocks(make_request("B", range(13)))
    assert hits.blocks == ([blocks[0]],) and num_hit_tokens == 4


def test_get_computed_blocks_does_not_touch(manager, make_request, run_step, pool_state):
    a = make_request("A", range(9))
    run_step(manager, a)
    manager.free(a)
    before = pool_state(manager.block_pool)
    hits, _ = manager.get_computed_blocks(make_request("B", range(9)))
    assert [b.ref_cnt for b in hits.blocks[0]] == [0, 0]
    assert pool_state(manager.block_pool) == before


def test_allocate_touches_hits_and_appends(manager, make_request, run_step):
    a = make_request("A", range(9))
    run_step(manager, a)
    b = make_request("B", range(10))
    hits, num_hit_tokens = manager.get_computed_blocks(b)
    new_blocks = manager.allocate_slots(b, 2, num_hit_tokens, hits)
    assert [blk.ref_cnt for blk in hits.blocks[0]] == [2, 2]
    assert manager.get_blocks("B").blocks == (hits.blocks[0] + new_blocks.blocks[0],)


def test_block_table_is_append_only_and_caches_as_blocks_fill(manager, make_request, run_step):
    request = make_request("A", range(6))
    run_step(manager, request)
    (table,) = manager.get_block_ids("A")
    assert len(manager.block_pool.cached_block_hash_to_block) == 1
    for token in range(6, 13):  # decode one token at a time
        request.append_output_token_ids(token)
        run_step(manager, request, 1)
        assert manager.get_block_ids("A")[0][: len(table)] == table
        (table,) = manager.get_block_ids("A")
    assert len(table) == 4 and request.num_computed_tokens == 13
    assert manager.coordinator.single_type_managers[0].num_cached_block["A"] == 3
    assert map_entries(manager) == sorted(zip(request.block_hashes, table[:3]))


def test_lookahead_slots_are_allocated_but_not_cached(manager, make_request):
    request = make_request("A", range(4))
    new_blocks = manager.allocate_slots(request, 4, num_lookahead_tokens=5)
    assert len(ids(new_blocks)) == 3
    assert manager.coordinator.single_type_managers[0].num_cached_block["A"] == 1


def test_allocation_that_does_not_fit_changes_nothing(make_request, run_step, manager_state):
    manager = KVCacheManager(4, 5)  # blocks 1..4
    a = make_request("A", range(9))
    run_step(manager, a)
    manager.free(a)
    # B hits A's 2 free cached blocks and needs 3 new ones: 3 <= 4 free, but
    # taking the hits out of the free queue leaves only 2.
    b = make_request("B", list(range(8)) + list(range(50, 59)))
    hits, num_hit_tokens = manager.get_computed_blocks(b)
    assert len(ids(hits)) == 2 and manager.block_pool.get_num_free_blocks() == 4
    before = manager_state(manager)
    assert manager.allocate_slots(b, b.num_tokens - num_hit_tokens, num_hit_tokens, hits) is None
    assert manager_state(manager) == before
    c = make_request("C", list(range(8)) + list(range(50, 58)))
    assert run_step(manager, c) is not None
    assert manager.block_pool.get_num_free_blocks() == 0


def test_free_releases_in_reverse_order(manager, make_request, run_step, free_ids):
    request = make_request("A", range(10))
    run_step(manager, request)
    manager.free(request)
    assert free_ids(manager.block_pool) == [3, 4, 5, 6, 7, 8, 9, 10, 2, 1]
    manager.free(request)  # a second free of the request is a no-op
    assert manager.block_pool.get_num_free_blocks() == 10


def test_same_prefix_admitted_together_gets_duplicates(manager, make_request, run_step):
    a, b = make_request("A", range(9)), make_request("B", range(9))
    assert manager.get_computed_blocks(a)[1] == manager.get_computed_blocks(b)[1] == 0
    run_step(manager, a)
    b_blocks = manager.allocate_slots(b, 9)
    assert set(ids(b_blocks)).isdisjoint(manager.get_block_ids("A")[0])
    assert len(manager.block_pool.cached_block_hash_to_block) == 2
    assert len(map_entries(manager)) == 4
    assert_map_consistent(manager)
    manager.free(a)
    c = make_request("C", range(9))
    assert len(ids(manager.get_computed_blocks(c)[0])) == 2
    manager.free(b)
    manager.block_pool.get_new_blocks(10)  # evict every copy
    assert map_entries(manager) == []


def test_prefix_cache_stats_count_tokens_at_admission(manager, make_request, run_step):
    a = make_request("A", range(9))
    run_step(manager, a)
    run_step(manager, make_request("B", range(9)))
    stats = manager.make_prefix_cache_stats()
    assert (stats.requests, stats.queries, stats.hits) == (2, 18, 8)
    assert stats.hit_rate == pytest.approx(8 / 18)
    fresh = manager.make_prefix_cache_stats()
    assert (fresh.requests, fresh.queries, fresh.hits) == (0, 0, 0)


def test_no_lookup_is_counted_without_prefix_caching(make_request, run_step):
    """vLLM 0.33's record_prefix_cache_stats counts only requests whose lookup ran (prefix_cache_lookup_enabled)."""
    manager = KVCacheManager(4, 11, enable_caching=False)
    for name in "AB":
        manager.record_prefix_cache_stats(request := make_request(name, range(9)), 0)
        run_step(manager, request)
    stats = manager.make_prefix_cache_stats()
    assert (stats.requests, stats.queries, stats.hits) == (0, 0, 0)


def test_preempted_recompute_is_not_counted_as_hits(manager, make_request, run_step):
    a = make_request("A", range(13))
    run_step(manager, a)
    manager.make_prefix_cache_stats()
    # Preemption by recompute, as the scheduler does it.
    manager.free(a)
    a.num_computed_tokens = 0
    a.num_preemptions += 1
    run_step(manager, a)
    stats = manager.make_prefix_cache_stats()
    assert (stats.requests, stats.queries, stats.hits) == (0, 0, 0)
    assert (stats.preempted_requests, stats.preempted_queries, stats.preempted_hits) == (1, 13, 12)


def test_no_stats_without_log_stats(make_request):
    manager = KVCacheManager(4, 5, log_stats=False)
    manager.get_computed_blocks(make_request("A", range(9)))
    assert manager.make_prefix_cache_stats() is None


def test_reset_refused_while_running(manager, make_request, run_step):
    a = make_request("A", range(9))
    run_step(manager, a)
    assert manager.reset_prefix_cache() is False
    assert len(ids(manager.get_computed_blocks(make_request("B", range(9)))[0])) == 2
    manager.free(a)
    assert manager.reset_prefix_cache() is True
    assert [
        ids(x) if i == 0 else x for i, x in enumerate(manager.get_computed_blocks(make_request("C", range(9))))
    ] == [[], 0]
    assert manager.make_prefix_cache_stats().reset is True
    assert manager.usage == 0.0


def test_caching_disabled(make_request, run_step, free_ids):
    manager = KVCacheManager(4, 11, enable_caching=False)
    a = make_request("A", range(9))
    run_step(manager, a)
    assert manager.usage == pytest.approx(0.3)
    manager.free(a)
    assert [
        ids(x) if i == 0 else x for i, x in enumerate(manager.get_computed_blocks(make_request("B", range(9))))
    ] == [[], 0]
    assert len(manager.block_pool.cached_block_hash_to_block) == 0
    assert all(b.block_hash is None for b in manager.block_pool.blocks)
    assert free_ids(manager.block_pool)[:3] == [3, 2, 1]
    assert manager.make_prefix_cache_stats().requests == 0


@pytest.mark.parametrize("check", [False, True])
def test_forced_collision_is_a_miss_in_check_mode(check):
    hasher = get_request_block_hasher(4, lambda data: b"weak")  # every block collides
    manager = KVCacheManager(4, 11, check_hash_collisions=check)
    a = Request("A", list(range(9)), block_hasher=hasher)
    manager.allocate_slots(a, 9)
    b = Request("B", list(range(50, 59)), block_hasher=hasher)
    hits, _ = manager.get_computed_blocks(b)
    if check:
        assert ids(hits) == [] and manager.block_pool.num_collisions == 1
    else:  # without the check, B would reuse A's KV: the bug the lesson shows
        assert len(ids(hits)) == 2 and manager.block_pool.num_collisions == 0


# Bad inputs: a clear ValueError and nothing changed.


def test_negative_token_count_is_rejected(manager, make_request, manager_state):
    before = manager_state(manager)
    with pytest.raises(ValueError, match="num_new_tokens=-1"):
        manager.allocate_slots(make_request("A", range(4)), -1)
    assert manager_state(manager) == before


def test_cache_hits_for_a_running_request_are_rejected(manager, make_request, run_step, manager_state):
    a = make_request("A", range(9))
    run_step(manager, a)
    b = make_request("B", range(5))
    run_step(manager, b)
    before = manager_state(manager)
    hits = KVCacheBlocks((manager.get_blocks("A").blocks[0][:1],))
    with pytest.raises(ValueError, match="already holds blocks"):
        manager.allocate_slots(b, 1, 4, hits)
    assert manager_state(manager) == before


def test_request_without_hasher_is_rejected_when_caching(manager, manager_state):
    before = manager_state(manager)
    with pytest.raises(ValueError, match="block_hasher=get_request_block_hasher"):
        manager.allocate_slots(Request("A", list(range(8))), 8)
    assert manager_state(manager) == before


def test_bad_block_size_is_rejected():
    with pytest.raises(ValueError, match="block_size must be positive"):
        KVCacheManager(0, 4)
