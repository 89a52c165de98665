"""Chapter 12 solutions: a sliding-window layer's blocks."""

from __future__ import annotations

from nanoengine.core import BlockHash, KVCacheBlock
from nanoengine.core import SlidingWindowManager as EngineSlidingWindowManager


class SlidingWindowManager(EngineSlidingWindowManager):
    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Task 12.1: the next query at num_computed_tokens sees from num_computed_tokens - W + 1."""
        return max(num_computed_tokens - self.sliding_window + 1, 0)

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Task 12.2: free the wholly skipped blocks, last first, stopping at an earlier call's nulls."""
        blocks = self.req_to_blocks.get(request_id, [])
        last = min(self.get_num_skipped_tokens(num_computed_tokens) // self.block_size, len(blocks)) - 1
        freed = []
        while last >= 0 and not blocks[last].is_null:
            freed.append(blocks[last])
            blocks[last] = self.null_block
            last -= 1
        self.block_pool.free_blocks(freed)

    def find_longest_cache_hit(
        self, block_hashes: list[BlockHash], max_length: int, group_ids: list[int]
    ) -> tuple[list[KVCacheBlock], ...]:
        """Task 12.3: from the right, the first run of ceil((W - 1) / block_size) cached blocks (one more
        with EAGLE), or the run that reaches block 0."""
        needed = (self.sliding_window - 1 + self.block_size - 1) // self.block_size + int(self.use_eagle)
        num_blocks = max_length // self.block_size
        lists = tuple([self.null_block] * num_blocks for _ in group_ids)
        run, end = 0, 0
        for i in reversed(range(num_blocks)):
            cached = self.get_cached_blocks(block_hashes[i], group_ids)
            run = run + 1 if cached else 0
            if cached:
                for blocks, block in zip(lists, cached):
                    blocks[i] = block
            if cached and (run >= needed or i == 0):  # at W = 1 no block is needed before the hit's last
                end = i + run
                break
        for blocks in lists:
            del blocks[end:]
            if self.use_eagle and end:
                blocks.pop()
        return lists
