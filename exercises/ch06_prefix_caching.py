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
coordinator are there; you write the operations where the chapter's design lies: the free order (06.8, 06.2,
06.2b), what an allocation costs and leaves (06.3, 06.3b, 06.3c), and the lookup (06.1). The pool's small
methods (find, touch, name, hand out) and the full-attention search are given, inherited from the engine: the
list below states each by its contract, and the notebook shows them at work. Once chapter 06 passes, my_llm()
allocates every request from your three classes:
`LLM(block_pool=BlockPool, full_attention_manager_cls=FullAttentionManager, kv_cache_manager_cls=KVCacheManager)`.

Work in this order: task 06.8 first (place_freed, at the top of this file: the open design, graded by its
outcome), then the classes; for each, the chapter and the contract, your own design, the grade; only then vLLM
0.33's function, named in each task, read beside yours. Where the two differ is the lesson (what vLLM adds, what
nanoengine leaves out); reading vLLM's first turns the task into copying.

Check your work with:   make grade CH=06
Stuck? In the notebook, `from nanocourse import hint; hint("06")` lists this chapter's hints, from a nudge to
close-to-code; open them one at a time with hint("06", n). Past each task's opening question, its hints (the
idea, vLLM's lines, code) open once you have graded it with your own code.

What you have (a reference: which of these a method uses, and when, is yours to decide):
- a block (KVCacheBlock): block_id, ref_cnt, block_hash (None or bytes; set it once, reset_hash() to
  clear it), is_null;
