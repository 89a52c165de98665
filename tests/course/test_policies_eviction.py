"""FrequencyAwareBlockPool: the SLRU order, its two bounds, and BlockPool's invariants under random
operation sequences (against a list-based model of the three segments)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from nanocourse.policies import FrequencyAwareBlockPool
from nanoengine.core import BlockPool, KVCacheManager, get_request_block_hasher
from nanoengine.request import Request

BS = 4


def fake_request(request_id: str, hashes=()) -> SimpleNamespace:
    """What cache_full_blocks reads from a request, plus the blocks it holds and how many are cached."""
    return SimpleNamespace(
        request_id=request_id,
        blocks=[],
        block_hashes=list(hashes),
        num_cached=0,
        lora_name=None,
        all_token_ids=list(range(64)),
    )


def cached_blocks(pool, hashes):
    """One request's blocks, cached under `hashes`, then freed (last block first)."""
    request = fake_request("r", hashes)
    request.blocks = pool.get_new_blocks(len(hashes))
    pool.cache_full_blocks(request, request.blocks, 0, len(hashes), BS)
    pool.free_blocks(reversed(request.blocks))
    return request.blocks


def hit(pool, blocks):
    """A later request reuses the blocks, then finishes."""
    pool.touch(blocks)
    pool.free_blocks(reversed(blocks))


def free_ids(pool):
    return [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]


def test_reused_blocks_outlive_one_offs_that_lru_keeps():
    hashes = lambda tag, n: [bytes([tag, i]) for i in range(n)]
    for pool_cls, survives in ((BlockPool, False), (FrequencyAwareBlockPool, True)):
        pool = pool_cls(9, True)
        hot = cached_blocks(pool, hashes(1, 2))
        hit(pool, hot)
        cached_blocks(pool, hashes(2, 3))  # one-offs freed after the hot prompt: LRU keeps them longer
        pool.get_new_blocks(6)  # room for a big request: 3 fresh blocks, then 3 evictions
        kept = [pool.get_cached_block(h) is not None for h in hashes(1, 2)]
        assert kept == [survives] * 2, pool_cls.__name__


def test_segments_and_eviction_order():
    pool = FrequencyAwareBlockPool(9, True)
    hot = cached_blocks(pool, [b"h0", b"h1"])
    one_off = cached_blocks(pool, [b"o0", b"o1"])
    assert [pool.segment(b) for b in hot] == ["probation"] * 2
    hit(pool, hot)
    assert [pool.segment(b) for b in hot] == ["protected"] * 2
    # fresh, then probation (chain tail before root), then protected (chain tail before root)
    assert free_ids(pool) == [5, 6, 7, 8, one_off[1].block_id, one_off[0].block_id, hot[1].block_id, hot[0].block_id]
    assert pool.segment(pool.null_block) == "null"
    taken = pool.get_new_blocks(1)
    assert pool.segment(taken[0]) == "in use"


def test_protected_cap_demotes_the_oldest():
    pool = FrequencyAwareBlockPool(9, True, protected_fraction=0.25)  # 8 usable blocks: cap 2
    first = cached_blocks(pool, [b"a0", b"a1"])
    hit(pool, first)
    second = cached_blocks(pool, [b"b0", b"b1"])
    hit(pool, second)
    assert [pool.segment(b) for b in first + second] == ["probation"] * 2 + ["protected"] * 2
    assert pool.free_block_queue.protected.num_free_blocks == 2


def test_reuse_window_ages_protection():
    pool = FrequencyAwareBlockPool(9, True, reuse_window=3)
    hot = cached_blocks(pool, [b"h0", b"h1"])
    hit(pool, hot)
    for rnd in range(2):  # 4 blocks handed out since the hit: more than the window of 3
        cached_blocks(pool, [bytes([9, rnd])] * 1 + [bytes([8, rnd])])
    pool.get_new_blocks(0)  # aging runs at the next allocation
    assert [pool.segment(b) for b in hot] == ["probation"] * 2


