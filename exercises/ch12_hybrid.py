"""Chapter 12 exercises: a sliding-window layer's blocks, the part of a hybrid model's KV cache that moves.

Your SlidingWindowManager subclasses the engine's and replaces the three rules that make a window a
window. Everything else (allocating, caching, freeing a finished request) is inherited. Once the tasks
pass, your manager serves every sliding group of a hybrid model:
`LLM(model, sliding_window_manager_cls=SlidingWindowManager)`. It mirrors vLLM 0.33's SlidingWindowManager
(vllm/v1/core/single_type_kv_cache_manager.py).

What you can use: `self.sliding_window` (W, in tokens), `self.block_size`, `self.block_pool` (chapter 06's
pool: free_blocks(blocks) drops one reference on each (an empty list changes nothing), and a block that
reaches 0 joins the free queue: the unhashed ones inserted at its head and the hashed ones appended at its tail,
each kind keeping the order given, so the first given of a kind leaves before the others of that kind),
`self.null_block` (the pool's one null block; any block's `block.is_null` is True for it alone), `self.use_eagle`,
`self.req_to_blocks` (a plain dict, request id -> list of the request's blocks in this group, token i in entry
i // block_size: indexing an id it lacks raises KeyError, .get does not), and
`self.get_cached_blocks(block_hash, group_ids)` (a list[KVCacheBlock] holding the block cached under block_hash
in each group of group_ids, in that order, or None unless every group has one).

Tasks 12.1 to 12.3 are the three methods below. Tasks 12.4 and 12.5 need no code of their own: they grade those
three inside the engine (a hybrid model served end to end, then random workloads beside the engine's manager).

The stubs state what each result must be, not how to get it: notebook 12's sections 3 and 6 say why, and the
examples let you check a rule you derive before you code it.

Work in this order: the chapter and the contract, your own design, the grade; only then vLLM 0.33's
function, named in each task, read beside yours. Where the two differ is the lesson (what vLLM adds, what
nanoengine leaves out); reading vLLM's first turns the task into copying.

Check your work with:   make grade CH=12
Stuck? In the notebook, `from nanocourse import hint; hint("12")` lists this chapter's hints, from a nudge to
close-to-code; open them one at a time with hint("12", n).
"""

from __future__ import annotations

from nanoengine.core import BlockHash, KVCacheBlock
from nanoengine.core import SlidingWindowManager as EngineSlidingWindowManager


