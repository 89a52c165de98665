"""Chapter 06 exercises: your BlockPool and KVCacheManager, the prefix cache's two layers.

Both subclass the engine's classes, so construction, the free queue, the hash map and the counters are there;
you write the operations the chapter is about. Once chapter 06 passes, my_llm() allocates every request from
them. They mirror vLLM 0.33's BlockPool (vllm/v1/core/block_pool.py) and, for one full-attention group,
KVCacheManager (vllm/v1/core/kv_cache_manager.py) with FullAttentionManager
(vllm/v1/core/single_type_kv_cache_manager.py) folded in: read them beside this.

Check your work with:   make grade CH=06
Stuck? In the notebook, `from nanocourse import hint; hint("06")` lists this chapter's hints, from a nudge to
close-to-code; open them one at a time with hint("06", n).

What you have:
- a block (KVCacheBlock): block_id, ref_cnt, block_hash (None or bytes; set it once, reset_hash() to
  clear it), is_null;
- self.free_block_queue (your chapter 05 queue's interface): popleft_n, remove, append_n, prepend_n,
  get_all_free_blocks, num_free_blocks;
- self.cached_block_hash_to_block: get_one_block(hash), insert(hash, block), pop(hash, block_id);
- a request: request_id, num_tokens, num_computed_tokens, block_hashes (one per full block),
  skip_reading_prefix_cache.

Your pool leaves out two extras of the engine's BlockPool: KV events and hash-collision checks.
Task 06.7 runs the engine's scheduler on your two classes and, beside it, on the engine's own, over random
workloads, and compares every step: the contracts below, and nothing else, decide what it sees.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from nanoengine.core import BlockHash, KVCacheBlock
from nanoengine.core import BlockPool as EngineBlockPool
from nanoengine.core import KVCacheManager as EngineKVCacheManager
from nanoengine.request import Request


class BlockPool(EngineBlockPool):
    """Find, touch, cache, free and evict.

    Invariants after every method: a non-null block is in the free queue iff its ref_cnt is 0; a block has a
    hash iff the map holds it under that hash; the null block is never in the queue and its ref_cnt never
    changes. The free queue's order is the eviction order: head first.
    """

    def get_cached_block(self, block_hash: BlockHash, token_ids: Sequence[int] | None = None) -> KVCacheBlock | None:
        """Task 06.1: the block cached under block_hash, or None.

        Contract: a lookup only: no ref_cnt, queue or map changes, since the request may be left waiting.
        token_ids matter only to a pool that checks hash collisions (the engine's, with
        check_hash_collisions=True); yours leaves that out, and LLM never passes them to a custom pool.
        (vLLM 0.33: BlockPool.get_cached_block.)
        Example: after block 3 was cached under h, get_cached_block(h) is block 3 and its ref_cnt is as before;
        get_cached_block(an unknown hash) is None.
        """
        raise NotImplementedError

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Task 06.5: take one reference on each block, as a request that reuses them (a cache hit) does.

        Contract: each non-null block's ref_cnt grows by 1; a block that was free (ref_cnt 0, cached, in the
        queue) leaves the queue, so it cannot be evicted while in use, and the others keep their order; the
        null block is left alone. (vLLM 0.33: BlockPool.touch.)
        Example: free queue [4, 7, 9] with block 7 cached and free: touch([block 7]) leaves [4, 9] and block 7
        at ref_cnt 1; touching it again makes ref_cnt 2 and the queue stays [4, 9].
        """
        raise NotImplementedError

    def cache_full_blocks(self, request: Request, blocks: Sequence[KVCacheBlock], num_cached_blocks: int,
                          num_full_blocks: int, block_size: int) -> None:
        """Task 06.5: name blocks[num_cached_blocks:num_full_blocks] by the request's hashes.

        Contract: afterwards block i of that range has hash request.block_hashes[i] and get_cached_block of
        that hash finds a block holding it, so a later request with the same prefix hits; the first
        num_cached_blocks are named already and stay as they are; nothing else changes (no ref_cnt, no queue).
        (vLLM 0.33: BlockPool.cache_full_blocks.)
        Example: a request holding blocks [5, 6, 2] with 2 full blocks and num_cached_blocks 1: block 6 gets
        block_hashes[1]; blocks 5 and 2 are untouched.
        """
        raise NotImplementedError

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Task 06.2: drop one reference on each block; the caller gives a request's blocks last block first.

        Contract:
        - every non-null block's ref_cnt drops by 1 (a block listed twice, by 2); the null block is skipped;
        - a block that reaches 0 becomes free: without a hash it holds nothing anyone can find, so it is
          reused first (it joins the queue at the HEAD); with a hash it may still serve a later prefix, so it
          joins at the TAIL; blocks that join the same end keep their given order, so a chain freed tail
          first has its root evicted last; a block listed twice joins once, at the listing that drops its last
          reference; a block still referenced stays out of the queue;
        - a block that would drop below 0 (a double free) raises ValueError and nothing changes at all.
        ordered_blocks may be any iterable, an iterator included. (vLLM 0.33: BlockPool.free_blocks, which
        prepends unhashed blocks and appends hashed ones the same way, and does not check for a double free.)
        Example: queue [8]; free_blocks([block 3 (hashed), block 1 (hashed), block 2 (no hash)]), each at
        ref_cnt 1, leaves the queue [2, 8, 3, 1].
        """
        raise NotImplementedError

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Task 06.4b: hand out the num_blocks blocks at the head of the free queue, each at ref_cnt 1.

        Contract: the blocks come out in queue order, head first; each has ref_cnt 1 and no hash. Eviction is
        lazy and happens here: a handed-out block that still had a hash leaves the map now, and only now (until
        this moment a freed cached block stayed findable). Too few free blocks raises ValueError and changes
        nothing. (vLLM 0.33: BlockPool.get_new_blocks with _maybe_evict_cached_block.)
        Example: queue [2, 8, 3] with block 3 cached under h: get_new_blocks(2) returns [block 2, block 8] and
        h still finds block 3; get_new_blocks(1) then returns block 3, and h finds nothing.
        """
        raise NotImplementedError


