"""Chapter 05 solutions: the free-block queue as a doubly linked list threaded through the blocks."""

from __future__ import annotations

from collections.abc import Sequence

from nanoengine.core import KVCacheBlock


class FreeKVCacheBlockQueue:
    """Tasks 05.1-05.4: free blocks from head (reused first) to tail, O(1) remove anywhere.

    Invariants: head <-> b1 <-> ... <-> bn <-> tail through prev_free_block/next_free_block; a block
    outside the queue has both links None; num_free_blocks == n.
    """

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        # Sentinels are never handed out, so every real block always has two real neighbours to relink.
        self.fake_free_list_head = KVCacheBlock(block_id=-1)
        self.fake_free_list_tail = KVCacheBlock(block_id=-1)
        _link(self.fake_free_list_head, self.fake_free_list_tail)
        self.num_free_blocks = 0
        self.append_n(blocks)

    def popleft(self) -> KVCacheBlock:
        return self.popleft_n(1)[0]

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        if not 0 <= n <= self.num_free_blocks:
            raise ValueError(f"cannot pop {n} blocks from a queue of {self.num_free_blocks}")
        taken = []
        for _ in range(n):
            block = self.fake_free_list_head.next_free_block
            self.remove(block)
            taken.append(block)
        return taken

    def remove(self, block: KVCacheBlock) -> None:
        _link(block.prev_free_block, block.next_free_block)
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        self.append_n([block])

    def append_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        self._splice(blocks, self.fake_free_list_tail.prev_free_block)

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        self._splice(blocks, self.fake_free_list_head)

    def _splice(self, blocks: Sequence[KVCacheBlock], after: KVCacheBlock) -> None:
        # Chain after -> blocks... -> its old successor, keeping the blocks' order.
        before = after.next_free_block
        for block in blocks:
            _link(after, block)
            after = block
        _link(after, before)
        self.num_free_blocks += len(blocks)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        blocks, block = [], self.fake_free_list_head.next_free_block
        while block is not self.fake_free_list_tail:
            blocks.append(block)
            block = block.next_free_block
        return blocks


def _link(left: KVCacheBlock, right: KVCacheBlock) -> None:
    left.next_free_block = right
    right.prev_free_block = left
