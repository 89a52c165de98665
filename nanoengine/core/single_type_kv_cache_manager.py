"""The blocks of one KV cache group, by attention type (vllm/v1/core/single_type_kv_cache_manager.py).

The coordinator holds one of these per KV cache group: FullAttentionManager for full-attention
layers, SlidingWindowManager for sliding ones. All draw from the one pool every group shares, and
name their blocks by hash and group id (group 0's by the hash alone, see make_block_hash_with_group_id).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice
from typing import TYPE_CHECKING

from nanoengine.kv_cache_interface import KVCacheGroupSpec

from .block_pool import BlockPoolInterface
from .kv_cache_utils import BlockHash, KVCacheBlock

if TYPE_CHECKING:
    from nanoengine.request import Request


class SingleTypeKVCacheManager:
    """Each request's blocks in one group.

    Invariants: req_to_blocks[r][i] holds tokens i * block_size .. (i + 1) * block_size - 1 of request
    r, or is the null block once no future query can see those tokens; every group of a request holds
    the same number of entries; the first num_cached_block[r] entries are cached or null.
    """

    def __init__(
        self,
        spec: KVCacheGroupSpec,
        block_pool: BlockPoolInterface,
        block_size: int,
        kv_cache_group_id: int,
        use_eagle: bool = False,
    ) -> None:
        self.spec = spec
        self.block_pool = block_pool
        self.block_size = block_size
        self.kv_cache_group_id = kv_cache_group_id
        self.use_eagle = use_eagle
        self.null_block = block_pool.null_block
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[str, int] = {}
        # The most blocks admission reserves for one request in this group (vLLM's max_admission_blocks_per_request):
        # None for full attention, set by the coordinator for a sliding group that knows its max_model_len.
        self.max_admission_blocks_per_request: int | None = None

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Leading tokens that no query from num_computed_tokens on can see (none, for full attention)."""
        return 0

    def get_num_blocks_to_allocate(
        self, request_id: str, num_tokens: int, new_computed_blocks: Sequence[KVCacheBlock], num_computed_tokens: int
    ) -> int:
        """Free blocks this group needs so that the request has slots for num_tokens tokens.

        A hit on a free cached block leaves the free queue when taken, so it counts like a new
        block; hits already outside the window are not taken at all.
        """
        num_required = -(-num_tokens // self.block_size)
        num_held = len(self.req_to_blocks.get(request_id, ()))
        if request_id in self.num_cached_block:  # running: no new hits
            return max(num_required - num_held, 0)
        num_skipped = self.get_num_skipped_tokens(num_computed_tokens) // self.block_size
        kept_hits = new_computed_blocks[num_skipped:]
        num_new = max(num_required - len(new_computed_blocks), 0)  # the hits' slots, nulls included
        return num_new + sum(b.ref_cnt == 0 and not b.is_null for b in kept_hits)

    def allocate_new_computed_blocks(
        self, request_id: str, new_computed_blocks: Sequence[KVCacheBlock], num_computed_tokens: int
    ) -> None:
        """Take an admitted request's hits: null blocks where the window has already moved on."""
        if request_id in self.num_cached_block:
            return
        num_skipped = self.get_num_skipped_tokens(num_computed_tokens) // self.block_size
        kept = new_computed_blocks[num_skipped:]
        self.block_pool.touch(kept)
        self.req_to_blocks[request_id] = [self.null_block] * num_skipped + list(kept)
        self.num_cached_block[request_id] = num_skipped + len(kept)

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        req_blocks = self.req_to_blocks.setdefault(request_id, [])
        new_blocks = self.block_pool.get_new_blocks(max(-(-num_tokens // self.block_size) - len(req_blocks), 0))
        req_blocks.extend(new_blocks)
        return new_blocks

    def cache_blocks(
        self,
        request: Request,
        num_tokens: int,
        retention_interval: int | None = None,
        replay_boundaries: Sequence[int] = (),
    ) -> None:
        """Cache the request's blocks that the first num_tokens fill, those reachable_block_mask keeps: every one
        for full attention. retention_interval and replay_boundaries are the coordinator's (see
        SlidingWindowManager.reachable_block_mask); request.shared_prefix_boundary, a junction found at admission,
        is kept too. A block left out is never cached: it goes back to the pool unnamed."""
        request_id = request.request_id
        num_cached, num_full = self.num_cached_block[request_id], num_tokens // self.block_size
        if num_cached >= num_full:
            return
        boundaries = list(replay_boundaries)
        if request.shared_prefix_boundary:
            boundaries.append(request.shared_prefix_boundary)
            if self.use_eagle:  # a sibling that parts right after the junction drops the block past it
                boundaries.append(request.shared_prefix_boundary - self.block_size)
        mask = self.reachable_block_mask(num_cached, num_full, retention_interval, boundaries)
        # One cache_full_blocks call per run of kept blocks, since the pool names a contiguous range.
        run_start = None
        for i in range(num_cached, num_full + 1):
            keep = i < num_full and (mask is None or mask[i - num_cached])
            if keep and run_start is None:
                run_start = i
            elif not keep and run_start is not None:
                self.block_pool.cache_full_blocks(
                    request,
                    self.req_to_blocks[request_id],
                    run_start,
                    i,
                    self.block_size,
                    kv_cache_group_id=self.kv_cache_group_id,
                )
                run_start = None
        self.num_cached_block[request_id] = num_full

    def reachable_block_mask(
        self, start_block: int, end_block: int, retention_interval: int | None, reachable_boundaries: Sequence[int]
    ) -> list[bool] | None:
        """Which of blocks start_block .. end_block - 1 a later prefix hit can use, so are worth caching (vLLM 0.33's
        reachable_block_mask); None: all of them, as for full attention, whose every prefix is a hit."""
        return None

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Free the blocks no query from num_computed_tokens on can see, and put the null block in
        their table slots. Nothing to do for full attention."""

    def free(self, request_id: str) -> None:
        """Release the request's blocks, last first, so a chain's root is evicted last. The record goes only
        once the pool has taken them back, so a pool that raises leaves them to be freed again."""
        self.block_pool.free_blocks(reversed(self.req_to_blocks.get(request_id, [])))
        self.req_to_blocks.pop(request_id, None)
        self.num_cached_block.pop(request_id, None)

    def get_cached_blocks(
        self, block_hash: BlockHash, group_ids: list[int], token_ids: Sequence[int] | None = None
    ) -> list[KVCacheBlock] | None:
        """The block cached under block_hash in each of group_ids, or None unless every group has one.
        token_ids, the block's tokens, are needed only by a pool that checks hash collisions."""
        blocks = []
        for group_id in group_ids:
            block = self.block_pool.get_cached_block(block_hash, token_ids, kv_cache_group_id=group_id)
            if block is None:
                return None
            blocks.append(block)
        return blocks

    def find_longest_cache_hit(
        self, block_hashes: list[BlockHash], max_length: int, group_ids: list[int]
    ) -> tuple[list[KVCacheBlock], ...]:
        """The longest hit of at most max_length tokens that every group in group_ids (all of this
        manager's attention type) can serve: one list of blocks per group, all the same length."""
        raise NotImplementedError


class FullAttentionManager(SingleTypeKVCacheManager):
    def find_longest_cache_hit(
        self,
        block_hashes: list[BlockHash],
        max_length: int,
        group_ids: list[int],
        token_ids: Sequence[int] | None = None,
    ) -> tuple[list[KVCacheBlock], ...]:
        """Walk from the left: a miss ends the hit, since every later hash chains through it. With
        use_eagle the last hit block is dropped, so its tokens are recomputed for EAGLE's draft head.
        token_ids (the request's) come only for a pool that checks hash collisions."""
        hits: tuple[list[KVCacheBlock], ...] = tuple([] for _ in group_ids)
        size = self.block_size
        for i, block_hash in enumerate(islice(block_hashes, max_length // size)):
            tokens = None if token_ids is None else token_ids[i * size : (i + 1) * size]
            blocks = self.get_cached_blocks(block_hash, group_ids, tokens)
            if blocks is None:
                break
            for hit, block in zip(hits, blocks):
                hit.append(block)
        if self.use_eagle and hits[0]:
            for hit in hits:
                hit.pop()
        return hits


class SlidingWindowManager(SingleTypeKVCacheManager):
    """A query at position p sees keys p - W + 1 .. p, so while it decodes a token a step a request holds at
    most the blocks one query's window touches, and the one being written, however long it grows (a prefill
    chunk holds its own blocks too, until the next step frees those behind the window)."""

    def __init__(
        self,
        spec: KVCacheGroupSpec,
        block_pool: BlockPoolInterface,
        block_size: int,
        kv_cache_group_id: int,
        use_eagle: bool = False,
    ) -> None:
        super().__init__(spec, block_pool, block_size, kv_cache_group_id, use_eagle)
        assert spec.sliding_window is not None, "a sliding-window manager serves a group with a window"
        self.sliding_window: int = spec.sliding_window

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        # The next query is at position num_computed_tokens; it sees from num_computed_tokens - W + 1.
        return max(0, num_computed_tokens - self.sliding_window + 1)

    def contiguous_blocks_for_hit(self) -> int:
        """Cached blocks a hit must end on: those holding the W - 1 keys before the next query, and with use_eagle
        the block EAGLE drops after matching it (vLLM's _contiguous_blocks_for_hit)."""
        return -(-(self.sliding_window - 1) // self.block_size) + self.use_eagle

    def reachable_block_mask(
        self, start_block: int, end_block: int, retention_interval: int | None, reachable_boundaries: Sequence[int]
    ) -> list[bool] | None:
        """A sliding hit needs only the contiguous_blocks_for_hit() blocks that end where it ends, so a block is kept
        only if it is among those before a boundary a later hit can stop at (vLLM 0.33's
        SlidingWindowManager.reachable_block_mask, hits aligned to the block size):
        - retention_interval None (dense): every block boundary, so every block, except at W = 1 without EAGLE,
          where a hit needs no block before its end and none is kept;
        - 0 (vLLM 0.33's default): only reachable_boundaries, the positions a later request can resume at (a resend
          of the prompt, capped at num_prompt_tokens - 1) and the shared-prefix junction found at admission;
        - a positive multiple of the block size: reachable_boundaries and one boundary per interval.
        With use_eagle the run ends one block past a boundary (the block EAGLE matches, then drops)."""
        need, shift = self.contiguous_blocks_for_hit(), int(self.use_eagle)
        mask = [False] * (end_block - start_block)
        segment = self.block_size if retention_interval is None else retention_interval or None
        if segment is not None:
            per_segment = segment // self.block_size
            if need >= per_segment:
                return None
            for i in range(max(start_block, shift), end_block):
                mask[i - start_block] = (i - shift) % per_segment >= per_segment - need
        if retention_interval is not None:
            for boundary in reachable_boundaries:
                end = boundary // self.block_size + shift
                for j in range(max(start_block, end - need), min(end_block, end)):
                    mask[j - start_block] = True
        return mask

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Give back every held block whose tokens no query from num_computed_tokens on can see, one
        reference each and never twice, and put the null block in its table slot (a request with no table
        is left alone). Of the blocks one call gives back, the one nearest the window leaves the free
        queue first, among those the pool queues at its head (never cached) as among those at its tail,
        as free() orders a finished request's: a chain's earlier blocks stay cached longest."""
        blocks = self.req_to_blocks.get(request_id, [])
        num_skipped = min(self.get_num_skipped_tokens(num_computed_tokens) // self.block_size, len(blocks))
        removed = []
        for i in range(num_skipped - 1, -1, -1):
            if blocks[i] is self.null_block:  # an earlier call nulled this one and all before it
                break
            removed.append(blocks[i])
            blocks[i] = self.null_block
        self.block_pool.free_blocks(removed)

    def find_longest_cache_hit(
        self, block_hashes: list[BlockHash], max_length: int, group_ids: list[int]
    ) -> tuple[list[KVCacheBlock], ...]:
        """The longest hit a window can serve, of at most max_length tokens in whole blocks: its blocks
        hold every earlier token that the next query, at the hit's end, can see, and its last block is cached
        even at W = 1 (null blocks alone are no hit). One list per group, all of one length: the group's
        cached block of block_hashes[i] at those entries, the null block before them. With use_eagle it is
        the hit a window block_size tokens longer would get, less its last block (recomputed for EAGLE's
        draft head), so it ends on the blocks the window of W needs: none at W = 1, where it may end on a
        null entry. A lookup only: no reference, queue or map changes."""
        num_needed = self.contiguous_blocks_for_hit()
        num_blocks = max_length // self.block_size
        hits = tuple([self.null_block] * num_blocks for _ in group_ids)
        run = 0
        for i in range(num_blocks - 1, -1, -1):
            blocks = self.get_cached_blocks(block_hashes[i], group_ids)
            if blocks is None:
                run = 0
                continue
            for hit, block in zip(hits, blocks):
                hit[i] = block
            run += 1
            if run >= num_needed:
                end = i + run
                break
        else:
            end = run  # only a run starting at block 0 (or none) is left
        for hit in hits:
            del hit[end:]
        if self.use_eagle and hits[0]:
            for hit in hits:
                hit.pop()
        return hits
