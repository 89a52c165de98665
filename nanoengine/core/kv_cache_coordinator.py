"""A hybrid model's KV cache: one manager per group, and the hit every group can serve
(vllm/v1/core/kv_cache_coordinator.py, and the hybrid path of vllm/v1/core/kv_cache_manager.py).

Models with one group keep KVCacheManager, which folds all of this into one list per request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .block_pool import BlockPool
from nanoengine.kv_cache_interface import KVCacheGroupSpec
from .kv_cache_manager import KVCacheManager
from .kv_cache_utils import BlockHash, KVCacheBlock
from .single_type_kv_cache_manager import FullAttentionManager, SingleTypeKVCacheManager, SlidingWindowManager

if TYPE_CHECKING:
    from nanoengine.request import Request


@dataclass(slots=True)
class KVCacheBlocks:
    """One list of blocks per KV cache group (vLLM's KVCacheBlocks). len() is the blocks per group,
    the same in every group: a group whose window has moved on holds null blocks there."""

    blocks: tuple[list[KVCacheBlock], ...]

    def __len__(self) -> int:
        return len(self.blocks[0])

    def get_block_ids(self) -> tuple[list[int], ...]:
        return tuple([block.block_id for block in group] for group in self.blocks)


# A request's block ids as the scheduler sends them: one list, or one list per KV cache group (hybrid models).
BlockIds = list[int] | tuple[list[int], ...]


def block_ids_per_group(block_ids: BlockIds) -> tuple[list[int], ...]:
    """One list per group whatever the manager gave: KVCacheManager's one list is group 0's."""
    return block_ids if isinstance(block_ids, tuple) else (block_ids,)


def get_block_ids(blocks: Sequence[KVCacheBlock] | KVCacheBlocks) -> BlockIds:
    """Block ids as the model runner takes them: a list for one group, one list per group for several."""
    if isinstance(blocks, KVCacheBlocks):
        return blocks.get_block_ids()
    return [block.block_id for block in blocks]


class HybridKVCacheCoordinator:
    """The groups' managers, and the longest prefix hit all of them can serve.

    Groups with the same window form one attention type and are searched together. Full attention
    goes first: its left-to-right walk is cheap, and any prefix of its hit is a hit, so later types
    only need to shorten it. A sliding hit is not downward closed (a shorter hit needs its own
    window of cached blocks), so after a type shortens the length every type checks again, until no
    type shortens it: a fixed point. All groups share one block size here, so a hit in whole blocks
    suits every group (vLLM aligns hits to the lcm of the groups' block sizes).

    With use_eagle each type searches one block past the candidate length, up to the request's last full
    block, and its manager drops the last hit block, as vLLM 0.33's coordinator does: a type never returns
    more than the candidate, so the fixed point cannot spiral down a block per round (vLLM issue #32802),
    full attention plus a window loses one block, not two, and a block-aligned prompt loses none beyond the
    one the last-token rule gives back. vLLM skips the drop for a type already checked at the current length;
    here every round searches the same way, which differs only for two or more sliding types.
    """

    def __init__(self, groups: Sequence[KVCacheGroupSpec], block_pool: BlockPool, block_size: int,
                 use_eagle: bool = False,
                 sliding_window_manager_cls: type[SlidingWindowManager] = SlidingWindowManager) -> None:
        self.block_size = block_size
        self.use_eagle = use_eagle
        self.managers: list[SingleTypeKVCacheManager] = [
            (FullAttentionManager if g.sliding_window is None else sliding_window_manager_cls)(
                g, block_pool, block_size, group_id, use_eagle)
            for group_id, g in enumerate(groups)
        ]
        by_window: dict[int | None, list[int]] = {}
        for group_id, g in enumerate(groups):
            by_window.setdefault(g.sliding_window, []).append(group_id)
        self.attention_groups = sorted(by_window.items(), key=lambda item: item[0] is not None)
        # With at most one type besides full attention, one round already agrees (the last type searched
        # within everyone else's hit): vLLM stops there too.
        self.one_pass = sum(w is not None for w, _ in self.attention_groups) <= 1

    def find_longest_cache_hit(self, block_hashes: list[BlockHash],
                               max_length: int) -> tuple[KVCacheBlocks, int]:
        hits: list[list[KVCacheBlock]] = [[] for _ in self.managers]
        hit_length = max_length
        searched_full = False
        while True:
            length = hit_length
            for window, group_ids in self.attention_groups:
                if window is None and searched_full:
                    continue  # any prefix of a full-attention hit is a hit: its first search serves
                # EAGLE's managers drop the last hit block: one block more to search keeps the candidate reachable.
                # As in vLLM 0.33, that block may be any full block the request has, past max_length too: a
                # block-aligned prompt, whose last block the last-token rule already gave back, loses no more.
                limit = min(length + self.block_size, len(block_hashes) * self.block_size) if self.use_eagle else length
                found = self.managers[group_ids[0]].find_longest_cache_hit(block_hashes, limit, group_ids)
                searched_full |= window is None
                length = len(found[0]) * self.block_size
                for group_id, blocks in zip(group_ids, found):
                    hits[group_id] = blocks
            converged = length == hit_length or self.one_pass
            hit_length = length
            if converged:
                break
        num_blocks = hit_length // self.block_size
        return KVCacheBlocks(tuple(blocks[:num_blocks] for blocks in hits)), num_blocks * self.block_size


class HybridKVCacheManager(KVCacheManager):
    """KVCacheManager for a model with sliding-window layers: every call goes to each KV cache group.

    Hits, new blocks and block ids come as one list per group (KVCacheBlocks, tuples of id lists).
    req_to_blocks and num_cached_block are group 0's (full attention when the model has it), so a
    view written for one group shows the full-attention layers. The pool must be nanoengine's
    BlockPool, which names a block by hash and group id. A sliding group's list keeps its length but
    not its entries: those behind the window become the null block (the runner's append-only table
    keeps the old ids, which no kernel reads again).
    """

    def __init__(self, block_size: int, block_pool: BlockPool, groups: Sequence[KVCacheGroupSpec],
                 log_stats: bool = True, use_eagle: bool = False,
                 sliding_window_manager_cls: type[SlidingWindowManager] = SlidingWindowManager) -> None:
        super().__init__(block_size, block_pool, log_stats=log_stats)
        self.groups = list(groups)
        self.coordinator = HybridKVCacheCoordinator(groups, block_pool, block_size, use_eagle,
                                                    sliding_window_manager_cls)
        self.managers = self.coordinator.managers
        self.req_to_blocks = self.managers[0].req_to_blocks
        self.num_cached_block = self.managers[0].num_cached_block

    def _find_longest_cache_hit(self, request: Request, max_num_blocks: int) -> KVCacheBlocks:
        return self.coordinator.find_longest_cache_hit(request.block_hashes, max_num_blocks * self.block_size)[0]

    def get_num_blocks_to_allocate(self, request: Request, num_tokens: int,
                                   new_computed_blocks: KVCacheBlocks | tuple | list) -> int:
        """The sum over groups; a sliding group counts no block for tokens already out of its window."""
        hits = self._per_group(new_computed_blocks)
        num_computed = request.num_computed_tokens + len(hits[0]) * self.block_size
        return sum(m.get_num_blocks_to_allocate(request.request_id, num_tokens, h, num_computed)
                   for m, h in zip(self.managers, hits))

    def _per_group(self, blocks: KVCacheBlocks | tuple | list | None) -> tuple[list[KVCacheBlock], ...]:
        if isinstance(blocks, KVCacheBlocks):
            return blocks.blocks
        return blocks or tuple([] for _ in self.managers)

    def allocate_slots(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: KVCacheBlocks | None = None, num_lookahead_tokens: int = 0,
                       full_sequence_must_fit: bool = False) -> KVCacheBlocks | None:
        """KVCacheManager.allocate_slots in every group. Blocks that have left a window are freed
        first, so they can serve this step; if the pool still falls short, that is the only change."""
        self._check_allocation(request, num_new_tokens, num_new_computed_tokens, new_computed_blocks,
                               num_lookahead_tokens)
        request_id = request.request_id
        hits = self._per_group(new_computed_blocks)
        if full_sequence_must_fit and not self._fits(request, request.num_tokens, hits):
            return None
        num_computed = request.num_computed_tokens + num_new_computed_tokens
        for manager in self.managers:
            manager.remove_skipped_blocks(request_id, num_computed)
        num_tokens_need_slot = num_computed + num_new_tokens + num_lookahead_tokens
        if not self._fits(request, num_tokens_need_slot, hits):
            return None
        # Every group takes its hits before any group takes a new block: a hit that sits free in the
        # queue would otherwise be evicted by another group's new blocks and then written twice.
        for manager, group_hits in zip(self.managers, hits):
            manager.allocate_new_computed_blocks(request_id, group_hits, num_computed)
        new_blocks = [manager.allocate_new_blocks(request_id, num_tokens_need_slot) for manager in self.managers]
        if self.enable_caching:
            self.cache_blocks(request, min(num_computed + num_new_tokens, request.num_tokens))
        return KVCacheBlocks(tuple(new_blocks))

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        for manager in self.managers:
            manager.cache_blocks(request, num_computed_tokens)

    def free(self, request: Request) -> None:
        """Release every group's blocks, each group last block first. Freeing twice is a no-op."""
        for manager in self.managers:
            manager.free(request.request_id)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return KVCacheBlocks(tuple(m.req_to_blocks.get(request_id, []) for m in self.managers))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return self.get_blocks(request_id).get_block_ids()
