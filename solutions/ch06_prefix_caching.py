"""Chapter 06 solutions: the block pool and the KV cache manager of the prefix cache."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from nanoengine.core import BlockHash, KVCacheBlock
from nanoengine.core import BlockPool as EngineBlockPool
from nanoengine.core import KVCacheManager as EngineKVCacheManager
from nanoengine.request import Request


class BlockPool(EngineBlockPool):
    """Tasks 06.1, 06.2, 06.4b, 06.5: find, touch, cache, free and evict (no events, no collision checks)."""

    def get_cached_block(self, block_hash: BlockHash, token_ids: Sequence[int] | None = None) -> KVCacheBlock | None:
        # token_ids are ignored: this pool leaves hash-collision checks to the engine's BlockPool.
        return self.cached_block_hash_to_block.get_one_block(block_hash)

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        for block in blocks:
            if block.is_null:
                continue
            if block.ref_cnt == 0:  # free but cached: in use again, so no longer evictable
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def cache_full_blocks(self, request: Request, blocks: Sequence[KVCacheBlock], num_cached_blocks: int,
                          num_full_blocks: int, block_size: int) -> None:
        for i in range(num_cached_blocks, num_full_blocks):
            blocks[i].block_hash = request.block_hashes[i]
            self.cached_block_hash_to_block.insert(request.block_hashes[i], blocks[i])

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

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        blocks = self.free_block_queue.popleft_n(num_blocks)
        for block in blocks:
            if block.block_hash is not None:  # lazy eviction: the cached content goes only now
                self.cached_block_hash_to_block.pop(block.block_hash, block.block_id)
                block.reset_hash()
            block.ref_cnt += 1
        return blocks


class KVCacheManager(EngineKVCacheManager):
    """Tasks 06.1, 06.2b, 06.3: look up, allocate all or nothing, free last block first."""

    def get_computed_blocks(self, request: Request, record_stats: bool = True) -> tuple[list[KVCacheBlock], int]:
        # A request that wants prompt logprobs needs every prompt position's logits: a hit would skip them.
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return [], 0
        hits = []
        # The last token is computed again for its logits, so the hit stops one token short.
        for block_hash in request.block_hashes[: (request.num_tokens - 1) // self.block_size]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break  # every later hash chains through this one
            hits.append(block)
        num_hit_tokens = len(hits) * self.block_size
        if record_stats:
            self.record_prefix_cache_stats(request, num_hit_tokens)
        return hits, num_hit_tokens

    def allocate_slots(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: list[KVCacheBlock] | None = None, num_lookahead_tokens: int = 0,
                       full_sequence_must_fit: bool = False) -> list[KVCacheBlock] | None:
        hits = new_computed_blocks or []
        held = len(self.req_to_blocks.get(request.request_id, ()))

        def fits(num_tokens: int) -> tuple[bool, int]:
            num_new = max(-(-num_tokens // self.block_size) - held - len(hits), 0)
            # A hit on a free cached block takes it out of the free queue: it costs a free block too.
            return num_new + sum(block.ref_cnt == 0 for block in hits) <= self.block_pool.get_num_free_blocks(), num_new

        if full_sequence_must_fit and not fits(request.num_tokens)[0]:
            return None
        num_computed = request.num_computed_tokens + num_new_computed_tokens
        room, num_new = fits(num_computed + num_new_tokens + num_lookahead_tokens)
        if not room:
            return None
        held = self.req_to_blocks.setdefault(request.request_id, [])
        if request.request_id not in self.num_cached_block:
            self.block_pool.touch(hits)
            held.extend(hits)
            self.num_cached_block[request.request_id] = len(hits)
        new_blocks = self.block_pool.get_new_blocks(num_new)
        held.extend(new_blocks)
        if self.enable_caching:
            self.cache_blocks(request, min(num_computed + num_new_tokens, request.num_tokens))
        return new_blocks

    def free(self, request: Request) -> None:
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.num_cached_block.pop(request.request_id, None)
        self.block_pool.free_blocks(reversed(blocks))  # the root last: it is evicted last


def eviction_order(pool: EngineBlockPool, num_blocks: int) -> list[int]:
    """Task 06.4: the cached blocks get_new_blocks(num_blocks) would evict, in order."""
    free = pool.free_block_queue.get_all_free_blocks()
    if num_blocks > len(free):
        raise ValueError(f"only {len(free)} blocks are free, {num_blocks} asked")
    return [block.block_id for block in free[:num_blocks] if block.block_hash is not None]
