"""Chapter 06 exercises: the prefix cache's three layers, as vLLM 0.33 splits them.

- BlockPool (vllm/v1/core/block_pool.py): every block, the free queue and the hash map; find, touch, cache, free
  and evict.
- FullAttentionManager (vllm/v1/core/single_type_kv_cache_manager.py): the blocks of one full-attention KV cache
  group: each request's block list, its cache hit, what its next tokens cost, its release. Chapter 12's
  SlidingWindowManager is its sibling for sliding-window groups.
- KVCacheManager (vllm/v1/core/kv_cache_manager.py): the thin top the scheduler calls. It asks
  self.coordinator, which holds one single-type manager per KV cache group (self.coordinator.single_type_managers),
  and hands blocks around as KVCacheBlocks: one list per group, `.blocks[g]`.

Each subclasses the engine's class, so construction, the free queue, the hash map, the counters and the
coordinator are there; you write the operations the chapter is about. Read vLLM's files beside this one. Once
chapter 06 passes, my_llm() allocates every request from your three classes:
`LLM(block_pool=BlockPool, full_attention_manager_cls=FullAttentionManager, kv_cache_manager_cls=KVCacheManager)`.

Check your work with:   make grade CH=06
Stuck? In the notebook, `from nanocourse import hint; hint("06")` lists this chapter's hints, from a nudge to
close-to-code; open them one at a time with hint("06", n).

What you have:
- a block (KVCacheBlock): block_id, ref_cnt, block_hash (None or bytes; set it once, reset_hash() to
  clear it), is_null;
- in the pool: self.free_block_queue (your chapter 05 queue's interface): popleft_n, remove, append_n,
  prepend_n, get_all_free_blocks, num_free_blocks; self.cached_block_hash_to_block: get_one_block(key),
  insert(key, block), pop(key, block_id); make_block_hash_with_group_id, which turns a block hash and a group
  id into the key that group's block is cached under (group 0's key is the bare hash);
- in a FullAttentionManager: self.block_pool, self.block_size, self.req_to_blocks[request_id] (the request's
  blocks in this group, block i holding tokens i * block_size .. (i + 1) * block_size - 1, append-only),
  self.num_cached_block[request_id] (how many of them are named in the map; a request has an entry here
  exactly while it holds blocks: from its admission until free), and get_cached_blocks (a block hash and a
  list of group ids: one cached block per group, or None if any group misses);
- in the KVCacheManager: self.block_pool, self.block_size, self.enable_caching, self.empty_kv_cache_blocks (no
  block in any group), record_prefix_cache_stats (a request and its hit tokens: counts one lookup), and
  self.coordinator, whose methods each act on every group in turn:

  - find_longest_cache_hit(hashes, max_length): (one hit list per group, hit tokens), the longest hit of
    whole blocks, at most max_length tokens (a multiple of block_size), that every group can serve; changes
    nothing;
  - get_num_blocks_to_allocate(request_id, num_tokens, hits, num_computed): the free blocks, summed over the
    groups, the request would take to hold slots for num_tokens tokens with these hits, free hits (ref_cnt 0)
    included; changes nothing;
  - remove_skipped_blocks(request_id, num_computed): gives back the blocks a window no longer sees (none for
    full attention);
  - allocate_new_computed_blocks(request_id, hits, num_computed): an admitted request takes its hits (one more
    reference each; a free one leaves the queue); for a running request, nothing;
  - allocate_new_blocks(request_id, num_tokens): new blocks from the pool until the request holds slots for
    num_tokens tokens, returned as one list per group; it assumes they fit;
  - cache_blocks(request, num_tokens): names every full block of the first num_tokens tokens not yet named.
- a request: request_id, num_tokens, num_computed_tokens, block_hashes (one per full block),
  skip_reading_prefix_cache.

Your pool leaves out two extras of the engine's BlockPool: KV events and hash-collision checks.
Task 06.7 runs the engine's scheduler on your three classes and, beside it, on the engine's own, over random
workloads, and compares every step: the contracts below, and nothing else, decide what it sees.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from nanoengine.core import (
    BlockHash,
    KVCacheBlock,
    KVCacheBlocks,
    make_block_hash_with_group_id,  # noqa: F401  (a group's key in the pool's map)
)
from nanoengine.core import BlockPool as EngineBlockPool
from nanoengine.core import FullAttentionManager as EngineFullAttentionManager
from nanoengine.core import KVCacheManager as EngineKVCacheManager
from nanoengine.request import Request


class BlockPool(EngineBlockPool):
    """Find, touch, cache, free and evict, for every KV cache group of a model (they share one pool).

    Invariants after every method: a non-null block is in the free queue iff its ref_cnt is 0; a block has a
    hash iff the map holds it under that hash; the null block is never in the queue and its ref_cnt never
    changes. The free queue's order is the eviction order: head first.
    """

    def get_cached_block(
        self, block_hash: BlockHash, token_ids: Sequence[int] | None = None, kv_cache_group_id: int = 0
    ) -> KVCacheBlock | None:
        """Task 06.1: the block group kv_cache_group_id has cached under block_hash, or None.

        Contract: the same tokens have one hash in every group, but each group's block holds other layers'
        KV, so a group finds only blocks cached for that group, under that group's key for block_hash (group 0:
        the bare hash). A lookup only:
        no ref_cnt, queue or map changes, since the request may be left waiting. token_ids matter only to a
        pool that checks hash collisions (the engine's, with check_hash_collisions=True); yours leaves that out,
        and LLM never passes them to a custom pool.
        (vLLM 0.33: BlockPool.get_cached_block, which takes a list of group ids and returns one block per group.)
        Example: after block 3 was cached under h for group 0, get_cached_block(h) is block 3 and its ref_cnt is
        as before; get_cached_block(h, kv_cache_group_id=1) is None; so is get_cached_block(an unknown hash).
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

    def cache_full_blocks(
        self,
        request: Request,
        blocks: Sequence[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int = 0,
    ) -> None:
        """Task 06.5: name blocks[num_cached_blocks:num_full_blocks] of group kv_cache_group_id by the
        request's hashes.

        Contract: afterwards block i of that range has as its hash group kv_cache_group_id's key for
        request.block_hashes[i], and get_cached_block(request.block_hashes[i], kv_cache_group_id=that group)
        finds a block holding it, so a
        later request with the same prefix hits in that group, and in no other; the first num_cached_blocks are
        named already and stay as they are; nothing else changes (no ref_cnt, no queue).
        (vLLM 0.33: BlockPool.cache_full_blocks.)
        Example: a request holding blocks [5, 6, 2] with 2 full blocks and num_cached_blocks 1: block 6 gets
        block_hashes[1] (group 0); blocks 5 and 2 are untouched. The same call with kv_cache_group_id=1 names
        block 6 by group 1's key for block_hashes[1], which group 0's lookups do not find.
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


class FullAttentionManager(EngineFullAttentionManager):
    """One full-attention KV cache group's blocks (self.kv_cache_group_id). The coordinator holds one manager
    per group and calls each; what you do not write here (taking an admitted request's hits, allocating and
    naming its new blocks) is inherited from the engine's SingleTypeKVCacheManager."""

    def find_longest_cache_hit(
        self, block_hashes: list[BlockHash], max_length: int, group_ids: list[int]
    ) -> tuple[list[KVCacheBlock], ...]:
        """Task 06.1b: the longest cached prefix of at most max_length tokens that every group in group_ids
        can serve: one list of blocks per group id, in group_ids' order, all of one length.

        Contract:
        - block i is in the hit only if it is cached in every listed group and so are blocks 0 .. i - 1: every
          hash after a miss chains through the missing block, so no later block can serve this prefix;
        - the hit is the longest such run, and at most max_length tokens long (the caller passes a multiple
          of block_size);
        - list k holds group group_ids[k]'s own cached blocks (the pool's objects); nothing changes (no
          ref_cnt, queue or map).
        self.use_eagle: leave it be. LLM sets it only for EAGLE drafts (chapter 13), and then takes the engine's
        FullAttentionManager, which drops the last hit block, as chapter 12's SlidingWindowManager does.
        (vLLM 0.33: FullAttentionManager.find_longest_cache_hit, a classmethod there that also takes the pool
        and the spec and returns the hit length too.)
        Example: block size 4, blocks 0, 1 and 3 of a request cached in group 0, block 2 not:
        find_longest_cache_hit(hashes, 16, [0]) is ([c0, c1],). With block 0 cached in group 1 too but block 1
        not: find_longest_cache_hit(hashes, 16, [0, 1]) is ([c0], [d0]).
        find_longest_cache_hit(hashes, 4, [0]) is ([c0],).
        """
        raise NotImplementedError

    def get_num_blocks_to_allocate(
        self, request_id: str, num_tokens: int, new_computed_blocks: list[KVCacheBlock], num_computed_tokens: int
    ) -> int:
        """Task 06.3c: how many free blocks this group must hand the request so that it has slots for its first
        num_tokens tokens, new_computed_blocks (its cache hit in this group) included. A question only:
        nothing changes.

        Contract:
        - afterwards the request would hold slots for num_tokens tokens: enough whole blocks, no more; the
          blocks it holds already (self.req_to_blocks) and the hits count towards them; the rest are new blocks,
          never fewer than 0;
        - a hit on a free cached block (ref_cnt 0) leaves the free queue when the request takes it: it costs a
          free block just as a new block does; a hit that another request holds costs nothing;
        - a running request (one in self.num_cached_block) takes no new hits: only its new blocks count.
        num_computed_tokens matters only where a window skips tokens (chapter 12); full attention skips none.
        (vLLM 0.33: SingleTypeKVCacheManager.get_num_blocks_to_allocate.)
        Example: block size 4, a new 10-token request with 2 hits, one free (ref_cnt 0) and one held: 3 blocks
        needed, 2 of them hits, so 1 new + 1 free hit = 2. The same request running, holding 3 blocks, at
        num_tokens 13: 1.
        """
        raise NotImplementedError

    def free(self, request_id: str) -> None:
        """Task 06.2b: release every block the request holds in this group and forget the request.

        Contract: the pool gets the request's blocks back in one free_blocks call, last block first (so its
        chain's root, shared most, is evicted last); the request has no entry left in req_to_blocks or
        num_cached_block; freeing a request that holds nothing (never admitted, or freed already) changes
        nothing. (vLLM 0.33: SingleTypeKVCacheManager.free.)
        Example: a request holding [5, 6, 2] (all hashed, ref_cnt 1) on an empty queue: afterwards the queue
        is [2, 6, 5].
        """
        raise NotImplementedError


class KVCacheManager(EngineKVCacheManager):
    """The scheduler's view, thin over self.coordinator as in vLLM: every per-group rule is the single-type
    managers' (your FullAttentionManager for full attention); this class decides when to ask them."""

    def get_computed_blocks(self, request: Request, record_stats: bool = True) -> tuple[KVCacheBlocks, int]:
        """Task 06.1: the longest cached prefix of a waiting request: (its blocks, the tokens they cover).

        Contract:
        - the hit is whole blocks that every KV cache group can serve (one list per group, as KVCacheBlocks),
          by each group's own rule (the coordinator knows them), and the longest such hit that leaves the
          request's last token uncomputed: that token's logits give the next token, so it is always computed;
        - nothing changes: no ref_cnt, queue or map (the request may be left waiting);
        - no hit (empty_kv_cache_blocks and 0 tokens) with prefix caching off (self.enable_caching False), nor
          for a request that skips reading the cache (request.skip_reading_prefix_cache: it wants prompt
          logprobs, which need every position), and then nothing is counted;
        - otherwise the lookup is counted exactly once in the prefix-cache stats (record_prefix_cache_stats)
          when record_stats is true, and not at all when false (a scheduler that may hold the request back
          counts it at admission instead).
        (vLLM 0.33: KVCacheManager.get_computed_blocks, which returns a third value for hybrid models and leaves
        all counting to the scheduler.)
        Example: block size 4, blocks 0 and 2 of a 13-token request cached, block 1 not: blocks ([block 0],), 4
        tokens. All three cached and 12 tokens: ([block 0, block 1],), 8 tokens, since block 2 holds the last
        token.
        """
        raise NotImplementedError

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        full_sequence_must_fit: bool = False,
    ) -> KVCacheBlocks | None:
        """Task 06.3: make room for num_new_tokens more tokens in every group; return the newly allocated
        blocks (KVCacheBlocks, one list per group), or None.

        The request's tokens: | computed | new computed (the cache hit) | new | lookahead |.
        Contract:
        - afterwards the request holds exactly ceil((computed + new computed + new + lookahead) / block_size)
          entries in every group (never fewer than it held): when it is admitted its hit blocks first
          (new_computed_blocks.blocks[g] in group g), then new blocks from the pool; the return value holds
          the new blocks alone;
        - the hits are in use from now on: each holds exactly one more reference than before the call, and a
          free one has left the queue. allocate_slots takes these references (through the coordinator's
          allocate_new_computed_blocks, above), and only it: get_computed_blocks takes none, and a reference
          taken twice keeps a block out of the queue after the request frees it;
        - all or nothing: the slots are granted only if the free blocks they take in all groups together,
          free hits (ref_cnt 0) included, are at most the pool's free blocks (self.block_pool.get_num_free_blocks());
          otherwise return None, and no ref_cnt, queue, map or block table has changed;
        - with full_sequence_must_fit, a second gate: unless slots for the request's whole sequence
          (request.num_tokens tokens, hits counted the same way) fit in the free blocks now, return None and
          change nothing. This is the scheduler's admission gate: it admits a request only if its whole prompt
          fits, so that it is not preempted halfway through its prefill and readmitted over and over;
        - blocks that a sliding window has left behind (up to the computed and new computed tokens) are given
          back before the room for the new tokens is counted, so they can serve this step (nothing, for full
          attention alone); the whole-sequence gate is decided before anything is given back;
        - a new block never evicts a hit that this call is about to take;
        - with caching on, every block that is full once the computed, new computed and new tokens are in
          (lookahead slots not counted, never past request.num_tokens) is named in the cache map; with caching
          off none is.
        (vLLM 0.33: KVCacheManager.allocate_slots.)
        Example: block size 4, 5 free blocks, a new 10-token request with a 4-token hit on a free cached block:
        allocate_slots(r, 6, 4, hit) takes the hit out of the queue and returns KVCacheBlocks(([new, new],));
        the request holds [hit, new, new], and 2 blocks are named. With 2 free blocks it returns None: 2 new +
        1 free hit. Still with 2 free blocks, allocate_slots(r, 2, 4, hit) grants 1 new block (2 in all with the
        hit), but with full_sequence_must_fit=True it returns None: the whole 10 tokens need 2 new blocks plus
        the free hit, 3 free blocks.
        """
        raise NotImplementedError


def eviction_order(pool: EngineBlockPool, num_blocks: int) -> list[int]:
    """Task 06.4: the ids of the cached blocks pool.get_new_blocks(num_blocks) would evict, in eviction order,
    without changing the pool.

    Contract: exactly the blocks that get_new_blocks(num_blocks) (task 06.4b) would hand out and that still
    have a hash, in the order it would hand them out; a handed-out block without a hash evicts nothing; the pool
    is left as it was; a negative num_blocks, or fewer than num_blocks free blocks, raises ValueError (as
    get_new_blocks does).
    Example: queue [2, 8, 3, 1] with blocks 3 and 1 hashed: eviction_order(pool, 3) == [3].
    """
    raise NotImplementedError
