"""Chapter 12 exercises: a sliding-window layer's blocks, the part of a hybrid model's KV cache that moves.

Your SlidingWindowManager subclasses the engine's and replaces the three rules that make a window a
window. Everything else (allocating, caching, freeing a finished request) is inherited. Once the tasks
pass, your manager serves every sliding group of a hybrid model:
`LLM(model, sliding_window_manager_cls=SlidingWindowManager)`.

What you can use: `self.sliding_window` (W, in tokens), `self.block_size`, `self.block_pool` (its
`free_blocks(blocks)` drops one reference on each), `self.null_block`, `self.use_eagle`,
`self.req_to_blocks[request_id]` (the request's blocks in this group, token i in entry i // block_size),
and `self.get_cached_blocks(block_hash, group_ids)` (one cached block per group, or None).

Check your work with:   make grade CH=12
"""

from __future__ import annotations

from nanoengine.core import BlockHash, KVCacheBlock
from nanoengine.core import SlidingWindowManager as EngineSlidingWindowManager


class SlidingWindowManager(EngineSlidingWindowManager):
    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Task 12.1: how many leading tokens no query from now on can see.

        The next query sits at position num_computed_tokens and sees keys from position
        num_computed_tokens - W + 1 to itself; every later query sees even less of the past.

        Hints: W = 4 and num_computed_tokens = 7: the query at 7 sees 4, 5, 6, 7, so 4 tokens are skipped.
        Early in a request nothing is skipped yet, and a count of tokens is never negative.
        """
        raise NotImplementedError

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Task 12.2: give back the blocks whose every token is skipped, and put the null block in their
        places in self.req_to_blocks[request_id].

        Hints:
        - Only whole blocks go: a block with one visible token stays. Skipped tokens // block_size.
        - Walk from the last skipped block back to the first, and stop at the first null block you
          meet: an earlier call already freed it and everything before it. Freeing a block twice
          drops a reference someone else holds (the pool raises on a double free).
        - Free the blocks with one self.block_pool.free_blocks(list) call.
        - The request may hold fewer blocks than the skipped count covers (its hit was shorter).
        """
        raise NotImplementedError

    def find_longest_cache_hit(self, block_hashes: list[BlockHash], max_length: int,
                               group_ids: list[int]) -> tuple[list[KVCacheBlock], ...]:
        """Task 12.3: the longest prefix hit of at most max_length tokens, for every group in group_ids
        (all with this manager's window): one list per group, each of the same length L, where
        entry i is the cached block of block_hashes[i], or the null block where no query past the
        hit can see those tokens.

        A hit of L blocks is good when the tokens the next query can see are cached: blocks
        max(0, L - n) .. L - 1, with n = ceil((W - 1) / block_size) (the query's own token is computed,
        not cached, so the window needs only W - 1 cached tokens behind it). With self.use_eagle, ask
        for n + 1 blocks, then drop the last block of the hit: EAGLE's draft head needs that block's
        hidden states, so it is computed again.

        Hints:
        - Search from the right: start at block max_length // block_size - 1 and walk left, counting
          cached blocks in a row; a miss resets the count. The first run of n stops the search.
        - A run that reaches block 0 is a hit even when shorter than n: nothing before it exists.
        - Start each list as [self.null_block] * num_blocks, write the run's blocks in, and cut each list
          at the run's end.
        """
        raise NotImplementedError
