"""Chapter 09 exercises: beyond vLLM's defaults.

A radix tree that matches prompts to the token, a frequency-aware eviction order, and the two halves
of a cache-aware router: the routing rule, and the index it rebuilds from KV events.

Check your work with:   make grade CH=09
Stuck? In the notebook, `from nanocourse import hint; hint("09")` lists this chapter's hints, from a nudge to
close-to-code; open them one at a time with hint("09", n).
"""

from __future__ import annotations

from collections import deque  # noqa: F401  (a double-ended queue, there if task 09.3 wants one)
from collections.abc import Iterable, Sequence

from nanoengine.core import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent  # noqa: F401  (09.5's events)


def longest_common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Task 09.1: how many leading tokens a and b share.

    Contract: the number of positions i, counted from 0, before the first where a[i] != b[i]; when one sequence
    is a prefix of the other (in either order), the shorter one's length. So the result is between 0 and
    min(len(a), len(b)), an empty sequence shares nothing, and a list and a tuple compare by their tokens
    (RadixTree compares its edges with a prompt's tokens). (vLLM 0.33: common_prefix_len, the same count over
    several prompts, in vllm/entrypoints/openai/decisions/strategies.py.)
    Example: longest_common_prefix([4, 8, 15, 16], (4, 8, 23)) == 2; longest_common_prefix([4, 8, 15], [4, 8]) == 2;
    longest_common_prefix([], [4]) == 0.
    """
    raise NotImplementedError


class RadixTree:
    """Tasks 09.2, 09.2b and 09.2c: a set of token sequences that answers "how many leading tokens of this prompt
    are stored?" to the exact token, storing each shared prefix once.

    Contract: the tree behaves exactly as the list of the sequences inserted so far (lists or tuples) would:
    - match_prefix(tokens) is the longest longest_common_prefix of tokens with any stored sequence: 0 for an
      empty tree or an empty query. It is token-granular where the engine's lookup is block-granular (vLLM 0.33:
      FullAttentionManager.find_longest_cache_hit in vllm/v1/core/single_type_kv_cache_manager.py walks whole
      blocks through BlockPool.get_cached_block): a prompt that leaves a stored one at token 40 matches 40 here,
      32 there with 16-token blocks.
    - insert(tokens) stores tokens and returns how many of them were new: len(tokens) minus what match_prefix
      returned just before (0 for a stored sequence or a prefix of one).
    - num_tokens is the number of stored tokens, each distinct prefix token counted once: the number of
      distinct non-empty prefixes of the stored sequences. Inserting 100 tokens, then 100 that share the first
      40 with them, stores 160.
    Store the sequences as a radix tree (a trie whose edges carry runs of tokens, SGLang's RadixAttention index,
    which vLLM does not have): a shared prefix is one shared edge, and an insert that leaves an edge partway
    splits it there, keeping everything that hung below it. 09.2 and 09.2b check the rules on fixed cases; 09.2c
    replays random inserts and lookups on your tree and on a plain list of the sequences and compares every
    result and num_tokens.
    Example: on a new tree, insert([1, 2, 3, 4]) returns 4 and insert([1, 2, 9]) returns 1 (num_tokens is now 5);
    then match_prefix([1, 2, 3, 7]) == 3, match_prefix((1, 2)) == 2, match_prefix([5]) == 0, and insert([1, 2])
    returns 0 with num_tokens still 5.
    """

    def __init__(self) -> None:
        self.num_tokens = 0

    def insert(self, tokens: Sequence[int]) -> int:
        raise NotImplementedError

    def match_prefix(self, tokens: Sequence[int]) -> int:
        raise NotImplementedError


def slru_eviction_order(freed: Sequence[tuple[int, bool]], protected_cap: int) -> list[int]:
    """Task 09.3: the order in which the frequency-aware pool evicts cached blocks freed one at a time.

    Contract: freed lists (block_id, reused), each block once, in the order the blocks were freed; reused means
    the block had a cache hit since it was cached. The free cached blocks form two segments, each oldest first:
    protected (reused) and probation (the others). A freed block joins the newest end of its segment; whenever
    protected then holds more than protected_cap blocks (a cap of 0 or more), its oldest block is demoted to the
    newest end of probation. Eviction takes probation oldest first, then protected oldest first: return the
    block ids in that order. Without reuse this is vLLM's LRU, the freeing order (vLLM 0.33: BlockPool.free_blocks
    appends freed cached blocks to the free queue's tail and get_new_blocks takes from its head, in
    vllm/v1/core/block_pool.py). The result must equal the order of the engine's FrequencyAwareBlockPool, whose
    blocks the grader caches, hits and frees for real (no aging, which needs allocations), on fixed and random
    cases.
    Example: slru_eviction_order([(10, True), (11, False), (12, True), (13, True)], 2) == [11, 10, 12, 13]:
    freeing 13 puts three blocks in protected, one over the cap, so its oldest, 10, joins probation after 11.
    """
    raise NotImplementedError


def route(request_hashes: Sequence[bytes], replica_hashes: Sequence[set[bytes]], loads: Sequence[int]) -> int:
    """Task 09.4: the index of the replica a cache-aware router sends a request to.

    Contract: request_hashes is the request's chain of block hashes; replica_hashes[r] (anything that answers
    `in`: a set, or the index of task 09.5) holds the hashes replica r has cached; loads[r] is its load; there
    is at least one replica. A replica's match is the number of leading request hashes it holds, up to the first
    it lacks: a hash after a miss is worth nothing, because the replica's own lookup stops at the first miss
    (vLLM 0.33: FullAttentionManager.find_longest_cache_hit, "A missing block implies every later block misses
    too (chained hashes)", in vllm/v1/core/single_type_kv_cache_manager.py). Return the replica with the longest
    match; among those, the least loaded; among those, the lowest index. A replica that matches less is never
    chosen, whatever its load. The grader also compares your route with the engine's on random cases.
    Example: route([h1, h2, h3], [{h1}, {h1, h3}, {h2, h3}], [2, 1, 0]) == 1: replicas 0 and 1 match 1 block
    (replica 1's h3 comes after its miss on h2), replica 2 matches 0, and of 0 and 1, replica 1 is less loaded.
    """
    raise NotImplementedError


def apply_events(counts: dict[bytes, int], events: Iterable[KVCacheEvent]) -> None:
    """Task 09.5: update a replica's index (block hash -> number of cached copies) from its KV events.

    Contract: mutate counts, the caller's dict, which the router keeps between calls; read events, any iterable,
    once and in order. BlockStored adds one copy of each of its block_hashes (its parent_block_hash only links
    the chain). BlockRemoved removes one copy of each of its block_hashes; a hash whose count reaches 0 leaves
    the dict, so no count is ever 0 or negative, and removing a hash the dict does not hold changes nothing (a
    router that started listening late sees removals of blocks stored before). AllBlocksCleared empties the dict.
    Copies, not a set: two requests with the same prompt in chunked prefill at the same time each cache their
    own copy of the same blocks, and evicting one copy emits BlockRemoved while the other still serves hits.
    Replaying all of a pool's events must give exactly its map, hash -> cached copies. (vLLM 0.33: BlockStored,
    BlockRemoved and AllBlocksCleared in vllm/distributed/kv_events.py, queued by BlockPool.cache_full_blocks,
    by _maybe_evict_cached_block through _emit_block_removed_events, and by reset_prefix_cache; NOTE #1 of
    BlockHashToBlockMap in vllm/v1/core/block_pool.py says why copies exist.) The grader also replays random
    event batches, each handed over as an iterator, against the engine's ReplicaIndex.
    Example: from counts == {}, the events BlockStored([h1, h2]), BlockStored([h1]), BlockRemoved([h1, h2, h9])
    leave counts == {h1: 1}.
    """
    raise NotImplementedError
