"""The pool of KV blocks and the prefix-cache map, as in vllm/v1/core/block_pool.py."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .kv_cache_utils import (
    BlockHash,
    FreeBlockQueue,
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    make_block_hash_with_group_id,
)
from .kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent

if TYPE_CHECKING:
    from nanoengine.request import Request


class BlockHashToBlockMap:
    """block_hash -> {block_id: block}.

    Blocks are named when they are allocated, so a request admitted after
    another with the same prefix (even in the same step) hits the first one's
    blocks. Copies still arise when identical prompts are prefilled side by
    side in chunks: each allocates its next block before the other's is
    named. Keeping every copy under one hash lets block tables stay
    append-only (no request is switched to the other copy), and evicting one
    copy removes only its own entry.
    """

    __slots__ = ("_cache",)

    def __init__(self) -> None:
        self._cache: dict[BlockHash, dict[int, KVCacheBlock]] = {}

    def get_one_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        blocks = self._cache.get(block_hash)
        return next(iter(blocks.values())) if blocks else None

    def get_blocks(self, block_hash: BlockHash) -> Iterable[KVCacheBlock]:
        blocks = self._cache.get(block_hash)
        return blocks.values() if blocks else ()

    def insert(self, block_hash: BlockHash, block: KVCacheBlock) -> None:
        blocks = self._cache.get(block_hash)
        if blocks is None:
            self._cache[block_hash] = {block.block_id: block}
        else:
            blocks[block.block_id] = block

    def pop(self, block_hash: BlockHash, block_id: int) -> KVCacheBlock | None:
        blocks = self._cache.get(block_hash)
        if blocks is None:
            return None
        block = blocks.pop(block_id, None)
        if not blocks:
            del self._cache[block_hash]
        return block

    def items(self) -> Iterator[tuple[BlockHash, KVCacheBlock]]:
        """Every (hash, block) entry, duplicates included."""
        for block_hash, blocks in self._cache.items():
            for block in blocks.values():
                yield block_hash, block

    def __len__(self) -> int:
        return len(self._cache)


@runtime_checkable
class BlockPoolInterface(Protocol):
    """Every pool operation the KV cache managers and the engine call.

    find (get_cached_block), touch, cache (cache_full_blocks), free (free_blocks) and evict (lazily,
    inside get_new_blocks); BlockPool below is the engine's and states the invariants every
    implementation keeps. KVCacheManager(block_size, pool) and LLM(block_pool=factory) take any.
    Every KV cache group shares the pool: find and cache name a block by its hash and the group's
    id (make_block_hash_with_group_id), so a pool that does serves models with sliding windows too.
    After a failed step the engine evicts the blocks whose KV it never wrote (evict_blocks), and once no
    request holds a block, puts back any block an interrupted operation lost (recover_free_blocks).
    A pool of one's own may subclass BlockPool and override only what it changes.
    """

    num_gpu_blocks: int
    enable_caching: bool
    null_block: KVCacheBlock
    blocks: list[KVCacheBlock]
    free_block_queue: FreeBlockQueue
    # block_id -> token ids when hash collisions are checked, else None.
    cached_token_ids: dict[int, tuple[int, ...]] | None
    # The tokens each block hash covers (None: the block size); KVCacheManager refuses any other than its block size.
    hash_block_size: int | None

    def get_cached_block(
        self, block_hash: BlockHash, token_ids: Sequence[int] | None = None, kv_cache_group_id: int = 0
    ) -> KVCacheBlock | None: ...
    def touch(self, blocks: Iterable[KVCacheBlock]) -> None: ...
    def cache_full_blocks(
        self,
        request: Request,
        blocks: Sequence[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int = 0,
    ) -> None: ...
    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None: ...
    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]: ...
    def get_num_free_blocks(self) -> int: ...
    def get_usage(self) -> float: ...
    def reset_prefix_cache(self) -> bool: ...
    def take_events(self) -> list[KVCacheEvent]: ...
    def evict_blocks(self, block_ids: Iterable[int]) -> None: ...
    def recover_free_blocks(self) -> int: ...


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Hold off the cyclic garbage collector while a pool's blocks are made. A default CPU pool for a small
    model has hundreds of thousands of blocks, and each allocation batch set off a collection over the whole
    heap (torch's and the caller's objects): 4 s to build 524,288 blocks, 0.3 s with collection held off.
    None of them is garbage, so nothing is lost."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class BlockPool:
    """All KV blocks, their free queue and the prefix cache; a hybrid model's KV cache groups share them.

    Invariants (the stateful test checks each):
    - Block 0 is the null block: never in the free queue, ref_cnt untracked.
    - A non-null block is in the free queue iff its ref_cnt is 0, so the free
      queue holds both never-cached blocks and cached blocks nobody uses.
    - A block has a hash iff the map holds it under that hash.
    - Eviction is lazy: a cached free block stays findable until
      get_new_blocks pops it, and only then loses its hash (LRU from the head).

    vLLM can serve groups whose block size is a multiple of hash_block_size;
    here the two must be equal, and cache_full_blocks checks it.

    With check_hash_collisions the pool also keeps each cached block's token
    ids, and a lookup whose tokens differ from the stored ones is a miss.
    """

    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool,
        hash_block_size: int | None = None,
        enable_kv_cache_events: bool = False,
        *,
        check_hash_collisions: bool = False,
        free_queue_cls: type[FreeBlockQueue] = FreeKVCacheBlockQueue,
    ) -> None:
        if num_gpu_blocks < 1:
            raise ValueError(f"num_gpu_blocks must be at least 1 (block 0 is the null block), got {num_gpu_blocks}.")
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        # Tokens per entry of request.block_hashes; None trusts every caller.
        self.hash_block_size = hash_block_size
        with _gc_paused():
            self.blocks = [KVCacheBlock(block_id=i) for i in range(num_gpu_blocks)]
            # Any FreeBlockQueue implementation (free_queue_cls) can back the pool.
            self.free_block_queue = free_queue_cls(self.blocks)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        self.enable_kv_cache_events = enable_kv_cache_events
        self.kv_event_queue: list[KVCacheEvent] = []
        # block_id -> token ids, only when collisions are checked.
        self.cached_token_ids: dict[int, tuple[int, ...]] | None = {} if check_hash_collisions else None
        self.num_collisions = 0

    def get_cached_block(
        self,
        block_hash: BlockHash,
        token_ids: Sequence[int] | None = None,
        kv_cache_group_id: int = 0,
    ) -> KVCacheBlock | None:
        """A block cached under block_hash, or None. Does not touch it.

        token_ids are required when collisions are checked: a block counts
        only if it was cached with exactly these tokens. Each KV cache group's
        manager passes its kv_cache_group_id (see make_block_hash_with_group_id).
        """
        block_hash = make_block_hash_with_group_id(block_hash, kv_cache_group_id)
        if self.cached_token_ids is None:
            return self.cached_block_hash_to_block.get_one_block(block_hash)
        if token_ids is None:
            raise ValueError("This pool checks hash collisions: pass the block's token ids to get_cached_block.")
        blocks = self.cached_block_hash_to_block.get_blocks(block_hash)
        wanted = tuple(token_ids)
        for block in blocks:
            if self.cached_token_ids[block.block_id] == wanted:
                return block
        if blocks:
            self.num_collisions += 1
        return None

    def cache_full_blocks(
        self,
        request: Request,
        blocks: Sequence[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int = 0,
    ) -> None:
        """Name blocks[num_cached_blocks:num_full_blocks] by the request's hashes.

        The blocks must be full and unhashed, and request.block_hashes must
        cover them (the request's block hasher runs as tokens are appended).
        The blocks are named by hash and kv_cache_group_id, and so are their
        events (group 0 by the bare hash).
        """
        if num_cached_blocks >= num_full_blocks:
            return
        new_blocks = blocks[num_cached_blocks:num_full_blocks]
        new_hashes = request.block_hashes[num_cached_blocks:num_full_blocks]
        self._check_cacheable(request, new_blocks, new_hashes, num_cached_blocks, num_full_blocks, block_size)
        parent = request.block_hashes[num_cached_blocks - 1] if num_cached_blocks else None
        new_hashes = [make_block_hash_with_group_id(h, kv_cache_group_id) for h in new_hashes]
        parent = parent and make_block_hash_with_group_id(parent, kv_cache_group_id)
        insert = self.cached_block_hash_to_block.insert
        for block, block_hash in zip(new_blocks, new_hashes):
            block._block_hash = block_hash
            insert(block_hash, block)
        if self.cached_token_ids is None and not self.enable_kv_cache_events:
            return
        token_ids = request.all_token_ids[num_cached_blocks * block_size : num_full_blocks * block_size]
        if self.cached_token_ids is not None:
            for i, block in enumerate(new_blocks):
                self.cached_token_ids[block.block_id] = tuple(token_ids[i * block_size : (i + 1) * block_size])
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(
                BlockStored(
                    block_hashes=list(new_hashes),
                    parent_block_hash=parent,
                    token_ids=list(token_ids),
                    block_size=block_size,
                    lora_name=request.lora_name,
                )
            )

    def _check_cacheable(
        self,
        request: Request,
        new_blocks: Sequence[KVCacheBlock],
        new_hashes: Sequence[BlockHash],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
    ) -> None:
        # Checked before any change so that a bad call leaves the pool intact.
        if self.hash_block_size not in (None, block_size):
            raise ValueError(
                f"block_size {block_size} differs from the pool's hash_block_size "
                f"{self.hash_block_size}; hash requests with the pool's block size."
            )
        num_new = num_full_blocks - num_cached_blocks
        if len(new_blocks) != num_new:
            raise ValueError(
                f"Cannot cache blocks {num_cached_blocks}..{num_full_blocks - 1}: "
                f"the request holds only {num_cached_blocks + len(new_blocks)} "
                "blocks. Allocate the blocks before caching them."
            )
        if len(new_hashes) != num_new:
            raise ValueError(
                f"Cannot cache {num_full_blocks} full blocks: request "
                f"{request.request_id!r} has only {len(request.block_hashes)} "
                "block hashes. Give it a block hasher so that its full blocks "
                "are hashed as tokens arrive."
            )
        for block in new_blocks:
            if block.block_hash is not None:
                raise ValueError(
                    f"Block {block.block_id} is already cached; count it in "
                    "num_cached_blocks instead of caching it again."
                )

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop num_blocks from the head of the free queue, ref_cnt 1 each.

        A popped block that is still cached is evicted now (lazy LRU): its
        map entry goes, and a BlockRemoved event is queued if enabled.
        """
        ret = self.free_block_queue.popleft_n(num_blocks)
        if self.enable_caching:
            for block in ret:
                if block._block_hash is not None:
                    self._evict_cached_block(block)
                block.ref_cnt += 1
        else:
            for block in ret:
                block.ref_cnt += 1
        return ret

    def _evict_cached_block(self, block: KVCacheBlock) -> None:
        block_hash = block._block_hash
        assert block_hash is not None, "only a cached block is evicted: every caller checks its hash first"
        self.cached_block_hash_to_block.pop(block_hash, block.block_id)
        block.reset_hash()
        if self.cached_token_ids is not None:
            del self.cached_token_ids[block.block_id]
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(BlockRemoved(block_hashes=[block_hash]))

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Take these blocks out of the prefix cache, wherever they are (vLLM's BlockPool.evict_blocks, for
        blocks whose KV turned out invalid). A held block stays held and a free one stays in its place in
        the free queue: each only loses its hash, so no later lookup finds it."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block._block_hash is not None:
                self._evict_cached_block(block)

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on each block, rescuing free ones from eviction."""
        remove = self.free_block_queue.remove
        for block in blocks:
            if block.ref_cnt == 0:
                if block.is_null:
                    continue
                remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference on each block; blocks reaching 0 become free.

        Pass a request's blocks in reverse order. Unhashed blocks go to the
        head (their content is worthless, reuse them first); cached ones go to
        the tail in the given order, so a chain's last block is evicted before
        its root. A block listed twice drops two references and is queued once,
        when it reaches 0. Dropping a reference a block does not have raises
        ValueError and nothing changes; so does a free queue that raises.
        """
        blocks = [block for block in ordered_blocks if not block.is_null]
        unhashed: list[KVCacheBlock] = []
        hashed: list[KVCacheBlock] = []
        # One pass: a block reaches 0 exactly once, so it is queued exactly once.
        for i, block in enumerate(blocks):
            ref_cnt = block.ref_cnt = block.ref_cnt - 1
            if ref_cnt == 0:
                (unhashed if block._block_hash is None else hashed).append(block)
            elif ref_cnt < 0:
                for b in blocks[: i + 1]:
                    b.ref_cnt += 1
                raise ValueError(
                    f"Double free: block {block.block_id} has no reference left "
                    "to drop. Free each request's blocks once, via "
                    "KVCacheManager.free(request)."
                )
        queue, queued = self.free_block_queue, []
        try:
            queue.prepend_n(unhashed)
            queued = unhashed
            queue.append_n(hashed)
        except BaseException:
            # A queue that raised (one's own, or an interrupt): undo, so the caller may free them again.
            for block in queued:
                queue.remove(block)
            for block in blocks:
                block.ref_cnt += 1
            raise

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash, e.g. after a weight update.

        Refused (False, nothing changed) while any request holds a block,
        since its KV would then outlive the reset unnoticed.
        """
        if self.get_num_free_blocks() != self.num_gpu_blocks - 1:
            return False
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        for block in self.blocks:
            block.reset_hash()
        if self.cached_token_ids is not None:
            self.cached_token_ids.clear()
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(AllBlocksCleared())
        return True

    def recover_free_blocks(self) -> int:
        """For the engine after an aborted call, when no request holds a block: put back every non-null
        block that an operation cut short (a free queue of one's own that raised mid-way, an interrupt)
        left outside the free queue or with a reference, and return how many. They go to the head
        unhashed, since the KV of a block lost mid-operation cannot be trusted. A whole pool is untouched."""
        if self.get_num_free_blocks() == self.num_gpu_blocks - 1 and not any(b.ref_cnt for b in self.blocks[1:]):
            return 0
        queued = {b.block_id for b in self.free_block_queue.get_all_free_blocks()}
        lost = [b for b in self.blocks[1:] if b.block_id not in queued]
        for block in self.blocks[1:]:
            block.ref_cnt = 0
        for block in lost:
            if block._block_hash is not None:
                self._evict_cached_block(block)
        self.free_block_queue.prepend_n(lost)
        return len(lost)

    def get_num_free_blocks(self) -> int:
        """Blocks with ref_cnt 0, cached ones included (they are evictable)."""
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """Fraction of the usable blocks (all but the null block) in use."""
        total = self.num_gpu_blocks - 1
        return 1.0 - self.get_num_free_blocks() / total if total else 0.0

    def take_events(self) -> list[KVCacheEvent]:
        """The queued KV events, oldest first; the queue is emptied."""
        events, self.kv_event_queue = self.kv_event_queue, []
        return events
