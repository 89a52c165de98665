"""EAGLE's block drop goes to the KV cache groups that hold the drafter's layers (vLLM 0.33's is_eagle_group).

A full-attention EAGLE head on a full + sliding model joins the full-attention group, so only that group drops
the last hit block and searches one block further first; the sliding group searches at the agreed length and
drops nothing. With no group flagged, every group drops (vLLM's fallback).
"""

from __future__ import annotations

import dataclasses

from nanoengine.core import BlockPool, KVCacheManager, get_request_block_hasher
from nanoengine.kv_cache_interface import get_kv_cache_groups
from nanoengine.request import Request

BS, W = 4, 9
PROMPT = list(range(100, 141))  # 41 tokens: 10 full blocks, and a hit of at most 40 tokens


def test_the_heads_layers_flag_the_groups_they_join():
    # The head's full-attention layer is dealt with the target's (layer 3 joins layer 0), and left out of layer_ids.
    groups = get_kv_cache_groups([None, W, W], [None])
    assert [(g.layer_ids, g.sliding_window, g.is_eagle_group) for g in groups] == [
        ((0,), None, True),
        ((1, 2), W, False),
    ]
    # Without a head nothing is flagged; with one type the head's group is the only one.
    assert not any(g.is_eagle_group for g in get_kv_cache_groups([None, W, W]))
    assert [g.is_eagle_group for g in get_kv_cache_groups([None, None], [None])] == [True]


def make_request(request_id: str) -> Request:
    return Request(request_id, PROMPT, block_hasher=get_request_block_hasher(BS))


def hit_after_the_sliding_block_8_is_evicted(groups) -> int:
    """vLLM 0.33 hits 32 tokens with the head in the full group, 28 with every group dropping (the reader's case,
    its KVCacheManager loaded from the wheel)."""
    manager = KVCacheManager(BS, BlockPool(60, True), kv_cache_groups=groups, use_eagle=True,
                             prefix_cache_retention_interval=None)  # fmt: skip
    a = make_request("a")
    assert manager.allocate_slots(a, len(PROMPT)) is not None
    sliding = manager.coordinator.single_type_managers[1].req_to_blocks["a"]
    manager.free(a)
    manager.block_pool.evict_blocks({sliding[8].block_id})
    return manager.get_computed_blocks(make_request("b"))[1]


def test_only_the_drafters_group_drops_and_searches_further():
    groups = get_kv_cache_groups([None, W, W], [None])
    # Full attention searches 10 blocks and drops one: 9. The window needs 2 cached blocks ending the hit; block 8
    # is gone, so 6-7: 8 blocks, with no drop.
    assert hit_after_the_sliding_block_8_is_evicted(groups) == 32
    # No group flagged: every group drops. The window searches 9 + 1 blocks for 3 in a row, finds 5-7 and drops 7.
    unflagged = [dataclasses.replace(g, is_eagle_group=False) for g in groups]
    assert hit_after_the_sliding_block_8_is_evicted(unflagged) == 28


def test_the_flag_reaches_the_managers_and_the_search():
    def coordinator(groups, use_eagle=True):
        return KVCacheManager(BS, BlockPool(20, True), kv_cache_groups=groups, use_eagle=use_eagle).coordinator

    flagged = coordinator(get_kv_cache_groups([None, W, W], [None]))
    assert flagged.eagle_group_ids == {0}
    assert [m.use_eagle for m in flagged.single_type_managers] == [True, False]
    assert [g.use_eagle for g in flagged.attention_groups] == [True, False]
    unflagged = [dataclasses.replace(g, is_eagle_group=False) for g in get_kv_cache_groups([None, W, W], [None])]
    fallback = coordinator(unflagged)
    assert fallback.eagle_group_ids == {0, 1}
    assert [m.use_eagle for m in fallback.single_type_managers] == [True, True]
    off = coordinator(get_kv_cache_groups([None, W, W], [None]), use_eagle=False)
    assert off.eagle_group_ids == set() and not any(m.use_eagle for m in off.single_type_managers)
