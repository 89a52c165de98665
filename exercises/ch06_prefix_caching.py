"""Chapter 06 exercises: your BlockPool and KVCacheManager, the prefix cache's two layers.

Both subclass the engine's classes, so construction, the free queue, the hash map and the counters
are there; you write the operations the chapter is about. Once chapter 06 passes, my_llm() allocates
every request from them.

Check your work with:   make grade CH=06

What you have:
- a block (KVCacheBlock): block_id, ref_cnt, block_hash (None or bytes; set it once, reset_hash() to
  clear it), is_null;
- self.free_block_queue (your chapter 05 queue's interface): popleft_n, remove, append_n, prepend_n,
  get_all_free_blocks, num_free_blocks;
- self.cached_block_hash_to_block: get_one_block(hash), insert(hash, block), pop(hash, block_id);
- a request: request_id, num_tokens, num_computed_tokens, block_hashes (one per full block).

Your pool leaves out two extras of the engine's BlockPool: KV events and hash-collision checks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from nanoengine.core import BlockHash, KVCacheBlock
from nanoengine.core import BlockPool as EngineBlockPool
from nanoengine.core import KVCacheManager as EngineKVCacheManager
from nanoengine.request import Request


class BlockPool(EngineBlockPool):
    """Find, touch, cache, free and evict. Invariants to keep: a non-null block is in the free queue
    iff its ref_cnt is 0; a block has a hash iff the map holds it under that hash; the null block is
    never in the queue and its ref_cnt is never counted."""

    def get_cached_block(self, block_hash: BlockHash, token_ids: Sequence[int] | None = None) -> KVCacheBlock | None:
        """Task 06.1: the block cached under block_hash, or None. Find only: change nothing (no
        ref_cnt, no queue), since a lookup may end with the request left waiting.

        Hints: the map answers it (get_one_block). token_ids matter only to a pool that checks hash
        collisions: the engine's does when built with check_hash_collisions=True, yours leaves that
        out, and LLM never asks a custom pool for it.
        """
        raise NotImplementedError

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Task 06.5: take one reference on each block, as a request that reuses them does.

        A block at ref_cnt 0 sits in the free queue (cached, evictable): take it out first, so it
        cannot be evicted while in use. Skip the null block.

        Hints: self.free_block_queue.remove(block) is O(1).
        """
        raise NotImplementedError

    def cache_full_blocks(self, request: Request, blocks: Sequence[KVCacheBlock], num_cached_blocks: int,
                          num_full_blocks: int, block_size: int) -> None:
        """Task 06.5: name blocks[num_cached_blocks:num_full_blocks] by the request's hashes.

        Block i gets request.block_hashes[i] and goes into the map under it, so a later request with
        the same prefix finds it; keep "a block has a hash iff the map holds it under that hash".
        The first num_cached_blocks are named already: leave them alone.

        Hints: block.block_hash = h sets it (once); self.cached_block_hash_to_block.insert(h, block).
        """
        raise NotImplementedError

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Task 06.2: drop one reference on each block, given last block of the request first.

        A block whose ref_cnt reaches 0 becomes free:
        - without a hash it holds nothing anyone can find: to the HEAD of the free queue, reused first;
        - with a hash, to the TAIL, in the given order, so a chain's root (freed last) is evicted last.
        Skip the null block. If a block would go below 0 (a double free), raise ValueError and change
        nothing.

        Hints: list the blocks first (ordered_blocks may be an iterator); prepend_n and append_n
        insert a whole list in its order.
        """
        raise NotImplementedError

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Task 06.4b: hand out num_blocks blocks from the head of the free queue, ref_cnt 1 each.

        Lazy eviction happens here: a popped block that still has a hash loses it now, and only now;
        until this moment a freed cached block stayed findable.

        Hints: self.free_block_queue.popleft_n(num_blocks) (it raises when too few are free); evict
        with self.cached_block_hash_to_block.pop(block.block_hash, block.block_id), then
        block.reset_hash().
        """
        raise NotImplementedError


class KVCacheManager(EngineKVCacheManager):
    """The scheduler's view: per request, the list of blocks it holds (self.req_to_blocks[request_id],
    append-only) and how many of them are cached (self.num_cached_block[request_id])."""

    def get_computed_blocks(self, request: Request, record_stats: bool = True) -> tuple[list[KVCacheBlock], int]:
        """Task 06.1: the longest cached prefix of a waiting request: (blocks, tokens they cover).

        Walk request.block_hashes from the first, asking self.block_pool.get_cached_block, and stop at
        the first miss: every later hash chains through the missing one. Never cover the request's
        last token (its logits give the next token): at most (num_tokens - 1) // block_size blocks.
        Touch nothing. With prefix caching off (self.enable_caching False) there is no hit.

        Hints: hits are whole blocks, so the tokens they cover are len(blocks) * self.block_size. When
        record_stats is true, count the lookup: self.record_prefix_cache_stats(request, num_hit_tokens).
        """
        raise NotImplementedError

    def allocate_slots(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: list[KVCacheBlock] | None = None,
                       num_lookahead_tokens: int = 0) -> list[KVCacheBlock] | None:
        """Task 06.3: make room for num_new_tokens more tokens; return the new blocks, or None.

        The request's tokens: | computed | new computed (the cache hit) | new | lookahead |.
        1. Blocks needed in all: ceil((computed + new computed + new + lookahead) / block_size).
           New blocks: that minus the ones it holds minus the hit blocks (never below 0).
        2. All or nothing: a hit block at ref_cnt 0 leaves the free queue too, so it costs a free
           block like a new one. If new blocks + such hits exceed the free blocks, return None with
           NOTHING changed.
        3. On admission (the request holds no blocks yet: not in self.num_cached_block) touch the
           hits, start its list with them, and record them as cached.
        4. Take the new blocks from the pool and append them; then, with caching on, name the blocks
           that are full once these tokens are computed: self.cache_blocks(request, n), with n the
           computed + new computed + new tokens, capped at request.num_tokens.

        Hints: -(-a // b) rounds up; self.req_to_blocks.setdefault(request_id, []) starts a list;
        self.block_pool.touch and self.block_pool.get_new_blocks do the pool's part.
        """
        raise NotImplementedError

    def free(self, request: Request) -> None:
        """Task 06.2b: release every block the request holds, last block first, and forget it.

        Freeing twice must be harmless (the second call finds nothing). Hints: dict.pop(key, default).
        """
        raise NotImplementedError


def eviction_order(pool: EngineBlockPool, num_blocks: int) -> list[int]:
    """Task 06.4: the ids of the cached blocks pool.get_new_blocks(num_blocks) would evict, in order,
    without changing the pool.

    get_new_blocks pops num_blocks from the head of the free queue; a popped block that still has a
    hash is evicted right then; a popped block without a hash costs nothing. Raise ValueError when
    fewer than num_blocks blocks are free.

    Hints: pool.free_block_queue.get_all_free_blocks() lists the free blocks from head to tail.
    """
    raise NotImplementedError
