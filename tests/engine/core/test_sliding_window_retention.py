"""Sliding groups as vLLM 0.33 runs them by default: sparse retention (only the blocks a later hit can reach are
cached), the shared-prefix junction, the admission cap per sliding group, and equal specs searched as one.

Block size 4 and window 4 throughout: a sliding hit needs the one block before its end (ceil((W - 1) / 4) = 1).
"""

from __future__ import annotations

import pytest

from nanoengine.core import BlockPool, KVCacheManager, get_request_block_hasher
from nanoengine.core.kv_cache_coordinator import SpecGroup, replay_boundaries
from nanoengine.kv_cache_interface import KVCacheGroupSpec, get_kv_cache_groups
from nanoengine.request import Request

BS, W = 4, 4


def manager(retention: int | None = 0, num_blocks: int = 40, **kwargs) -> KVCacheManager:
    pool = BlockPool(num_blocks, enable_caching=True, hash_block_size=BS)
    groups = get_kv_cache_groups([W, None])  # group 0 full attention, group 1 sliding
    return KVCacheManager(BS, pool, kv_cache_groups=groups, prefix_cache_retention_interval=retention, **kwargs)


def request(name: str, length: int) -> Request:
    return Request(name, list(range(length)), block_hasher=get_request_block_hasher(BS))


def run(kv: KVCacheManager, req: Request) -> int:
    """Admit req with its hit, compute its whole prompt in one chunk, free it; the hit's length."""
    hits, num_hit = kv.get_computed_blocks(req)
    assert kv.allocate_slots(req, req.num_tokens - num_hit, num_hit, hits) is not None
    req.num_computed_tokens = req.num_tokens
    kv.free(req)
    return num_hit


def cached_positions(kv: KVCacheManager, req: Request, group: int) -> list[int]:
    blocks = kv.coordinator.single_type_managers[group].req_to_blocks[req.request_id]
    return [i for i, block in enumerate(blocks) if block.block_hash is not None]


@pytest.mark.parametrize(("retention", "sliding_cached"), [(0, [1]), (None, [0, 1, 2])])
def test_a_sliding_group_caches_only_the_blocks_a_resend_can_hit(retention, sliding_cached):
    """A 12-token prompt: a resend hits at most 11 tokens, so 8 in whole blocks, and its next query (token 8) needs
    block 1 only. Retention 0 caches that one; dense caches all three; full attention caches all three either way."""
    kv, a = manager(retention), request("a", 12)
    hits, num_hit = kv.get_computed_blocks(a)
    kv.allocate_slots(a, 12, num_hit, hits)
    assert cached_positions(kv, a, 0) == [0, 1, 2]
    assert cached_positions(kv, a, 1) == sliding_cached
    kv.free(a)
    assert run(kv, request("resend", 12)) == 8  # the resend hits all it can, either way


def test_a_shared_prefix_junction_is_cached_for_the_next_sibling():
    """b shares a's 12 tokens: full attention hits 12, the sliding group only 8 (a kept block 1 alone), so b's hit is
    8 and its junction 12; b then caches sliding block 2, and c hits all 12 shared tokens."""
    kv = manager()
    run(kv, request("a", 12))
    b = request("b", 20)
    assert run(kv, b) == 8 and b.shared_prefix_boundary == 12
    assert run(kv, request("c", 16)) == 12


def test_the_junction_is_reset_at_every_lookup():
    kv = manager()
    run(kv, request("a", 12))
    b = request("b", 20)
    kv.get_computed_blocks(b)
    assert b.shared_prefix_boundary == 12
    kv.reset_prefix_cache()
    kv.get_computed_blocks(b)
    assert b.shared_prefix_boundary == 0


def test_replay_boundaries_with_and_without_eagle():
    assert replay_boundaries(12, BS, use_eagle=False) == (11,)
    # EAGLE: a resend hits 8 (capped at 11) and a longer sibling 12, each one block lower.
    assert replay_boundaries(12, BS, use_eagle=True) == (4, 8)
    assert replay_boundaries(13, BS, use_eagle=True) == (8,)


def test_the_admission_cap_of_a_sliding_group():
    """W - 1 + max_in_flight_tokens tokens, in blocks, plus one for a window that starts inside a block."""
    spec = KVCacheGroupSpec((0,), W)
    assert spec.max_admission_blocks_per_request(BS, max_in_flight_tokens=4, max_model_len=1024) == 3
    assert spec.max_admission_blocks_per_request(BS, max_in_flight_tokens=4, max_model_len=5) == 3
    with pytest.raises(ValueError, match="full attention has no cap"):
        KVCacheGroupSpec((0,)).max_admission_blocks_per_request(BS, 4, 1024)


@pytest.mark.parametrize(("max_model_len", "admitted"), [(None, False), (1024, True)])
def test_full_sequence_admission_reserves_at_most_the_cap(max_model_len, admitted):
    """A 40-token prompt needs 10 full-attention blocks and 10 sliding ones at once; the window frees the sliding ones
    as 4-token chunks advance, so vLLM reserves only the cap (3 blocks): 13 of the pool's 15, where 20 do not fit."""
    kv = manager(num_blocks=16, max_model_len=max_model_len, max_in_flight_tokens=4)
    got = kv.allocate_slots(request("a", 40), 4, full_sequence_must_fit=True)
    assert (got is not None) == admitted


def test_bad_retention_intervals_are_refused():
    with pytest.raises(ValueError, match="prefix_cache_retention_interval must be"):
        manager(retention=6)
    with pytest.raises(ValueError, match="no effect without a sliding-window group"):
        KVCacheManager(BS, 10, prefix_cache_retention_interval=8)


def test_equal_specs_are_one_search():
    """Gemma 3's layout, five sliding layers to one full: five sliding groups of one window, searched as one."""
    kv = KVCacheManager(BS, 40, kv_cache_groups=get_kv_cache_groups([W] * 5 + [None]))
    assert kv.coordinator.attention_groups == [SpecGroup(None, [0], False), SpecGroup(W, [1, 2, 3, 4, 5], False)]


def test_sub_block_prefix_hits_are_refused():
    """vLLM 0.33 hashes finer than a block only for sub-block hits (Mamba "align" models); nanoengine refuses it."""
    with pytest.raises(ValueError, match='no sub-block prefix hits .*mamba_cache_mode="align"'):
        KVCacheManager(8, BlockPool(10, enable_caching=True, hash_block_size=4))
