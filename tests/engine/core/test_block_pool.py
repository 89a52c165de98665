"""BlockPool semantics, one vLLM 0.33 behaviour or pitfall per test."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from nanoengine.core import AllBlocksCleared, BlockPool, BlockRemoved, BlockStored

BS = 4


def fake_request(num_blocks, tag=b"h", request_id="r", lora_name=None):
    """A request whose block i has hash tag+i and tokens 100*i .. 100*i+3."""
    return SimpleNamespace(
        request_id=request_id,
        block_hashes=[tag + bytes([i]) for i in range(num_blocks)],
        all_token_ids=[100 * i + j for i in range(num_blocks) for j in range(BS)],
        lora_name=lora_name,
    )


def cached_blocks(pool, request):
    """Allocate and cache all of the request's blocks; they stay referenced."""
    blocks = pool.get_new_blocks(len(request.block_hashes))
    pool.cache_full_blocks(request, blocks, 0, len(blocks), BS)
    return blocks


@pytest.fixture
def pool():
    return BlockPool(8, enable_caching=True, enable_kv_cache_events=True)


def test_block_zero_is_the_null_block(pool, free_ids):
    assert pool.null_block is pool.blocks[0] and pool.null_block.is_null
    assert free_ids(pool) == [1, 2, 3, 4, 5, 6, 7]
    assert pool.get_num_free_blocks() == 7
    assert 0 not in [b.block_id for b in pool.get_new_blocks(7)]


def test_null_block_ref_cnt_is_not_tracked(pool, free_ids):
    pool.touch([pool.null_block])
    pool.free_blocks([pool.null_block])
    assert pool.null_block.ref_cnt == 0
    assert 0 not in free_ids(pool)


def test_get_new_blocks_pops_from_the_head(pool, free_ids):
    blocks = pool.get_new_blocks(3)
    assert [b.block_id for b in blocks] == [1, 2, 3]
    assert [b.ref_cnt for b in blocks] == [1, 1, 1]
    assert free_ids(pool) == [4, 5, 6, 7]
    assert pool.get_usage() == pytest.approx(3 / 7)


def test_freed_cached_block_stays_a_hit_until_reallocated(pool):
    request = fake_request(1)
    (block,) = cached_blocks(pool, request)
    pool.free_blocks([block])
    assert pool.get_cached_block(b"h\x00") is block  # lazy: not evicted on free
    pool.take_events()
    pool.get_new_blocks(6)
    assert pool.get_cached_block(b"h\x00") is block
    assert pool.take_events() == []
    assert pool.get_new_blocks(1) == [block]  # now it is evicted
    assert pool.get_cached_block(b"h\x00") is None
    assert block.block_hash is None
    assert pool.take_events() == [BlockRemoved(block_hashes=[b"h\x00"])]


def test_stale_hash_is_evicted_at_reallocation(pool):
    old = fake_request(1, tag=b"old")
    (block,) = cached_blocks(pool, old)
    pool.free_blocks([block])
    pool.get_new_blocks(6)  # everything ahead of the cached block
    (reused,) = pool.get_new_blocks(1)
    assert reused is block
    new = fake_request(1, tag=b"new")
    pool.cache_full_blocks(new, [reused], 0, 1, BS)
    assert pool.get_cached_block(b"old\x00") is None
    assert pool.get_cached_block(b"new\x00") is reused
    assert dict(pool.cached_block_hash_to_block.items()) == {b"new\x00": reused}


def test_touch_rescues_a_free_block_then_counts(pool, free_ids):
    blocks = cached_blocks(pool, fake_request(2))
    pool.free_blocks(reversed(blocks))
    pool.touch([blocks[0]])
    assert blocks[0].ref_cnt == 1 and blocks[0].block_id not in free_ids(pool)
    pool.touch([blocks[0]])
    assert blocks[0].ref_cnt == 2
    assert pool.get_num_free_blocks() == 6