- in the pool: self.free_block_queue (your chapter 05 queue's interface): popleft_n, remove, append_n,
  prepend_n (a run at the head, in its order), get_all_free_blocks, num_free_blocks (popleft_n(n) raises
  ValueError, changing nothing, when n is negative or more than num_free_blocks); get_num_free_blocks(), the
  free blocks an allocation may take now (it returns free_block_queue.num_free_blocks: the two never differ,
  here as in vLLM 0.33);
  self.cached_block_hash_to_block: get_one_block(key), insert(key, block), pop(key, block_id);
  make_block_hash_with_group_id, which turns a block hash and a group id into the key that group's block is
  cached under (group 0's key is the bare hash). The pool's given methods, each keeping the invariants in
  BlockPool's docstring (vLLM 0.33's functions of the same names in vllm/v1/core/block_pool.py):

  - get_cached_block(block_hash, token_ids=None, kv_cache_group_id=0) -> the block that group cached under
    block_hash, or None (another group's block is never an answer: it holds other layers' KV; token_ids matter
    only to the engine's hash-collision checks). A question: nothing changes;
  - touch(blocks): each non-null block takes one reference more; a free one (a cache hit on a block nobody
    holds) leaves the free queue, so it cannot be evicted while in use; the other free blocks keep their order;
  - cache_full_blocks(request, blocks, num_cached_blocks, num_full_blocks, block_size, kv_cache_group_id=0):
    names blocks[num_cached_blocks:num_full_blocks] in the map by the request's block hashes, under that
    group's key; no ref_cnt or queue changes;
  - get_new_blocks(num_blocks) -> the num_blocks blocks at the free queue's head, out of it, each at ref_cnt 1
    with no hash: a cached one loses its hash and map entry here and only here (lazy eviction), so what the
    queue's head holds is what the next allocation evicts. A negative num_blocks, or more than
    get_num_free_blocks(), raises ValueError and changes nothing;
- in a FullAttentionManager: self.block_pool, self.block_size, self.req_to_blocks[request_id] (the request's
  blocks in this group, block i holding tokens i * block_size .. (i + 1) * block_size - 1, append-only; a
  plain dict, not a defaultdict as in vLLM 0.33: a request with no entry raises KeyError on indexing),
  self.num_cached_block[request_id] (how many of them are named in the map; a request has an entry here
  from its admission until free, even while it holds no block, and then one in req_to_blocks too),
  get_cached_blocks (a block hash and a
  list of group ids: one cached block per group, or None if any group misses), and the given
  find_longest_cache_hit(block_hashes, max_length, group_ids) -> one list of blocks per group id, all of one
  length: the longest prefix of whole blocks, at most max_length tokens, that every listed group has cached
  (a block after a miss serves no prefix: its hash chains through the missing one); nothing changes;
- in the KVCacheManager: self.block_pool, self.block_size, self.enable_caching, self.empty_kv_cache_blocks (no
  block in any group), self.record_prefix_cache_stats (a method: given a request and its hit tokens, counts one
  lookup), and self.coordinator, whose methods act on every group. Each is described by what holds after it,
  not by how it is used. Three are questions and change nothing:

  - find_longest_cache_hit(hashes, max_length) -> (one hit list per group, hit tokens): the longest prefix of
    whole blocks, at most max_length tokens long (any max_length: it may end short of it), that every group
    serves;
  - find_longest_cache_hit_and_uncached_prefix(hashes, max_length) -> (one hit list per group, hit tokens,
    uncached-prefix tokens): the same two, and how many tokens past the hit some attention type alone has cached
    (0 with one group), so that prefix ends at hit tokens + that count;
  - get_num_blocks_to_allocate(request_id, num_tokens, hits, num_computed, apply_admission_cap=False): the free
    blocks, over all groups, that the request would take from the pool to hold slots for num_tokens tokens with
    these hits (task 06.3c's count; with apply_admission_cap, a sliding group counts at most its admission cap).

  Four change the request's blocks:

  - allocate_new_blocks(request_id, num_tokens) -> the new blocks, one list per group: afterwards the request
    holds slots for num_tokens tokens in every group, its new blocks taken from the pool (ref_cnt 1, no hash).
    The pool must hold enough free blocks (get_new_blocks raises otherwise);
  - allocate_new_computed_blocks(request_id, hits, num_computed) (num_computed: the request's computed tokens,
    its hit included): afterwards the group knows the request (an entry in num_cached_block). A request it did
    not know holds exactly its hits, each with one reference more, held by the request as its other blocks
    are, and counted as named; a request it knew is as it was. A group knows a request from this call on, and
    only from it, hits or none (vLLM 0.33 also lets cache_blocks register a request; nanoengine does not);
  - cache_blocks(request, num_tokens): afterwards every block the first num_tokens tokens fill is named in the
    map; the group must know the request;
  - remove_skipped_blocks(request_id, num_computed): afterwards the request holds no block a sliding window can
    never read again, once its first num_computed tokens are computed: each such block has one reference fewer
    and its table slot holds the null block (none for full attention). For a request a group does not know yet
    (no blocks), it does nothing.
- a request: request_id, num_tokens, num_computed_tokens, block_hashes (one per full block),
  skip_reading_prefix_cache.

Your pool leaves out two extras of the engine's BlockPool: KV events and hash-collision checks.
Task 06.7 runs the engine's scheduler on your three classes and, beside it, on the engine's own, over random
workloads, and compares every step: the contracts below, and nothing else, decide what it sees.
"""

from __future__ import annotations

from collections.abc import Iterable

from nanoengine.core import BlockPool as EngineBlockPool
from nanoengine.core import (
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    KVCacheBlocks,
    make_block_hash_with_group_id,  # noqa: F401  (a group's key in the pool's map)
)
from nanoengine.core import FullAttentionManager as EngineFullAttentionManager
from nanoengine.core import KVCacheManager as EngineKVCacheManager
from nanoengine.request import Request


def place_freed(queue: FreeKVCacheBlockQueue, freed: list[KVCacheBlock]) -> None:
    """Task 06.8, the open design, and the first task: put the blocks a request just freed into the free
    queue, where they wait to be evicted. Graded by its outcome, not by equality with vLLM; 06.2 and 06.2b then
    ask for vLLM 0.33's order, and their messages name vLLM's rules where yours differs.

    freed: the blocks whose last reference was just dropped, in the order their request held them (its first
    block first), each at ref_cnt 0, some cached (a hash) and some not. Unlike free_blocks, which receives its
    caller's ranking (FullAttentionManager.free's order), place_freed always gets the request's own order: any
    reordering is yours. queue: the pool's free queue, which get_new_blocks empties from its head (your chapter
    05 queue: popleft_n, remove, append_n, prepend_n, get_all_free_blocks, num_free_blocks); it already holds the
    blocks freed before.
    Contract, after the call: the queue holds every block it held and every freed block, each once (a block left
    out is leaked; the blocks it held may move too, though none needs to); no block in use and not the null
    block; no hash has changed (eviction stays lazy).
    Goals: on the chapter's chat workload (chatbot_prompts(300), blocks of 16 tokens), with 31 usable blocks the
    ceiling hit rate, every system prompt's first use missing and nothing else (0.834; the design problem's
    naive order gets 0.686), and with 27 usable blocks, where memory is short enough that system prompts' chains
    are cut into, at least 0.80 (the naive order: 0.657). The grader plugs your function into the engine's pool
    (PlacedFreePool from nanocourse.lru_view) and also checks greedy tokens equal to the engine's and no leak.
    Not any order passes: the two goals fail orders that fix only part of what the naive order gets wrong.
    (vLLM 0.33's order and how it scores are in reveal("06") once the chapter passes.)
    Example: with the naive order, a 4-block pool whose request A filled all four blocks keeps, after a
    two-block request, two of A's blocks cached, and A's prompt still reuses 0 tokens.
    """
    raise NotImplementedError


class BlockPool(EngineBlockPool):
    """Find, touch, cache, free and evict, for every KV cache group of a model (they share one pool). You write
    free_blocks; find, touch, cache and evict are given (the module docstring states their contracts).

    Invariants after every method: a non-null block is in the free queue iff its ref_cnt is 0; a block has a
    hash iff the map holds it under that hash; the null block is never in the queue and its ref_cnt never
    changes. The free queue's order is the eviction order, head first, so it should rank the free blocks from
    the least likely to be hit again to the most likely.
    """

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Task 06.2: drop one reference on each block. The caller lists the blocks from the least likely to be
        hit again to the most likely (FullAttentionManager.free, task 06.2b, ranks a request's blocks).

        Contract, after the call:
        - each non-null block has as many references fewer as it is listed; the null block is as it was; a block
          still referenced is out of the queue;
        - a block whose references reached 0 is free, and the queue, head first, still ranks every free block from
          the least likely to be hit again to the most likely, the way vLLM 0.33 ranks them (chapters 07-10 and
          graduation compare with it). That ranking is the design of task 06.8, done first; 06.2 checks yours on
          fixed cases and, where it differs, its message names vLLM 0.33's rule and its reason on the smallest case;
        - the caller's ranking survives: of two blocks freed here that the queue's ranking cannot tell apart, the
          one listed first leaves the pool first; a block listed twice is placed by its last listing.
        After a refusal: a block that would drop below 0 (a double free) makes the call raise ValueError, and
        nothing has changed. ordered_blocks may be any iterable, an iterator included. (vLLM 0.33:
        BlockPool.free_blocks, which does not check for a double free.)
        Example: blocks 3 and 1 at ref_cnt 1, block 2 at ref_cnt 2: after free_blocks([block 3, block 2, block 1])
        blocks 3 and 1 are free and block 2 is at ref_cnt 1, out of the queue. free_blocks([block 2, block 3])
        then raises ValueError (block 3 is free already), and block 2 is still at ref_cnt 1. Where in the queue
        blocks 3 and 1 wait depends on their hashes: that is 06.8's question.
        """
        raise NotImplementedError


class FullAttentionManager(EngineFullAttentionManager):
    """One full-attention KV cache group's blocks (self.kv_cache_group_id). The coordinator holds one manager
    per group and calls each; what you do not write here (its cache-hit search, taking an admitted request's
    hits, allocating and naming its new blocks) is inherited from the engine's FullAttentionManager and
    SingleTypeKVCacheManager."""

    def get_num_blocks_to_allocate(
        self, request_id: str, num_tokens: int, new_computed_blocks: list[KVCacheBlock], num_computed_tokens: int
    ) -> int:
        """Task 06.3c: how many free blocks giving the request slots for its first num_tokens tokens, with
        new_computed_blocks (its cache hit in this group), would take from the pool right now. A question only:
        nothing changes.

        Contract, as properties of the state the question imagines (the request holding slots for its first
        num_tokens tokens in this group):
        - the request keeps every block it holds (self.req_to_blocks); a request this group does not know yet (not
          in self.num_cached_block) holds all of new_computed_blocks first, whatever num_tokens is, while a
          request it knows gains no hit; it gains no new block it would not need to reach num_tokens slots;
        - the count is exactly the blocks the free queue would lose to reach that state, no more and no fewer
          (the pool's invariants say which blocks are in it).
        num_computed_tokens matters only where a window skips tokens (chapter 12); full attention skips none.
        (vLLM 0.33: SingleTypeKVCacheManager.get_num_blocks_to_allocate.)
        Example: block size 4, blocks A0, A1, A2 cached, A0 held by a running X (3 blocks, 10 tokens), A1 and
        A2 free; R is new: ('R', 13, [A0], 4): 3; ('R', 4, [A0, A1], 8): 1; ('X', 12, [], 10): 0.
        """
        raise NotImplementedError

    def free(self, request_id: str) -> None:
        """Task 06.2b: release every block the request holds in this group and forget the request.

        Contract, after the call: each block the request held has one reference fewer, all given back in one
        release (one free_blocks call: the pool ranks what one call frees); the eviction order the pool builds
        from them matches how likely each block is to be hit again, which follows from how block hashes chain
        (chapter 04), as vLLM 0.33's order does (06.8's design, done first; 06.2b's message names vLLM 0.33's
        rule and its reason where yours differs); the request has no entry in req_to_blocks or
        num_cached_block. Freeing a request that holds nothing (never admitted, or freed already) changes
        nothing. After a refusal (the pool raises ValueError on a double free): nothing has changed, the
        request's entries included. (vLLM 0.33: SingleTypeKVCacheManager.free.)
        Example: a request holding [5, 6, 2] (all hashed, ref_cnt 1) on an empty queue: afterwards all three are
        free, the request has no entry left, and a second free of it changes nothing.
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
          request's last token uncomputed (the notebook asks why);
        - a miss, and every answer with prefix caching off (self.enable_caching False) or for a request that
          skips reading the cache (request.skip_reading_prefix_cache: it wants prompt logprobs, which need
          every position), is equal to empty_kv_cache_blocks (an empty list per group) and 0 tokens;
        - the prefix-cache stats count each lookup that could hit (caching on, reading allowed), hit or miss,
          once when record_stats is true (record_prefix_cache_stats counts one), and nothing else (a scheduler
          that may hold the request back counts it at admission instead);
        - afterwards nothing changes (no ref_cnt, queue or map: the request may be left waiting), except
          request.shared_prefix_boundary: where the longest prefix that some attention type has cached ends, when
          that is past the hit; else 0 (also when no lookup could hit). Chapter 12's sliding groups keep the
          blocks that end there; with full attention alone it is always 0.
        (vLLM 0.33: KVCacheManager.get_computed_blocks, which returns that position as a third value for the
        scheduler to store on the request, and leaves all counting to the scheduler.)
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
        blocks (KVCacheBlocks, one list per group), or None when the pool cannot give them.

        The request's tokens: | computed | new computed (the cache hit) | new | lookahead |.
        After a grant (a KVCacheBlocks returned):
        - slots: in every group the request has a slot for each of those tokens, lookahead included, and holds no
          block they leave empty (nor fewer entries than it held); a request admitted by this call holds its hits
          first (new_computed_blocks.blocks[g] in group g, in order), then its new blocks; the return value holds
          the new blocks alone;
        - hits: each is held by the request with exactly one reference more than before the call, is out of the
          free queue, and is still the cached block it was, findable under its hash;
        - names: with caching on, every block filled by tokens the request has (request.num_tokens of them) among
          its computed, new computed and new tokens is named in the map; with caching off, none is.
        A grant happens exactly when:
        - all or nothing: the free blocks the grant consumes, over all groups (task 06.3c's count), are at most
          the pool's free blocks; blocks a sliding window has left behind (the request can never read them again
          once its computed and new computed tokens are in) count as free for this grant (none with full
          attention alone);
        - and, with full_sequence_must_fit, the request's whole sequence (request.num_tokens tokens; lookahead
          slots are not part of it; hits counted the same way) would also fit in the pool's free blocks when the
          call began, a window's leftovers not counted, a sliding group needing at most its admission cap
          (chapter 12: the window frees blocks as the prompt's chunks advance). This is the scheduler's
          admission gate: it admits a request only if its whole prompt fits, so that it is not preempted halfway
          through its prefill over and over.
        After a refusal (None): no new reference, no block out of the queue, nothing named, no block table grown.
        A refusal by the whole-sequence rule leaves the request and the pool exactly as the call found them; after
        any other refusal, blocks a sliding window had left behind may be back in the queue (never read again).
        The table in the notebook's box describes the engine's allocate_slots, whose argument checks
        (_check_allocation) are not part of this task. (vLLM 0.33: KVCacheManager.allocate_slots.)
        Example: block size 4, a new 10-token request r with a 4-token hit on a free cached block:
        - 5 free blocks (the hit among them): allocate_slots(r, 6, 4, hit) returns KVCacheBlocks(([new, new],));
          r holds [hit, new, new], the hit at ref_cnt 1, 2 blocks named, 2 blocks left free;
        - 2 free blocks: the same call returns None (it would consume 3), and r and the pool are unchanged;
        - 2 free blocks: allocate_slots(r, 2, 4, hit) grants 1 new block (2 consumed); with
          full_sequence_must_fit=True it returns None, since the 10-token sequence would consume 3;
        - the hit held by a running request instead, 2 free blocks: allocate_slots(r, 6, 4, hit) grants 2 new
          blocks, and the hit's ref_cnt goes from 1 to 2.
        """
        raise NotImplementedError
