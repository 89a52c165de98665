"""Chapter 06 exercises: find, keep and evict cached blocks, on the engine's own BlockPool and
KVCacheManager.

Check your work with:   make grade CH=06
"""

from __future__ import annotations

from collections.abc import Sequence

from nanoengine.core import BlockPool, KVCacheBlock, KVCacheManager
from nanoengine.request import Request


def longest_cache_hit(pool: BlockPool, block_hashes: Sequence[bytes], num_tokens: int,
                      block_size: int) -> list[KVCacheBlock]:
    """Task 06.1: the cached blocks a request of num_tokens tokens can reuse, without touching them.

    block_hashes are the request's full-block hashes, first block first. Ask the pool for each in
    turn (pool.get_cached_block(block_hash) returns a block or None) and stop at the first miss.
    The hit must never cover the request's last token: it is computed again to get its logits.
    Return the pool's own KVCacheBlock objects. Change nothing: no ref_cnt moves, no block leaves
    the free queue (admitting the request does that later).

    Hints:
    - At most (num_tokens - 1) // block_size blocks can hit.
    - A miss ends the walk even if later hashes are cached: they chain through the missing one.
    """
    raise NotImplementedError


def free_request(pool: BlockPool, blocks: Sequence[KVCacheBlock]) -> None:
    """Task 06.2: release a finished request's blocks (its block table, first to last) as vLLM 0.33 does.

    Drop one reference from every block except the null block (block.is_null; its ref_cnt is not
    tracked). A block whose ref_cnt reaches 0 becomes free:
    - without a hash (block.block_hash is None) it holds nothing anyone can look up: put it at the
      HEAD of pool.free_block_queue, to be reused first;
    - with a hash it goes to the TAIL, the request's last block first and its first block (the
      root, which every later request with this prefix needs) last, so the root is evicted last.
    A block another request still holds (ref_cnt > 0 after the drop) stays out of the queue.

    Hints:
    - pool.free_block_queue.prepend_n(list) and .append_n(list) insert a list, keeping its order.
    - Walk reversed(blocks), sorting the blocks that reach 0 into two lists.
    """
    raise NotImplementedError


def admit(manager: KVCacheManager, request: Request) -> int | None:
    """Task 06.3: admit a waiting request: reuse its cached prefix and allocate the rest, all or nothing.

    1. manager.get_computed_blocks(request) returns (cached blocks, tokens they cover). It also
       counts the lookup in the prefix-cache stats, so call it once.
    2. manager.allocate_slots(request, num_new_tokens, num_new_computed_tokens, new_computed_blocks)
       for the WHOLE rest of the prompt: it takes references on the hits (touch), allocates new
       blocks and caches the full ones. It returns None, having changed nothing, when the pool
       cannot hold that much.
    On success set request.num_computed_tokens to request.num_tokens (the whole prompt is now
    scheduled) and return the number of tokens served from the cache. Otherwise return None and
    leave the request as it was.

    Hints:
    - num_new_tokens is what the cache does not cover: request.num_tokens minus the hit.
    - Do not touch the hits yourself; allocate_slots does it, after checking that everything fits.
    """
    raise NotImplementedError


def eviction_order(pool: BlockPool, num_blocks: int) -> list[int]:
    """Task 06.4: the ids of the cached blocks pool.get_new_blocks(num_blocks) would evict, in order,
    without changing the pool.

    get_new_blocks pops num_blocks from the head of the free queue. A popped block that still has
    a hash is evicted right then (lazy eviction: its hash is dropped and a BlockRemoved event
    queued); a popped block without a hash costs nothing. Raise ValueError when fewer than
    num_blocks blocks are free.

    Hints: pool.free_block_queue.get_all_free_blocks() lists the free blocks from head to tail.
    """
    raise NotImplementedError