class KVCacheManager(EngineKVCacheManager):
    """The scheduler's view: per request, the list of blocks it holds (self.req_to_blocks[request_id],
    append-only: block i holds tokens i * block_size .. (i + 1) * block_size - 1) and how many of its leading
    blocks are named in the cache map (self.num_cached_block[request_id]). A request has an entry in both
    exactly while it holds blocks: from its admission until free()."""

    def get_computed_blocks(self, request: Request, record_stats: bool = True) -> tuple[list[KVCacheBlock], int]:
        """Task 06.1: the longest cached prefix of a waiting request: (its blocks, the tokens they cover).

        Contract:
        - the hit is the longest run of the request's leading full blocks that the pool has cached, block 0
          first: block i counts only if blocks 0 .. i - 1 do (a hash chains through all before it);
        - it never covers the request's last token, whose logits give the next token: at most
          (num_tokens - 1) // block_size blocks; the tokens covered are the hit blocks' tokens, whole blocks;
        - nothing changes: no ref_cnt, queue or map (the request may be left waiting);
        - no hit with prefix caching off (self.enable_caching False), nor for a request that skips reading the
          cache (request.skip_reading_prefix_cache: it wants prompt logprobs, which need every position);
        - the lookup is counted once in the prefix-cache stats when record_stats is true, never when false
          (self.record_prefix_cache_stats(request, num_hit_tokens) counts one; a scheduler that may hold the
          request back counts it at admission instead).
        (vLLM 0.33: KVCacheManager.get_computed_blocks, FullAttentionManager.find_longest_cache_hit.)
        Example: block size 4, blocks 0 and 2 of a 13-token request cached, block 1 not: ([block 0], 4).
        All three cached and 12 tokens: ([block 0, block 1], 8), since block 2 holds the last token.
        """
        raise NotImplementedError

    def allocate_slots(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: list[KVCacheBlock] | None = None, num_lookahead_tokens: int = 0,
                       full_sequence_must_fit: bool = False) -> list[KVCacheBlock] | None:
        """Task 06.3: make room for num_new_tokens more tokens; return the newly allocated blocks, or None.

        The request's tokens: | computed | new computed (the cache hit) | new | lookahead |.
        Contract:
        - afterwards the request holds exactly ceil((computed + new computed + new + lookahead) / block_size)
          blocks (never fewer than it held): its list, the hit blocks (new_computed_blocks) first when it is
          admitted, then new blocks from the pool; the return value is the new blocks alone, in list order;
        - the hits are in use from now on: each holds one more reference, and a free one has left the queue;
        - all or nothing: a hit at ref_cnt 0 costs a free block just as a new block does; when the free blocks
          cannot cover both, return None and change nothing at all;
        - with full_sequence_must_fit, the same holds for the request's whole sequence first: unless the blocks
          for all request.num_tokens tokens (hits counted as above) fit in the free blocks now, return None and
          change nothing. This is the scheduler's admission gate: it admits a request only if its whole prompt
          fits, so that it is not preempted halfway through its prefill and readmitted over and over;
        - with caching on, every block that is full once the computed, new computed and new tokens are in
          (never counting past request.num_tokens) is named in the cache map, and num_cached_block says how
          many; with caching off nothing is named;
        - cache hits come only with the admission (the request holds no blocks yet).
        (vLLM 0.33: KVCacheManager.allocate_slots.)
        Example: block size 4, 5 free blocks, a new 10-token request with a 4-token hit on a free cached block:
        allocate_slots(r, 6, 4, [hit]) takes the hit out of the queue and returns 2 new blocks; the request
        holds [hit, new, new], and 2 blocks are named. With 2 free blocks it returns None: 2 new + 1 free hit.
        With 3 free blocks, allocate_slots(r, 2, 4, [hit]) grants 1 new block (2 in all with the hit), but with
        full_sequence_must_fit=True it returns None: the whole 10 tokens need 3 blocks plus the free hit.
        """
        raise NotImplementedError

    def free(self, request: Request) -> None:
        """Task 06.2b: release every block the request holds and forget the request.

        Contract: the pool gets the request's blocks back last block first (so its chain's root, shared most,
        is evicted last), the request has no entry left in req_to_blocks or num_cached_block, and freeing a
        request that holds nothing (never admitted, or freed already) changes nothing.
        (vLLM 0.33: KVCacheManager.free and SingleTypeKVCacheManager.free.)
        Example: a request holding [5, 6, 2] (all hashed, ref_cnt 1) on an empty queue: afterwards the queue
        is [2, 6, 5].
        """
        raise NotImplementedError


def eviction_order(pool: EngineBlockPool, num_blocks: int) -> list[int]:
    """Task 06.4: the ids of the cached blocks pool.get_new_blocks(num_blocks) would evict, in eviction order,
    without changing the pool.

    Contract: exactly the blocks that get_new_blocks(num_blocks) (task 06.4b) would hand out that still have
    a hash, in the order it would hand them out; a handed-out block without a hash evicts nothing; the pool
    is left as it was; fewer than num_blocks free blocks raises ValueError.
    Example: queue [2, 8, 3, 1] with blocks 3 and 1 hashed: eviction_order(pool, 3) == [3].
    """
    raise NotImplementedError