def test_free_returns_only_blocks_reaching_zero(pool, free_ids):
    (block,) = pool.get_new_blocks(1)
    pool.touch([block])
    pool.free_blocks([block])
    assert block.ref_cnt == 1 and 1 not in free_ids(pool)
    pool.free_blocks([block])
    assert block.ref_cnt == 0 and 1 in free_ids(pool)


def test_free_order_unhashed_to_head_hashed_to_tail(pool, free_ids):
    older = cached_blocks(pool, fake_request(1, tag=b"o"))  # block 1
    pool.free_blocks(older)
    request = fake_request(3)
    blocks = pool.get_new_blocks(5)  # 2, 3, 4, 5, 6: three full, two partial
    pool.cache_full_blocks(request, blocks, 0, 3, BS)
    pool.free_blocks(reversed(blocks))
    # [unhashed..., older..., tail-of-chain, ..., root]
    assert free_ids(pool) == [6, 5, 7, 1, 4, 3, 2]


def test_caching_off_frees_to_the_head(free_ids):
    pool = BlockPool(5, enable_caching=False)
    blocks = pool.get_new_blocks(2)
    pool.free_blocks(reversed(blocks))
    assert free_ids(pool) == [2, 1, 3, 4]
    assert pool.get_new_blocks(1) == [blocks[1]]


def test_same_content_cached_twice_keeps_both_blocks(pool):
    first = cached_blocks(pool, fake_request(1))
    second = cached_blocks(pool, fake_request(1))
    entries = sorted(b.block_id for h, b in pool.cached_block_hash_to_block.items())
    assert entries == [first[0].block_id, second[0].block_id]
    assert len(pool.cached_block_hash_to_block) == 1
    pool.free_blocks(first)
    pool.free_blocks(second)
    pool.get_new_blocks(5)
    assert pool.get_new_blocks(1) == first  # evicts the first copy only
    assert pool.get_cached_block(b"h\x00") is second[0]


def test_block_stored_event_carries_parent_tokens_and_lora(pool):
    request = fake_request(3, lora_name="ad")
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(request, blocks, 0, 1, BS)
    pool.cache_full_blocks(request, blocks, 1, 3, BS)
    assert pool.take_events() == [
        BlockStored([b"h\x00"], None, [0, 1, 2, 3], BS, "ad"),
        BlockStored([b"h\x01", b"h\x02"], b"h\x00", [100, 101, 102, 103, 200, 201, 202, 203], BS, "ad"),
    ]
    assert pool.take_events() == []


def test_no_events_are_queued_when_disabled():
    pool = BlockPool(4, enable_caching=True)
    blocks = cached_blocks(pool, fake_request(3))
    pool.free_blocks(blocks)
    pool.get_new_blocks(3)
    assert pool.reset_prefix_cache() is False
    assert pool.kv_event_queue == [] and pool.take_events() == []


def test_reset_refused_while_a_block_is_in_use(pool, pool_state):
    blocks = cached_blocks(pool, fake_request(2))
    before = pool_state(pool)
    assert pool.reset_prefix_cache() is False
    assert pool_state(pool) == before
    pool.free_blocks(reversed(blocks))
    assert pool.reset_prefix_cache() is True
    assert len(pool.cached_block_hash_to_block) == 0
    assert all(b.block_hash is None for b in pool.blocks)
    assert pool.take_events()[-1] == AllBlocksCleared()


# Bad inputs: a clear ValueError and an untouched pool.


@pytest.fixture
def busy_pool(pool):
    """Some blocks in use, some cached and free, so state checks mean something."""
    blocks = cached_blocks(pool, fake_request(3))
    pool.free_blocks(reversed(blocks[1:]))
    pool.get_new_blocks(1)
    return pool


@pytest.mark.parametrize("n, match", [(-1, "Cannot take -1 blocks"), (7, "Cannot take 7 blocks: 5 are free")])
def test_bad_block_count_leaves_state_intact(busy_pool, pool_state, n, match):
    before = pool_state(busy_pool)
    with pytest.raises(ValueError, match=match):
        busy_pool.get_new_blocks(n)
    assert pool_state(busy_pool) == before