def test_reset_sends_every_block_back_to_fresh():
    pool = FrequencyAwareBlockPool(9, True)
    hit(pool, cached_blocks(pool, [b"h0"]))
    assert pool.reset_prefix_cache()
    assert {pool.segment(b) for b in pool.blocks[1:]} == {"fresh"}
    assert pool.free_block_queue.reused == {}


def test_bad_fraction_is_refused():
    with pytest.raises(ValueError, match="protected_fraction"):
        FrequencyAwareBlockPool(9, True, protected_fraction=1.5)


def test_kv_cache_manager_runs_on_it():
    """Through KVCacheManager, a second request's hit marks the shared blocks reused."""
    hasher = get_request_block_hasher(BS)
    manager = KVCacheManager(BS, FrequencyAwareBlockPool(9, True))
    for rid in ("a", "b"):
        request = Request(rid, list(range(9)), block_hasher=hasher)
        blocks, hit_tokens = manager.get_computed_blocks(request)
        manager.allocate_slots(request, 9 - hit_tokens, hit_tokens, blocks)
        manager.free(request)
    assert hit_tokens == 8
    assert [manager.block_pool.segment(b) for b in blocks.blocks[0]] == ["protected"] * 2


NUM_BLOCKS, CAP_FRACTION, WINDOW = 9, 0.5, 6  # 8 usable blocks, protected cap 4
HASHES = [bytes([i]) for i in range(6)]


