"""Chapter 06 solutions: find, keep and evict cached blocks on the engine's own pool."""

from __future__ import annotations

from collections.abc import Sequence

from nanoengine.core import BlockPool, KVCacheBlock, KVCacheManager
from nanoengine.request import Request


def longest_cache_hit(pool: BlockPool, block_hashes: Sequence[bytes], num_tokens: int,
                      block_size: int) -> list[KVCacheBlock]:
    """Task 06.1: the cached blocks a request of num_tokens tokens can reuse, untouched."""
    hits = []
    # The last token must be computed again for its logits, so it may not be covered by a hit.
    for block_hash in block_hashes[: (num_tokens - 1) // block_size]:
        block = pool.get_cached_block(block_hash)
        if block is None:
            break  # every later hash chains through this one: nothing after it can be cached
        hits.append(block)
    return hits


def free_request(pool: BlockPool, blocks: Sequence[KVCacheBlock]) -> None:
    """Task 06.2: release a finished request's blocks as vLLM 0.33 does."""
    unhashed, hashed = [], []
    for block in reversed(blocks):  # last block first: the root reaches the tail last
        if block.is_null:
            continue
        block.ref_cnt -= 1
        if block.ref_cnt == 0:
            (unhashed if block.block_hash is None else hashed).append(block)
    pool.free_block_queue.prepend_n(unhashed)  # nothing to lose: reuse these first
    pool.free_block_queue.append_n(hashed)


def admit(manager: KVCacheManager, request: Request) -> int | None:
    """Task 06.3: reuse the request's cached prefix and allocate the rest of its prompt, or nothing."""
    hits, num_hit_tokens = manager.get_computed_blocks(request)
    new_blocks = manager.allocate_slots(request, request.num_tokens - num_hit_tokens, num_hit_tokens, hits)
    if new_blocks is None:
        return None
    request.num_computed_tokens = request.num_tokens
    return num_hit_tokens


def eviction_order(pool: BlockPool, num_blocks: int) -> list[int]:
    """Task 06.4: the cached blocks get_new_blocks(num_blocks) would evict, in order."""
    free = pool.free_block_queue.get_all_free_blocks()
    if num_blocks > len(free):
        raise ValueError(f"only {len(free)} blocks are free, {num_blocks} asked")
    return [block.block_id for block in free[:num_blocks] if block.block_hash is not None]
