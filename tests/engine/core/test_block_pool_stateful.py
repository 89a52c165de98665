"""BlockPool against a plain-Python model, under random operation sequences.

The model keeps the free order as a list and the map as a dict of sets; after
every step the pool must agree with it exactly, and its own invariants must
hold. Small pools and few hashes make evictions and duplicate content common.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from nanoengine.core import AllBlocksCleared, BlockPool, BlockRemoved, BlockStored

NUM_BLOCKS = 9  # the null block + 8
BS = 2
HASHES = [bytes([i]) for i in range(6)]


@dataclass
class FakeRequest:
    request_id: str
    blocks: list = field(default_factory=list)
    block_hashes: list = field(default_factory=list)
    num_cached: int = 0
    lora_name: str | None = None

    @property
    def all_token_ids(self) -> list[int]:
        return list(range(len(self.block_hashes) * BS))


class BlockPoolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(NUM_BLOCKS, enable_caching=True, enable_kv_cache_events=True)
        self.requests: list[FakeRequest] = []
        self.num_created = 0
        # The model.
        self.free = list(range(1, NUM_BLOCKS))
        self.ref = dict.fromkeys(range(1, NUM_BLOCKS), 0)
        self.hash_of: dict[int, bytes | None] = dict.fromkeys(range(1, NUM_BLOCKS))
        self.map: dict[bytes, set[int]] = {}
        self.events: list = []

    def snapshot(self) -> tuple:
        pool = self.pool
        return (
            [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
            [(b.ref_cnt, b.block_hash) for b in pool.blocks],
            sorted((h, b.block_id) for h, b in pool.cached_block_hash_to_block.items()),
            list(pool.kv_event_queue),
        )

    def new_request(self) -> FakeRequest:
        self.num_created += 1
        request = FakeRequest(f"r{self.num_created}")
        self.requests.append(request)
        return request

    def model_evict(self, block_id: int) -> None:
        block_hash = self.hash_of[block_id]
        self.map[block_hash].discard(block_id)
        if not self.map[block_hash]:
            del self.map[block_hash]
        self.hash_of[block_id] = None
        self.events.append(BlockRemoved([block_hash]))

    def allocate(self, n: int, request: FakeRequest) -> None:
        if n > len(self.free):
            before = self.snapshot()
            with pytest.raises(ValueError, match="are free"):
                self.pool.get_new_blocks(n)
            assert self.snapshot() == before
            return
        blocks = self.pool.get_new_blocks(n)
        expected, self.free = self.free[:n], self.free[n:]
        assert [b.block_id for b in blocks] == expected
        for block_id in expected:
            if self.hash_of[block_id] is not None:
                self.model_evict(block_id)
            self.ref[block_id] = 1
        request.blocks.extend(blocks)

    @rule(n=st.integers(0, 4), extend=st.booleans(), pick=st.integers(0, 100))
    def allocate_blocks(self, n, extend, pick):
        reuse = extend and self.requests
        self.allocate(n, self.requests[pick % len(self.requests)] if reuse else self.new_request())

    @precondition(lambda self: any(self.hash_of[i] is not None for i in self.free))
    @rule()
    def allocate_until_eviction(self):
        first_cached = next(i for i, b in enumerate(self.free) if self.hash_of[b] is not None)
        self.allocate(first_cached + 1, self.new_request())

    @precondition(lambda self: self.requests)
    @rule(pick=st.integers(0, 100), data=st.data())
    def cache(self, pick, data):
        request = self.requests[pick % len(self.requests)]
        num_uncached = len(request.blocks) - request.num_cached
        if num_uncached == 0:
            return
        k = data.draw(st.integers(1, num_uncached))
        new_hashes = data.draw(st.lists(st.sampled_from(HASHES), min_size=k, max_size=k))
        start, end = request.num_cached, request.num_cached + k
        request.block_hashes[start:] = new_hashes
        self.pool.cache_full_blocks(request, request.blocks, start, end, BS)
        for block, block_hash in zip(request.blocks[start:end], new_hashes):
            self.hash_of[block.block_id] = block_hash
            self.map.setdefault(block_hash, set()).add(block.block_id)
        parent = request.block_hashes[start - 1] if start else None
        self.events.append(BlockStored(new_hashes, parent, list(range(start * BS, end * BS)), BS, None))
        request.num_cached = end

    @rule(block_hash=st.sampled_from(HASHES))
    def hit_and_touch(self, block_hash):
        block = self.pool.get_cached_block(block_hash)
        if block_hash not in self.map:
            assert block is None
            return
        assert block.block_id in self.map[block_hash]
        self.pool.touch([block])
        if self.ref[block.block_id] == 0:
            self.free.remove(block.block_id)
        self.ref[block.block_id] += 1
        request = self.new_request()
        request.blocks, request.block_hashes, request.num_cached = [block], [block_hash], 1

    @precondition(lambda self: self.requests)
    @rule(pick=st.integers(0, 100))
    def free_request(self, pick):
        request = self.requests.pop(pick % len(self.requests))
        ordered = request.blocks[::-1]
        self.pool.free_blocks(ordered)
        unhashed, hashed = [], []
        for block in ordered:
            self.ref[block.block_id] -= 1
            if self.ref[block.block_id] == 0:
                is_cached = self.hash_of[block.block_id] is not None
                (hashed if is_cached else unhashed).append(block.block_id)
        self.free = unhashed + self.free + hashed

    @precondition(lambda self: self.free)
    @rule(data=st.data())
    def double_free_is_refused(self, data):
        block = self.pool.blocks[data.draw(st.sampled_from(self.free))]
        before = self.snapshot()
        with pytest.raises(ValueError, match="Double free"):
            self.pool.free_blocks([block])
        assert self.snapshot() == before

    @rule()
    def reset(self):
        idle = all(count == 0 for count in self.ref.values())
        before = self.snapshot()
        assert self.pool.reset_prefix_cache() is idle
        if not idle:
            assert self.snapshot() == before
            return
        self.map.clear()
        self.hash_of = dict.fromkeys(self.hash_of)
        self.events.append(AllBlocksCleared())

    @invariant()
    def matches_model(self):
        pool = self.pool
        free_blocks = pool.free_block_queue.get_all_free_blocks()
        assert [b.block_id for b in free_blocks] == self.free
        assert pool.get_num_free_blocks() == len(self.free)
        assert {b.block_id: b.ref_cnt for b in pool.blocks[1:]} == self.ref
        assert {b.block_id: b.block_hash for b in pool.blocks[1:]} == self.hash_of
        entries: dict[bytes, set[int]] = {}
        for block_hash, block in pool.cached_block_hash_to_block.items():
            entries.setdefault(block_hash, set()).add(block.block_id)
        assert entries == self.map
        assert len(pool.cached_block_hash_to_block) == len(self.map)  # no empty leftovers
        assert pool.kv_event_queue == self.events

    @invariant()
    def pool_invariants(self):
        pool = self.pool
        free_blocks = pool.free_block_queue.get_all_free_blocks()
        in_queue = {b.block_id for b in free_blocks}
        for block in pool.blocks[1:]:
            assert block.ref_cnt >= 0
            assert (block.block_id in in_queue) == (block.ref_cnt == 0)
        assert pool.null_block.block_id not in in_queue and pool.null_block.ref_cnt == 0
        for block_hash, block in pool.cached_block_hash_to_block.items():
            assert block.block_hash == block_hash
        # The backward links mirror the forward ones.
        backwards, curr = [], pool.free_block_queue.fake_free_list_tail.prev_free_block
        while curr is not pool.free_block_queue.fake_free_list_head:
            backwards.append(curr)
            curr = curr.prev_free_block
        assert backwards == free_blocks[::-1]

    def teardown(self):
        while self.requests:
            self.free_request(0)
        self.matches_model()
        assert self.pool.get_num_free_blocks() == NUM_BLOCKS - 1  # nothing leaked
        assert all(b.ref_cnt == 0 for b in self.pool.blocks)


BlockPoolMachine.TestCase.settings = settings(
    settings.get_profile("stateful"), max_examples=300, stateful_step_count=40
)
TestBlockPoolStateful = BlockPoolMachine.TestCase