def test_double_free_leaves_state_intact(busy_pool, pool_state):
    in_use, free = busy_pool.blocks[1], busy_pool.blocks[2]
    assert in_use.ref_cnt == 1 and free.ref_cnt == 0
    before = pool_state(busy_pool)
    with pytest.raises(ValueError, match="Double free: block 2"):
        busy_pool.free_blocks([in_use, free])
    with pytest.raises(ValueError, match="Double free: block 1"):
        busy_pool.free_blocks([in_use, in_use])
    assert pool_state(busy_pool) == before


def test_caching_without_hashes_leaves_state_intact(busy_pool, pool_state):
    request = fake_request(1)
    blocks = busy_pool.get_new_blocks(2)
    before = pool_state(busy_pool)
    with pytest.raises(ValueError, match="has only 1 block hashes"):
        busy_pool.cache_full_blocks(request, blocks, 0, 2, BS)
    with pytest.raises(ValueError, match="Allocate the blocks before caching"):
        busy_pool.cache_full_blocks(fake_request(3), blocks, 0, 3, BS)
    assert pool_state(busy_pool) == before


def test_caching_a_cached_block_again_leaves_state_intact(busy_pool, pool_state):
    cached = busy_pool.blocks[1]
    fresh = busy_pool.get_new_blocks(1)
    before = pool_state(busy_pool)
    with pytest.raises(ValueError, match="Block 1 is already cached"):
        busy_pool.cache_full_blocks(fake_request(2, tag=b"x"), fresh + [cached], 0, 2, BS)
    assert pool_state(busy_pool) == before


def test_block_size_must_match_hash_block_size(pool_state):
    pool = BlockPool(4, enable_caching=True, hash_block_size=BS)
    blocks = pool.get_new_blocks(1)
    before = pool_state(pool)
    with pytest.raises(ValueError, match="differs from the pool's hash_block_size 4"):
        pool.cache_full_blocks(fake_request(1), blocks, 0, 1, 2 * BS)
    assert pool_state(pool) == before


def test_pool_needs_the_null_block():
    with pytest.raises(ValueError, match="at least 1"):
        BlockPool(0, enable_caching=True)


# Collision check mode


def test_collision_is_a_miss_and_counted(free_ids):
    pool = BlockPool(6, enable_caching=True, check_hash_collisions=True)
    a = fake_request(1)
    b = SimpleNamespace(**{**vars(fake_request(1)), "all_token_ids": [7, 7, 7, 7]})
    (block_a,) = cached_blocks(pool, a)
    assert pool.get_cached_block(b"h\x00", [0, 1, 2, 3]) is block_a
    assert pool.get_cached_block(b"h\x00", [7, 7, 7, 7]) is None
    assert pool.num_collisions == 1
    (block_b,) = cached_blocks(pool, b)  # b's own copy under the same hash
    assert pool.get_cached_block(b"h\x00", [7, 7, 7, 7]) is block_b
    assert pool.get_cached_block(b"h\x00", [0, 1, 2, 3]) is block_a
    assert pool.get_cached_block(b"zz", [7, 7, 7, 7]) is None
    assert pool.num_collisions == 1
    pool.free_blocks([block_a])
    pool.get_new_blocks(3)
    assert pool.get_new_blocks(1) == [block_a]  # evicted with its stored tokens
    assert pool.cached_token_ids == {block_b.block_id: (7, 7, 7, 7)}


def test_collision_mode_needs_token_ids():
    pool = BlockPool(3, enable_caching=True, check_hash_collisions=True)
    with pytest.raises(ValueError, match="pass the block's token ids"):
        pool.get_cached_block(b"h")


def test_a_block_listed_twice_drops_two_references_and_is_queued_once():
    pool = BlockPool(6, True, 4)
    blocks = pool.get_new_blocks(1)
    pool.touch(blocks)  # ref_cnt 2: two requests hold it
    pool.free_blocks([blocks[0], blocks[0]])
    assert blocks[0].ref_cnt == 0 and pool.get_num_free_blocks() == 5
    assert [b.block_id for b in pool.free_block_queue.get_all_free_blocks()].count(blocks[0].block_id) == 1
