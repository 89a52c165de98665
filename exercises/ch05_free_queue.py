"""Chapter 05 exercises: the free-block queue, a doubly linked list threaded through the blocks.

Every KVCacheBlock carries two link fields, `prev_free_block` and `next_free_block`, that are None while
the block is not in the queue. Your queue uses them directly: no list, no deque, no wrapper nodes.

Check your work with:   make grade CH=05
"""

from __future__ import annotations

from collections.abc import Sequence

from nanoengine.core import KVCacheBlock


class FreeKVCacheBlockQueue:
    """Free blocks from head (handed out first) to tail, with O(1) remove of any block.

    The engine's BlockPool calls exactly these methods, so once the tasks pass your queue can run the
    real engine: `BlockPool(n, caching, free_queue_cls=FreeKVCacheBlockQueue)`.
    """

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        """Task 05.1: link `blocks`, in order, into one list; set `self.num_free_blocks`.

        Hints:
        - Make two sentinel blocks, `KVCacheBlock(block_id=-1)`, for the head and the tail. With them in
          place every real block always has a real neighbour on each side, so no method needs an
          "is this the first block?" branch, and an empty queue is just head <-> tail.
        - A helper `link(left, right)` that sets `left.next_free_block = right` and
          `right.prev_free_block = left` is all the pointer work the whole class needs.
        """
        raise NotImplementedError

    def popleft(self) -> KVCacheBlock:
        """Task 05.2: unlink and return the block at the head."""
        raise NotImplementedError

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Task 05.2: unlink and return the first n blocks, head first.

        Raise ValueError when n is negative or larger than num_free_blocks: handing out a sentinel
        (block_id -1) would corrupt the pool. A popped block's two links must be None afterwards.
        """
        raise NotImplementedError

    def remove(self, block: KVCacheBlock) -> None:
        """Task 05.3: unlink `block` from wherever it is, in O(1).

        Hints: its neighbours are `block.prev_free_block` and `block.next_free_block`; link them to each
        other, then set the block's own links to None. Do not walk the list.
        """
        raise NotImplementedError

    def append(self, block: KVCacheBlock) -> None:
        """Task 05.2: put one block at the tail (evicted last)."""
        raise NotImplementedError

    def append_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Task 05.2: put blocks at the tail, keeping their order."""
        raise NotImplementedError

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Task 05.4: put blocks at the head, keeping their order (blocks[0] becomes the new head).

        BlockPool.free_blocks uses it for blocks without a hash: their content is worth nothing, so
        they are reused first. Hint: splice them in between the head sentinel and its old successor.
        """
        raise NotImplementedError

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """Task 05.1: the blocks from head to tail, sentinels excluded."""
        raise NotImplementedError
