"""Chapter 12 exercises: a sliding-window layer's blocks, the part of a hybrid model's KV cache that moves.

Your SlidingWindowManager subclasses the engine's and replaces the three rules that make a window a
window. Everything else (allocating, caching, freeing a finished request) is inherited. Once the tasks
pass, your manager serves every sliding group of a hybrid model:
`LLM(model, sliding_window_manager_cls=SlidingWindowManager)`. It mirrors vLLM 0.33's SlidingWindowManager
(vllm/v1/core/single_type_kv_cache_manager.py): read it beside this.

What you can use: `self.sliding_window` (W, in tokens), `self.block_size`, `self.block_pool` (its
`free_blocks(blocks)` drops one reference on each), `self.null_block`, `self.use_eagle`,
`self.req_to_blocks[request_id]` (the request's blocks in this group, token i in entry i // block_size),
and `self.get_cached_blocks(block_hash, group_ids)` (one cached block per group, or None).

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
        """Task 12.2: give back the blocks whose every token is skipped; the null block takes their places in
        self.req_to_blocks[request_id].

        Contract:
        - Only whole blocks go: a block is freed when all its tokens are among the
          get_num_skipped_tokens(num_computed_tokens) skipped ones; a block with one visible token stays.
        - The skipped blocks are capped at the blocks the request holds (a short hit may leave it fewer);
          a request with no entry in req_to_blocks (allocate_slots calls this for a request being admitted)
          is left alone: no KeyError, no entry added.
        - Each freed block drops exactly one reference, in the pool (free_blocks), and its entry becomes
          self.null_block; the other entries stay where they were. A block an earlier call already
          nulled is never freed again (the pool raises on a double free), so a repeat, or a call with fewer
          tokens computed, frees nothing.
        - The pool gets the newly skipped blocks in one free_blocks call, last block first (the one nearest
          the window first, then back towards block 0): it queues them in that order, so a chain's later blocks
          are evicted before its earlier ones, as when a finished request is freed. This order decides which
          cached blocks later prefix hits still find.
        (vLLM 0.33: SingleTypeKVCacheManager.remove_skipped_blocks and its _remove_blocks_in_range.)
        Example: W = 4, block_size 4, request r holds blocks [b1, b2, b3, b4, b5] (20 tokens).
        remove_skipped_blocks("r", 12): 9 tokens skipped, so 2 whole blocks: free_blocks([b2, b1]) and the
        table is [null, null, b3, b4, b5]. Then remove_skipped_blocks("r", 17): 14 skipped, 3 blocks, only
        b3 is freed: [null, null, null, b4, b5]. remove_skipped_blocks("r", 12) again frees nothing.
        """
        raise NotImplementedError

    def find_longest_cache_hit(
        self, block_hashes: list[BlockHash], max_length: int, group_ids: list[int]
    ) -> tuple[list[KVCacheBlock], ...]:
        """Task 12.3: the longest prefix hit of at most max_length tokens, for every group in group_ids
        (all with this manager's window): one list per group, each of the same length L, where
        entry i is the cached block of block_hashes[i], or the null block where no query past the
        hit can see those tokens.

        Contract ("cached" means cached in every group of group_ids):
        - What a hit guarantees: after a hit of L blocks, the next query sits at token L * block_size and sees
          the W - 1 tokens before it (its own token is computed, not cached). Every block holding one of those
          tokens is cached, and so is block L - 1 even when W = 1: a hit ends on a cached block, never on null
          blocks alone. Tokens before token 0 do not exist, so a run of cached blocks from block 0 guarantees it.
        - Each list holds, for those visible blocks, that group's cached block of block_hashes[i]; every entry
          before them is self.null_block (no later query sees those tokens).
        - L is the largest such length, in whole blocks and at most max_length // block_size; no such L: every
          list is [].
        - With self.use_eagle, the hit is the one a window block_size tokens longer would get, less its last
          entry in every list when it is not empty: EAGLE's draft head needs that block's hidden states, so it
          is computed again.
        - A lookup only: no ref_cnt, queue or map changes.
        (vLLM 0.33: SlidingWindowManager.find_longest_cache_hit, a classmethod there that also takes the
        pool, the spec and an alignment and returns the hit length too.)
        Example: W = 8, block_size 4 (the 7 visible tokens span 2 blocks); blocks 0..6 cached as X X . X X X .
        (X: cached, c_i its block), max_length 28, one group: [null, null, null, null, c4, c5], a 24-token hit.
        With EAGLE: [null, null, null, c3, c4]. W = 13 (3 blocks), blocks X X . X, max_length 16: [c0, c1].
        W = 1, blocks X X . X, max_length 16: [null, null, null, c3]; nothing cached: [].
        """
        raise NotImplementedError
