"""Chapter 06 solutions: the block pool, the full-attention manager and the KV cache manager of the prefix cache."""

from __future__ import annotations

from collections.abc import Iterable

from nanoengine.core import BlockPool as EngineBlockPool
from nanoengine.core import (
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    KVCacheBlocks,
)
from nanoengine.core import FullAttentionManager as EngineFullAttentionManager
from nanoengine.core import KVCacheManager as EngineKVCacheManager
from nanoengine.request import Request


class BlockPool(EngineBlockPool):
    """Task 06.2: free; find, touch, cache and evict are the engine's (given to the learner)."""

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        blocks = [block for block in ordered_blocks if not block.is_null]
        for block in blocks:
            block.ref_cnt -= 1
        if any(block.ref_cnt < 0 for block in blocks):
            for block in blocks:  # undo, so a double free changes nothing
                block.ref_cnt += 1
            raise ValueError("double free: a block has no reference left to drop")
        # A block listed twice loses two references and is queued once, at the listing that takes its last.
        last = {id(block): i for i, block in enumerate(blocks)}
        freed = [block for i, block in enumerate(blocks) if block.ref_cnt == 0 and last[id(block)] == i]
        # Nothing can hit an unhashed block: reuse it first. A hashed one may still serve a later prefix.
        self.free_block_queue.prepend_n([block for block in freed if block.block_hash is None])
        self.free_block_queue.append_n([block for block in freed if block.block_hash is not None])


class FullAttentionManager(EngineFullAttentionManager):
    """Tasks 06.2b, 06.3c: one full-attention KV cache group's blocks: its cost, its release (its search is given)."""

    def get_num_blocks_to_allocate(
        self, request_id: str, num_tokens: int, new_computed_blocks: list[KVCacheBlock], num_computed_tokens: int
    ) -> int:
        num_required = -(-num_tokens // self.block_size)
        num_held = len(self.req_to_blocks.get(request_id, ()))
        if request_id in self.num_cached_block:  # running: it takes no new hits
            return max(num_required - num_held, 0)
        num_new = max(num_required - num_held - len(new_computed_blocks), 0)
        # A hit on a free cached block leaves the free queue when touched: it costs a free block too.
        return num_new + sum(block.ref_cnt == 0 for block in new_computed_blocks)

    def free(self, request_id: str) -> None:
        # the root last: it is evicted last; the record goes only once the pool has taken the blocks back
        self.block_pool.free_blocks(reversed(self.req_to_blocks.get(request_id, [])))
        self.req_to_blocks.pop(request_id, None)
        self.num_cached_block.pop(request_id, None)


class KVCacheManager(EngineKVCacheManager):
    """Tasks 06.1, 06.3, 06.3b: the thin top over the coordinator: look up, then allocate all or nothing."""

    def get_computed_blocks(self, request: Request, record_stats: bool = True) -> tuple[KVCacheBlocks, int]:
        request.shared_prefix_boundary = 0
        # A request that wants prompt logprobs needs every prompt position's logits: a hit would skip them.
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return self.empty_kv_cache_blocks, 0
        # The last token is computed again for its logits, so the hit stops one token short.
        max_length = request.num_tokens - 1
        hits, num_hit_tokens, num_uncached = self.coordinator.find_longest_cache_hit_and_uncached_prefix(
            request.block_hashes, max_length
        )
        # Where a longer prefix some attention type cached ends: sliding groups will keep the blocks ending there.
        request.shared_prefix_boundary = num_hit_tokens + num_uncached if num_uncached else 0
        if record_stats:
            self.record_prefix_cache_stats(request, num_hit_tokens)
        return KVCacheBlocks(hits), num_hit_tokens

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        full_sequence_must_fit: bool = False,
    ) -> KVCacheBlocks | None:
        request_id = request.request_id
        hits = (new_computed_blocks or self.empty_kv_cache_blocks).blocks
        num_computed = request.num_computed_tokens + num_new_computed_tokens

        def fits(num_tokens: int, admission: bool = False) -> bool:
            needed = self.coordinator.get_num_blocks_to_allocate(
                request_id, num_tokens, hits, num_computed, apply_admission_cap=admission
            )
            return needed <= self.block_pool.get_num_free_blocks()

        if full_sequence_must_fit and not fits(request.num_tokens, admission=True):
            return None
        self.coordinator.remove_skipped_blocks(request_id, num_computed)
        num_tokens_need_slot = num_computed + num_new_tokens + num_lookahead_tokens
        if not fits(num_tokens_need_slot):
            return None
        self.coordinator.allocate_new_computed_blocks(request_id, hits, num_computed)
        new_blocks = self.coordinator.allocate_new_blocks(request_id, num_tokens_need_slot)
        if self.enable_caching:
            self.coordinator.cache_blocks(request, min(num_computed + num_new_tokens, request.num_tokens))
        return KVCacheBlocks(new_blocks)


def place_freed(queue: FreeKVCacheBlockQueue, freed: list[KVCacheBlock]) -> None:
    """Task 06.8: vLLM 0.33's order, one design that reaches the goal."""
    queue.prepend_n([block for block in freed if block.block_hash is None])  # nobody can hit these: first out
    queue.append_n([block for block in reversed(freed) if block.block_hash is not None])  # a chain's root last