class SlidingWindowManager(EngineSlidingWindowManager):
    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Task 12.1: how many leading tokens no query from now on can see.

        Contract: the next query sits at position num_computed_tokens and sees the W keys ending at itself
        (its own included); every later query sees even less of the past. Return the number of tokens
        before that window: never negative, 0 while the window still reaches token 0. (vLLM 0.33:
        SlidingWindowManager.get_num_skipped_tokens, whose extra_retained_tokens is 0 here.)
        Example: W = 4: num_computed_tokens 0..9 give 0, 0, 0, 0, 1, 2, 3, 4, 5, 6 (at 7 the query sees
        tokens 4..7, so 4 are skipped).
        """
        raise NotImplementedError

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Task 12.2: give back the blocks no query from num_computed_tokens on can see; the null block takes
        their places in self.req_to_blocks[request_id].

        Contract (what must hold after the call):
        - Which blocks go: a block goes once every one of its tokens is among the
          get_num_skipped_tokens(num_computed_tokens) skipped ones; a block with one visible token stays. A request
          may hold fewer blocks than are skipped (its table may not yet reach as far as num_computed_tokens:
          only the blocks it holds can go); a request with no entry in req_to_blocks
          (allocate_slots calls this for a request being admitted) is left alone: no KeyError, no entry added
          (vLLM 0.33 indexes its req_to_blocks, a defaultdict, which adds an empty entry there instead).
        - The table keeps its length and its positions: the entry of every block given back holds
          self.null_block, every other entry holds the block it held before.
        - References: each block given back has dropped exactly one reference in the pool; no block is given back
          twice (the pool raises on a double free), so a repeat, or a call with fewer tokens computed, gives back
          nothing.
        - Eviction order (it decides which cached blocks later prefix hits still find): of the blocks one call
          gives back, the one nearest the window leaves the pool's free queue first and the one nearest block 0
          last. This holds both for never-cached blocks (which the pool queues at its head) and for cached ones
          (queued at its tail). That is the order free() gives a finished request's blocks: a chain's earlier blocks stay
          cached longest.
        (vLLM 0.33: SingleTypeKVCacheManager.remove_skipped_blocks and its _remove_blocks_in_range.)
        Example: W = 4, block_size 4, request r holds blocks [b1, b2, b3, b4, b5] (20 tokens).
        remove_skipped_blocks("r", 12): 9 tokens skipped, so b1 and b2 go back, b2 to be reused or evicted before
        b1, and the table is [null, null, b3, b4, b5]. Then remove_skipped_blocks("r", 17): 14 skipped, only b3
        goes back: [null, null, null, b4, b5]. remove_skipped_blocks("r", 12) again gives back nothing.
        """
        raise NotImplementedError

    def find_longest_cache_hit(
        self, block_hashes: list[BlockHash], max_length: int, group_ids: list[int]
    ) -> tuple[list[KVCacheBlock], ...]:
        """Task 12.3: the longest prefix hit of at most max_length tokens that a window can serve, for every
        group in group_ids (all with this manager's window): one list per group, all of the same length L in
        blocks, entry i standing for block_hashes[i].

        Contract ("cached" means cached in every group of group_ids; W is self.sliding_window):
        - What a hit must serve: after a hit of L blocks the request's next query sits at token L * block_size;
          its own token is computed, not cached. Every earlier token that query can see must lie in a cached
          block of the hit. Tokens no query from there on can see need nothing (their blocks may be evicted).
        - A hit ends on a cached block: entry L - 1 is cached even at W = 1, where the next query sees no earlier
          token; null blocks alone are no hit.
        - Each list holds that group's cached block of block_hashes[i] at every entry the hit needs (the ones the
          two rules above name) and self.null_block at every entry before them (as if the request had run this
          far and freed them).
        - L is the largest such length, in whole blocks and at most max_length // block_size; if there is none,
          every list is []. max_length never exceeds len(block_hashes) * block_size.
        - With self.use_eagle: the hit's last block is computed again, since EAGLE's draft KV at a position
          depends on the token after it, which a cached prefix cannot supply (vLLM 0.33's fallback,
          SpeculativeConfig.needs_eagle_block_drop; by default its block hashes cover the next token instead and
          nothing is dropped: notebook 12's vLLM box). The hit returned is what is left once that block is dropped:
          the dropped block was cached, the hit before the drop keeps within max_length too, what is left must
          still serve the next query by the first rule, and it is the longest such. At W = 1, where the next query sees no earlier token, its last entry may be null.
        - A lookup only: no ref_cnt, queue or map changes.
        (vLLM 0.33: SlidingWindowManager.find_longest_cache_hit, a classmethod there that also takes the
        pool, the spec and an alignment and returns the hit length too.)
        Example: W = 8, block_size 4 (the query at token 24 sees tokens 17..24); blocks 0..6 cached as
        X X . X X X . (X: cached, c_i its block), max_length 28, one group: [null, null, null, null, c4, c5], a
        24-token hit. With EAGLE: [null, null, null, c3, c4]. W = 13, blocks X X . X, max_length 16: [c0, c1].
        W = 1, blocks X X . X, max_length 16: [null, null, null, c3], and with EAGLE [null, null, null] (a 12-token
        hit whose last entry is null: block 3 is the one computed again). Nothing cached: [].
        """
        raise NotImplementedError