class FrequencyPoolMachine(RuleBasedStateMachine):
    """The pool against a list model: fresh / probation / protected, reuse marks and the clock."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = FrequencyAwareBlockPool(NUM_BLOCKS, True, protected_fraction=CAP_FRACTION, reuse_window=WINDOW)
        self.requests: list[SimpleNamespace] = []
        self.num_created = 0
        self.fresh, self.probation, self.protected = list(range(1, NUM_BLOCKS)), [], []
        self.reused: dict[int, int] = {}
        self.clock = 1  # the null block was handed out at start-up
        self.ref = dict.fromkeys(range(1, NUM_BLOCKS), 0)
        self.hash_of: dict[int, bytes | None] = dict.fromkeys(range(1, NUM_BLOCKS))
        self.cap = int(CAP_FRACTION * (NUM_BLOCKS - 1))

    def new_request(self, *held) -> SimpleNamespace:
        """A new request, optionally holding one cached block already (block, hash)."""
        self.num_created += 1
        request = fake_request(f"r{self.num_created}", [h for _, h in held])
        request.blocks, request.num_cached = [b for b, _ in held], len(held)
        self.requests.append(request)
        return request

    def model_demote(self, block_id: int) -> None:
        del self.reused[block_id]
        self.probation.append(block_id)

    @rule(n=st.integers(0, 4), extend=st.booleans(), pick=st.integers(0, 100))
    def allocate(self, n, extend, pick):
        request = self.requests[pick % len(self.requests)] if extend and self.requests else self.new_request()
        if n > len(self.fresh) + len(self.probation) + len(self.protected):
            with pytest.raises(ValueError, match="are free"):
                self.pool.get_new_blocks(n)
            return
        while self.protected and self.clock - self.reused[self.protected[0]] > WINDOW:
            self.model_demote(self.protected.pop(0))
        order = self.fresh + self.probation + self.protected
        expected = order[:n]
        blocks = self.pool.get_new_blocks(n)
        assert [b.block_id for b in blocks] == expected
        for block_id in expected:
            for segment in (self.fresh, self.probation, self.protected):
                if block_id in segment:
                    segment.remove(block_id)
            self.hash_of[block_id] = None
            self.reused.pop(block_id, None)
            self.ref[block_id] = 1
        self.clock += n
        request.blocks.extend(blocks)

    def uncached(self) -> list[SimpleNamespace]:
        return [r for r in self.requests if len(r.blocks) > r.num_cached]

    @precondition(uncached)
    @rule(data=st.data())
    def cache(self, data):
        request = data.draw(st.sampled_from(self.uncached()))
        start = request.num_cached
        end = data.draw(st.integers(start + 1, len(request.blocks)))
        request.block_hashes[start:] = data.draw(
            st.lists(st.sampled_from(HASHES), min_size=end - start, max_size=end - start)
        )
        self.pool.cache_full_blocks(request, request.blocks, start, end, BS)
        for block, block_hash in zip(request.blocks[start:end], request.block_hashes[start:end]):
            self.hash_of[block.block_id] = block_hash
        request.num_cached = end

    @rule(block_hash=st.sampled_from(HASHES))
    def hit_and_touch(self, block_hash):
        block = self.pool.get_cached_block(block_hash)
        if block is None:
            assert block_hash not in self.hash_of.values()
            return
        self.pool.touch([block])
        if self.ref[block.block_id] == 0:
            for segment in (self.probation, self.protected):
                if block.block_id in segment:
                    segment.remove(block.block_id)
        self.ref[block.block_id] += 1
        self.reused[block.block_id] = self.clock
        self.new_request((block, block_hash))

    @precondition(lambda self: self.requests)
    @rule(pick=st.integers(0, 100))
    def free_request(self, pick):
        last_first = self.requests.pop(pick % len(self.requests)).blocks[::-1]
        self.pool.free_blocks(last_first)
        unhashed = []
        for block in last_first:
            self.ref[block.block_id] -= 1
            if self.ref[block.block_id] == 0:
                if self.hash_of[block.block_id] is None:
                    unhashed.append(block.block_id)
                else:
                    (self.protected if block.block_id in self.reused else self.probation).append(block.block_id)
        self.fresh = unhashed + self.fresh
        while len(self.protected) > self.cap:
            self.model_demote(self.protected.pop(0))

    @rule()
    def reset(self):
        idle = all(count == 0 for count in self.ref.values())
        assert self.pool.reset_prefix_cache() is idle
        if idle:
            self.fresh = self.fresh + self.probation + self.protected
            self.probation, self.protected, self.reused = [], [], {}
            self.hash_of = dict.fromkeys(self.hash_of)

    @invariant()
    def matches_model(self):
        queue = self.pool.free_block_queue
        segments = [
            [b.block_id for b in q.get_all_free_blocks()] for q in (queue.fresh, queue.probation, queue.protected)
        ]
        assert segments == [self.fresh, self.probation, self.protected]
        assert queue.reused == self.reused
        assert {b.block_id: b.block_hash for b in self.pool.blocks[1:]} == self.hash_of

    @invariant()
    def block_pool_invariants(self):
        pool = self.pool
        in_queue = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
        assert len(in_queue) == len(set(in_queue)) == pool.get_num_free_blocks()
        for block in pool.blocks[1:]:
            assert block.ref_cnt >= 0
            assert (block.block_id in in_queue) == (block.ref_cnt == 0)
            if block.ref_cnt == 0:
                assert (pool.segment(block) == "fresh") == (block.block_hash is None)
        assert pool.null_block.block_id not in in_queue
        for block_hash, block in pool.cached_block_hash_to_block.items():
            assert block.block_hash == block_hash
        assert sum(1 for _ in pool.cached_block_hash_to_block.items()) == sum(
            h is not None for h in self.hash_of.values()
        )
        assert pool.free_block_queue.protected.num_free_blocks <= self.cap

    def teardown(self):
        while self.requests:
            self.free_request(0)
        assert self.pool.get_num_free_blocks() == NUM_BLOCKS - 1  # nothing leaked
        assert all(b.ref_cnt == 0 for b in self.pool.blocks)


FrequencyPoolMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestFrequencyPoolStateful = FrequencyPoolMachine.TestCase
