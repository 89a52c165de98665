"""Chapter 05 exercises: the free-block queue, a doubly linked list threaded through the blocks.

Every KVCacheBlock carries two link fields, `prev_free_block` and `next_free_block`, that are None while
the block is not in the queue. Your queue uses them directly: no list, no deque, no wrapper nodes.
It mirrors vLLM 0.33's FreeKVCacheBlockQueue (vllm/v1/core/kv_cache_utils.py): read it once yours passes.

Check your work with:   make grade CH=05
Stuck? In the notebook, `from nanocourse import hint; hint("05")` lists this chapter's hints, from a nudge to
close-to-code; open them one at a time with hint("05", n).
"""

from __future__ import annotations

from collections.abc import Sequence

from nanoengine.core import KVCacheBlock


class FreeKVCacheBlockQueue:
    """Free blocks from head (handed out first) to tail, with O(1) remove of any block.

    The engine's BlockPool calls exactly these methods, so once the tasks pass your queue can run the
    real engine: `BlockPool(n, caching, free_queue_cls=FreeKVCacheBlockQueue)`, and it must behave there as
    a plain Python list of the free blocks would (same tokens, same prefix-cache hits).

    Invariants after every method (the graded tests check each, after random sequences of calls too):
    - The blocks in the queue are linked both ways: for neighbours a, b, `a.next_free_block is b` and
      `b.prev_free_block is a`. The first and last block link to two sentinels, `KVCacheBlock(block_id=-1)`,
      never to None; a sentinel is never handed out or listed.
    - A block outside the queue (popped or removed) has both links None.
    - `self.num_free_blocks` is the number of blocks in the queue.
    - The sentinels are `self.fake_free_list_head` and `self.fake_free_list_tail`, vLLM's names: chapter 05's
      diagram (`free_queue_diagram`) follows your links from them.
    (vLLM 0.33: FreeKVCacheBlockQueue in vllm/v1/core/kv_cache_utils.py, with sentinels fake_free_list_head
    and fake_free_list_tail.)
    """

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        """Task 05.1: link `blocks`, in order, into one list; set `self.num_free_blocks`.

        Contract: afterwards the queue walks head to tail as `blocks` (blocks[0] is handed out first) and
        num_free_blocks == len(blocks); the links live in the blocks themselves; the end blocks link to the
        sentinels. An empty list makes an empty queue (the head sentinel linked straight to the tail one).
        (vLLM 0.33: FreeKVCacheBlockQueue.__init__.)
        Example: blocks 0..4 walk as [0, 1, 2, 3, 4] with num_free_blocks 5; block 1's prev_free_block is
        block 0 and its next_free_block block 2; block 0's prev_free_block and block 4's next_free_block are
        sentinels (block_id -1).
        """
        raise NotImplementedError

    def popleft(self) -> KVCacheBlock:
        """Task 05.2: unlink and return the block at the head.

        Contract: returns the head block, its links now None, and num_free_blocks drops by 1. On an empty
        queue it raises ValueError and changes nothing: it never hands out a sentinel. (vLLM 0.33:
        FreeKVCacheBlockQueue.popleft, which raises ValueError("No free blocks available").)
        Example: on a new queue of blocks 0..5, popleft() returns block 0 (both links None) and leaves
        [1, 2, 3, 4, 5] with num_free_blocks 5.
        """
        raise NotImplementedError

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Task 05.2: unlink and return the first n blocks, head first.

        Contract: returns a new list of the n blocks nearest the head, in queue order; each has both links
        None afterwards and num_free_blocks drops by n. popleft_n(0) returns [] and changes nothing. When n is
        negative or larger than num_free_blocks (fewer than n blocks are free) it raises ValueError and
        changes nothing: no block leaves the queue, no link or count moves, and a sentinel (block_id -1) is
        never handed out. (vLLM 0.33: FreeKVCacheBlockQueue.popleft_n, which asserts instead.)
        Example: on [3, 4, 5], popleft_n(2) returns [block 3, block 4] and leaves [5]; popleft_n(2) on that
        [5] raises ValueError and the queue is still [5] with num_free_blocks 1.
        """
        raise NotImplementedError

    def remove(self, block: KVCacheBlock) -> None:
        """Task 05.3: unlink `block` from wherever it is, in O(1).

        Contract: `block` (in the queue: at the head, the tail or anywhere between) leaves it; the others keep
        their order; its links are None afterwards and num_free_blocks drops by 1. The time must not grow with
        the queue: 2,000 removes from a 200,000-block queue take well under 0.25 s, so no search or walk.
        A removed block can be appended again later. Precondition: `block` is in the queue (the pool removes
        only queued blocks); a block outside it (both links None) is the caller's bug, which the engine's queue
        refuses with ValueError and yours is not graded on. (vLLM 0.33: FreeKVCacheBlockQueue.remove; BlockPool calls
        it when a prefix-cache hit takes a free cached block out of the middle of the queue.)
        Example: on [0, 1, 2, 3, 4, 5], remove(block 3) leaves [0, 1, 2, 4, 5], num_free_blocks 5, and block
        3's prev_free_block and next_free_block None.
        """
        raise NotImplementedError

    def append(self, block: KVCacheBlock) -> None:
        """Task 05.2: put one block at the tail (evicted last).

        Contract: `block` (outside the queue) becomes the last block, linked both ways; num_free_blocks grows
        by 1. (vLLM 0.33: FreeKVCacheBlockQueue.append.)
        Example: on [3, 4, 5], append(block 1) gives [3, 4, 5, 1].
        """
        raise NotImplementedError

    def append_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Task 05.2: put blocks at the tail, keeping their order.

        Contract: the blocks (outside the queue) follow the old last block in the given order, blocks[-1]
        becoming the new tail; num_free_blocks grows by len(blocks); append_n([]) changes nothing.
        (vLLM 0.33: FreeKVCacheBlockQueue.append_n.)
        Example: on [3, 4, 5], append_n([block 0, block 2]) gives [3, 4, 5, 0, 2] with num_free_blocks 5.
        """
        raise NotImplementedError

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Task 05.4: put blocks at the head, keeping their order (blocks[0] becomes the new head).

        Contract: the blocks (outside the queue) come before the old head in the given order, so they are
        handed out first, blocks[0] first; num_free_blocks grows by len(blocks); prepend_n([]) changes
        nothing. (vLLM 0.33: FreeKVCacheBlockQueue.prepend_n. Which freed blocks the pool sends to which end is
        chapter 06's design problem.)
        Example: on [4, 5], prepend_n([block 3, block 1]) gives [3, 1, 4, 5], and popleft() then returns
        block 3.
        """
        raise NotImplementedError

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """Task 05.1: the blocks from head to tail, sentinels excluded.

        Contract: a new list of the blocks in the queue, head first, as many as num_free_blocks; the queue is
        left as it was; an empty queue gives []. (vLLM 0.33: FreeKVCacheBlockQueue.get_all_free_blocks.)
        Example: after remove(block 3) on a new queue of blocks 0..5 it returns blocks [0, 1, 2, 4, 5].
        """
        raise NotImplementedError
