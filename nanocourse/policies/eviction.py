"""Frequency-aware eviction for the prefix cache: a segmented LRU (SLRU) with aging.

The engine's BlockPool evicts the block freed longest ago (LRU). One burst of one-off prompts then
pushes out a system prompt that nearly every request reuses, because recency is all LRU sees.
FrequencyAwareBlockPool also remembers which cached blocks were *reused* (hit) and evicts the
others first:

    fresh (no hash)  ->  probation (cached, no hit yet)  ->  protected (cached, hit)

Within a segment the order stays LRU, so a chain's tail still goes before its root. Remembering
frequency forever is pure LFU's failure (yesterday's hot prompt never leaves), so protection is
bounded twice and a demoted block must be hit again to be protected again:
- in space: protected holds at most protected_cap free blocks; past it, its oldest is demoted;
- in time: a protected block whose last hit is more than reuse_window allocated blocks ago is
  demoted, i.e. once LRU would have had a whole pool's turnover to evict it.
This is ARC's split between "seen once" and "seen again" with fixed bounds instead of ARC's
adaptive target.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from nanoengine.core import BlockPool, FreeKVCacheBlockQueue, KVCacheBlock

SEGMENTS = ("fresh", "probation", "protected")


class SegmentedFreeQueue:
    """The free blocks in three LRU segments, with FreeKVCacheBlockQueue's interface.

    Invariants: every free non-null block is in exactly one segment and no block in use is in any;
    fresh blocks have no hash, probation and protected blocks have one (BlockPool prepends the
    unhashed and appends the hashed); protected holds at most protected_cap blocks, all in
    `reused`. `reused` maps each cached block hit since it was cached (free or in use) to the
    clock at its last hit; the clock counts blocks handed out. A block loses its mark when it is
    demoted or handed out (its content is about to be overwritten).
    """

    def __init__(
        self, blocks: Sequence[KVCacheBlock], protected_cap: int | None = None, reuse_window: int | None = None
    ) -> None:
        # Each segment is an intrusive list: remove() stays O(1) whatever segment a block is in.
        self.fresh = FreeKVCacheBlockQueue(list(blocks))
        self.probation = FreeKVCacheBlockQueue([])
        self.protected = FreeKVCacheBlockQueue([])
        self.protected_cap = len(blocks) if protected_cap is None else protected_cap
        self.reuse_window = len(blocks) if reuse_window is None else reuse_window
        self.reused: dict[int, int] = {}
        self.clock = 0
        self._segment_of = {block.block_id: self.fresh for block in blocks}

    @property
    def num_free_blocks(self) -> int:
        return sum(queue.num_free_blocks for queue in self._segments())

    def _segments(self) -> tuple[FreeKVCacheBlockQueue, ...]:
        return self.fresh, self.probation, self.protected

    def segment(self, block: KVCacheBlock) -> str | None:
        """'fresh', 'probation' or 'protected' for a free block; None for one in use."""
        queue = self._segment_of.get(block.block_id)
        return None if queue is None else SEGMENTS[self._segments().index(queue)]

    def popleft(self) -> KVCacheBlock:
        return self.popleft_n(1)[0]

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """The next n blocks to reuse: fresh first, then probation, then protected, oldest first."""
        if not 0 <= n <= self.num_free_blocks:
            raise ValueError(f"{n} blocks wanted but {self.num_free_blocks} are free in all three segments.")
        self._age()
        taken: list[KVCacheBlock] = []
        for queue in self._segments():
            taken += queue.popleft_n(min(n - len(taken), queue.num_free_blocks))
        for block in taken:
            del self._segment_of[block.block_id]
            self.reused.pop(block.block_id, None)
        self.clock += n
        return taken

    def _age(self) -> None:
        # Protected is in free order and a block is freed after its last hit, so the head is
        # (nearly) the stalest: stop at the first block still inside the window.
        while self.protected.num_free_blocks:
            head = self.protected.fake_free_list_head.next_free_block
            if self.clock - self.reused[head.block_id] <= self.reuse_window:
                return
            self.protected.remove(head)
            self._demote(head)

    def _demote(self, block: KVCacheBlock) -> None:
        del self.reused[block.block_id]
        self.probation.append(block)
        self._segment_of[block.block_id] = self.probation

    def remove(self, block: KVCacheBlock) -> None:
        queue = self._segment_of.pop(block.block_id, None)
        if queue is None:
            raise ValueError(f"remove() called on a block that is not in the free queue: {block}")
        queue.remove(block)

    def append(self, block: KVCacheBlock) -> None:
        self.append_n((block,))

    def append_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Cached blocks becoming free: reused ones to protected's tail, the others to probation's."""
        for block in blocks:
            queue = self.protected if block.block_id in self.reused else self.probation
            queue.append(block)
            self._segment_of[block.block_id] = queue
        while self.protected.num_free_blocks > self.protected_cap:
            self._demote(self.protected.popleft())

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Unhashed blocks becoming free: their content is worthless, so they go first."""
        self.fresh.prepend_n(blocks)
        for block in blocks:
            self._segment_of[block.block_id] = self.fresh

    def mark_reused(self, block: KVCacheBlock) -> None:
        """Record a cache hit on a block in use; it joins protected when it is freed."""
        self.reused[block.block_id] = self.clock

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """The free blocks in eviction order: fresh, probation, protected, each oldest first.

        Aging is applied lazily at the next popleft_n, so a stale protected block may still be
        listed last here.
        """
        return [block for queue in self._segments() for block in queue.get_all_free_blocks()]


class FrequencyAwareBlockPool(BlockPool):
    """A BlockPool whose free blocks form a SegmentedFreeQueue: reused cached blocks outlive one-offs.

    Plug it in with `LLM(block_pool=lambda n, c: FrequencyAwareBlockPool(n, c))` or hand it to
    KVCacheManager. Everything else (the map, events, ref counts, lazy eviction at allocation) is
    BlockPool's own code; only the order of eviction changes. protected_fraction caps protected at
    that fraction of the usable blocks; reuse_window defaults to the number of usable blocks.
    """

    free_block_queue: SegmentedFreeQueue

    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool,
        *args: Any,
        protected_fraction: float = 0.5,
        reuse_window: int | None = None,
        **kwargs: Any,
    ) -> None:
        """BlockPool's arguments (free_queue_cls excepted), plus the two bounds on protection."""
        if not 0.0 <= protected_fraction <= 1.0:
            raise ValueError(f"protected_fraction must be in [0, 1], got {protected_fraction}.")
        usable = max(num_gpu_blocks - 1, 0)
        cap, window = int(protected_fraction * usable), usable if reuse_window is None else reuse_window
        queue = lambda blocks: SegmentedFreeQueue(blocks, cap, window)
        super().__init__(num_gpu_blocks, enable_caching, *args, free_queue_cls=queue, **kwargs)

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """A cache hit: take a reference on each block and mark it reused."""
        blocks = list(blocks)
        super().touch(blocks)
        for block in blocks:
            if block.block_hash is not None:
                self.free_block_queue.mark_reused(block)

    def reset_prefix_cache(self) -> bool:
        """As BlockPool's; every block lost its hash, so all of them go back to fresh."""
        if not super().reset_prefix_cache():
            return False
        old = self.free_block_queue
        self.free_block_queue = SegmentedFreeQueue(old.get_all_free_blocks(), old.protected_cap, old.reuse_window)
        self.free_block_queue.clock = old.clock
        return True

    def segment(self, block: KVCacheBlock) -> str:
        """Where a block stands: 'null', 'in use', or the free segment it sits in."""
        if block.is_null:
            return "null"
        return self.free_block_queue.segment(block) or "in use"
