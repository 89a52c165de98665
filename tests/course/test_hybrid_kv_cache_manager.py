"""KV cache groups: the layout, the sliding-window manager's two rules, and the coordinator's fixed
point, each against a brute-force statement of what vLLM's code computes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanocourse.hybrid import cache_blocks_at, traced_hit
from nanoengine.core import (
    BlockPool,
    HybridKVCacheCoordinator,
    KVCacheManager,
    SlidingWindowManager,
    get_request_block_hasher,
    make_block_hash_with_group_id,
)
from nanoengine.kv_cache_interface import KVCacheGroupSpec, get_kv_cache_groups
from nanoengine.request import Request

BS = 4
HASHES = [bytes([i]) * 16 for i in range(40)]


def cache(pool: BlockPool, group_id: int, indices) -> None:
    cache_blocks_at(pool, group_id, indices, HASHES, BS)


def make_request(request_id, tokens):
    return Request(request_id, list(tokens), block_hasher=get_request_block_hasher(BS))


@pytest.mark.parametrize(
    "windows, expected",
    [
        ([None] * 4, [((0, 1, 2, 3), None)]),
        ([8] * 3, [((0, 1, 2), 8)]),
        ([8, 8, 8, None], [((3,), None), ((0,), 8), ((1,), 8), ((2,), 8)]),  # a Gemma-3-like 3:1
        ([None, 8] * 4, [((0, 2, 4, 6), None), ((1, 3, 5, 7), 8)]),  # gpt-oss alternates 1:1
        ([8, 8, None] * 2 + [8, 8], [((2, 5), None), ((0, 4), 8), ((1, 6), 8), ((3, 7), 8)]),  # 6:2, dealt round-robin
        ([None] * 3 + [8] * 4, [((0, 1, 2), None), ((3, 4, 5, 6), 8)]),  # 4 < 1.5 x 3: one group per type, padded
    ],
)
def test_groups_hold_equal_layer_counts_full_attention_first(windows, expected):
    assert [(g.layer_ids, g.sliding_window) for g in get_kv_cache_groups(windows)] == expected


def sliding(window, pool=None, use_eagle=False):
    pool = pool or BlockPool(60, enable_caching=True)
    return SlidingWindowManager(KVCacheGroupSpec((0,), window), pool, BS, 0, use_eagle)


@pytest.mark.parametrize("window", [4, 5, 9, 12])
def test_remove_skipped_blocks_nulls_exactly_the_blocks_no_query_can_see(window):
    manager = sliding(window)
    pool = manager.block_pool
    manager.allocate_new_computed_blocks("r", [], 0)
    blocks = list(manager.allocate_new_blocks("r", 60))
    free_before = pool.get_num_free_blocks()
    for c in range(61):  # the next query sits at position c and sees c - W + 1 .. c
        manager.remove_skipped_blocks("r", c)
        held = manager.req_to_blocks["r"]
        num_null = sum(b.is_null for b in held)
        first_seen = max(0, c - window + 1)
        assert num_null == first_seen // BS, f"c={c}"
        assert all(b.is_null for b in held[:num_null]) and held[num_null:] == blocks[num_null:]
        # A block is freed only once every token in it is before first_seen.
        assert pool.get_num_free_blocks() == free_before + num_null
        assert all(b.ref_cnt == 0 for b in blocks[:num_null]) and all(b.ref_cnt == 1 for b in blocks[num_null:])


def brute_force_sliding(cached: list[bool], window: int, max_blocks: int, eagle=False) -> int:
    """vLLM's rule, stated directly: the longest hit of L blocks needs blocks
    max(0, L - need) .. L - 1 cached, need = ceil((W - 1) / block_size) (one more with EAGLE, which then
    drops the last)."""
    need = -(-(window - 1) // BS) + eagle
    for length in range(max_blocks, -1, -1):
        if all(cached[max(0, length - need) : length]):
            return max(length - eagle, 0) if length else 0
    return 0


@settings(max_examples=300, deadline=None, database=None)
@given(
    cached=st.lists(st.booleans(), min_size=0, max_size=24),
    window=st.integers(4, 20),
    max_length=st.integers(0, 100),
    eagle=st.booleans(),
)
def test_sliding_hit_search_from_the_right_matches_brute_force(cached, window, max_length, eagle):
    pool = BlockPool(40, enable_caching=True)
    cache(pool, 0, [i for i, c in enumerate(cached) if c])
    manager = sliding(window, pool, use_eagle=eagle)
    max_blocks = min(max_length // BS, len(cached))
    (hit,) = manager.find_longest_cache_hit(HASHES[: len(cached)], max_blocks * BS, [0])
    expected = brute_force_sliding(cached, window, max_blocks, eagle)
    assert len(hit) == expected
    need = -(-(window - 1) // BS)
    for i, block in enumerate(hit):  # null before the window's blocks, the cached block within them
        if i < expected - need:
            assert block.is_null
        else:
            assert block is pool.get_cached_block(HASHES[i], kv_cache_group_id=0)


def test_groups_never_serve_each_others_blocks():
    pool = BlockPool(10, enable_caching=True)
    cache(pool, 1, [0, 1])
    assert pool.get_cached_block(HASHES[0], kv_cache_group_id=1) is not None
    assert pool.get_cached_block(HASHES[0], kv_cache_group_id=0) is None
    assert pool.get_cached_block(HASHES[0]) is None  # group 0's name: the bare hash
    (block,) = [b for h, b in pool.cached_block_hash_to_block.items() if b.block_hash == h][:1]
    assert block.block_hash == make_block_hash_with_group_id(HASHES[0], 1) != HASHES[0]
    # Group 0 keeps the bare hash (vLLM appends 0 too), so a one-group model keeps chapter 04's names.
    assert make_block_hash_with_group_id(HASHES[0], 0) == HASHES[0]


def coordinator(windows, pool, use_eagle=False):
    groups = [KVCacheGroupSpec((i,), w) for i, w in enumerate(windows)]
    return HybridKVCacheCoordinator(groups, pool, BS, use_eagle=use_eagle)


def test_fixed_point_when_the_groups_disagree():
    """Full attention hits 10 blocks; window 9 (2 blocks) misses block 6, window 13 (3 blocks) block 8.
    Window 13 cuts the hit to 8 blocks, where window 9 now lacks block 6: it cuts to 6, which window 13
    accepts. One pass in this order would stop at 8, a hit window 9 cannot serve."""
    pool = BlockPool(60, enable_caching=True)
    cache(pool, 0, range(10))
    cache(pool, 1, [i for i in range(10) if i != 6])
    cache(pool, 2, [i for i in range(10) if i != 8])
    hits, length, calls = traced_hit(coordinator([None, 9, 13], pool), HASHES[:11], 10 * BS)
    assert length == 6 * BS and [len(h) for h in hits] == [6, 6, 6]
    # Full attention is searched once; the sliding types until the length stops shrinking.
    assert calls == [
        ((0,), 40, 40),
        ((1,), 40, 40),
        ((2,), 40, 32),
        ((1,), 32, 24),
        ((2,), 24, 24),
        ((1,), 24, 24),
        ((2,), 24, 24),
    ]
    assert [b.is_null for b in hits[2]] == [True] * 3 + [False] * 3


@settings(max_examples=300, deadline=None, database=None)
@given(data=st.data(), n=st.integers(0, 16), w1=st.integers(4, 16), w2=st.integers(4, 16))
def test_fixed_point_is_the_longest_hit_every_group_serves(data, n, w1, w2):
    patterns = [data.draw(st.lists(st.booleans(), min_size=n, max_size=n)) for _ in range(3)]
    pool = BlockPool(60, enable_caching=True)
    for group_id, pattern in enumerate(patterns):
        cache(pool, group_id, [i for i, c in enumerate(pattern) if c])
    _, length = coordinator([None, w1, w2], pool).find_longest_cache_hit(HASHES[:n], n * BS)

    def served(blocks: int) -> bool:
        return all(patterns[0][:blocks]) and all(
            brute_force_sliding(patterns[g][:blocks], w, blocks) == blocks for g, w in ((1, w1), (2, w2))
        )

    assert length == BS * max(b for b in range(n + 1) if served(b))


def test_eagle_costs_one_block_whatever_the_attention_types():
    """With EAGLE the head's KV at the last hit position was built with another request's next token, so that
    block is recomputed: full attention drops its last hit; a sliding window asks one block more, then drops it.
    These groups carry no is_eagle_group flag, so every group drops (vLLM's fallback), and each type searches one
    block past the candidate length (as vLLM does since its issue #32802): a hybrid loses one block, not one per
    type, and with two windows the fixed point does not spiral down to 0."""
    pool = BlockPool(60, enable_caching=True)
    for group_id in range(3):
        cache(pool, group_id, range(8))
    for windows, eagle, expected in (
        ([None, 9], False, 8),
        ([None], True, 7),
        ([9], True, 7),
        ([None, 9], True, 7),
        ([None, 9, 13], True, 7),
        ([9, 13], True, 7),
    ):
        _, length = coordinator(windows, pool, use_eagle=eagle).find_longest_cache_hit(HASHES[:9], 8 * BS)
        assert length == expected * BS, (windows, eagle)


def test_eagle_may_search_every_full_block_of_a_block_aligned_prompt():
    """vLLM 0.33 caps EAGLE's one-block-further search at the request's full blocks (len(block_hashes) *
    block_size), not at the last-token cap: a 32-token prompt with blocks 0-7 cached hits 28 tokens, since
    the last block, given back for the last token, is the one EAGLE drops (before vLLM's rule here: 24)."""
    pool = BlockPool(60, enable_caching=True)
    for group_id in range(2):
        cache(pool, group_id, range(8))
    for windows in ([None], [9], [None, 9]):
        _, length = coordinator(windows, pool, use_eagle=True).find_longest_cache_hit(HASHES[:8], 7 * BS)
        assert length == 7 * BS, windows


def test_eagle_hit_is_one_every_type_serves_one_block_further():
    """Full attention caches blocks 0-7, window 9 all but block 4, window 13 all but block 6. A window
    needs ceil((W - 1) / 4) cached blocks before a hit's end, one more with EAGLE, which it then drops (no group
    is flagged is_eagle_group, so every group drops: vLLM's fallback)."""
    pool = BlockPool(60, enable_caching=True)
    cache(pool, 0, range(8))
    cache(pool, 1, [i for i in range(8) if i != 4])
    cache(pool, 2, [i for i in range(8) if i != 6])
    # Full attention and window 9: full attention's 8 blocks drop to 7; window 9 searches up to block 8,
    # finds the run 5-7 ending at 8 and drops one: 7, one block short of the hit without EAGLE.
    lengths = [
        coordinator([None, 9], pool, use_eagle=eagle).find_longest_cache_hit(HASHES[:9], 8 * BS)[1] // BS
        for eagle in (False, True)
    ]
    assert lengths == [8, 7]
    # With window 13 too: it needs 4 blocks in a row below block 8 and finds 2-5 (block 6 is missing), so 5;
    # window 9, searching up to block 6, finds 1-3 (block 4 is missing), so 3, which both windows then serve.
    _, length = coordinator([None, 9, 13], pool, use_eagle=True).find_longest_cache_hit(HASHES[:9], 8 * BS)
    assert length == 3 * BS


def test_a_repeated_prompt_hits_in_every_group_with_nulls_before_the_window():
    pool = BlockPool(60, enable_caching=True)
    # Dense retention: every full block cached. (vLLM 0.33's default caches a's sliding blocks only before token 36,
    # where a resend of a's prompt hits, so b, which extends it, would hit 36 tokens: test_sliding_window_retention.)
    manager = KVCacheManager(
        BS, pool, kv_cache_groups=get_kv_cache_groups([9, None]), prefix_cache_retention_interval=None
    )
    assert isinstance(manager.coordinator, HybridKVCacheCoordinator)
    a = make_request("a", range(40))
    assert manager.allocate_slots(a, 40) is not None
    a.num_computed_tokens = 40
    manager.free(a)
    b = make_request("b", list(range(40)) + [7, 7])
    hits, num_hit = manager.get_computed_blocks(b)
    full, window = hits.blocks
    assert num_hit == 40 and len(full) == len(window) == 10
    assert not any(b.is_null for b in full)
    assert [b.is_null for b in window] == [True] * 8 + [False] * 2  # ceil(8 / 4) blocks cover the window
    # Taking the hit: the sliding group's blocks before position 40 - 9 + 1 = 32 stay null.
    needed = manager.coordinator.get_num_blocks_to_allocate(b.request_id, b.num_tokens, hits.blocks, num_hit)
    assert needed == 10 + 2 + 1 + 1  # evictable hits (full 10, window 2) and one new block per group
    free = pool.get_num_free_blocks()
    manager.allocate_slots(b, 2, num_hit, hits)
    assert pool.get_num_free_blocks() == free - needed
    assert [blk.is_null for blk in manager.get_blocks("b").blocks[1]] == [True] * 8 + [False] * 3
    manager.free(b)
    assert pool.get_num_free_blocks() == 59 and all(blk.ref_cnt == 0 for blk in pool.blocks)


def test_the_learners_parts_serve_a_windowed_model():
    """The seams take a windowed model's parts too (one KV cache group per window, a HybridKVCacheCoordinator):
    chapter 06's pool and managers, chapter 07's scheduler (it passes KVCacheBlocks.get_block_ids() along, one
    list per group) and chapter 12's window manager, all the worked solutions', give the engine's greedy tokens,
    preemptions and prefix hits on the tiny hybrid."""
    import random

    from nanocourse.hybrid import tiny_hybrid_llm
    from nanoengine.sampling_params import SamplingParams
    from solutions import ch06_prefix_caching as ch06
    from solutions import ch07_scheduler as ch07
    from solutions import ch12_hybrid as ch12

    rng = random.Random(5)
    shared = rng.choices(range(3, 256), k=40)
    prompts = [shared + rng.choices(range(3, 256), k=30 + 9 * i) for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)

    def run(**parts):
        llm = tiny_hybrid_llm(16, 8, seed=3, num_gpu_blocks_override=64, **parts)
        tokens = [o.token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params)]
        assert len(llm.engine.kv_cache_manager.coordinator.single_type_managers) == 4
        stats = llm.get_stats()
        return tokens, stats.num_preemptions, stats.prefix_cache_hits

    engine = run()
    assert engine[1] > 0 and engine[2] > 0, "the pool must force preemption and the shared prefix must hit"
    assert run(scheduler_cls=ch07.Scheduler) == engine, "chapter 07's scheduler alone"
    assert (
        run(
            block_pool=ch06.BlockPool,
            full_attention_manager_cls=ch06.FullAttentionManager,
            kv_cache_manager_cls=ch06.KVCacheManager,
            scheduler_cls=ch07.Scheduler,
            sliding_window_manager_cls=ch12.SlidingWindowManager,
        )
        == engine
    ), "every learner part at once"
