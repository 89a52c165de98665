"""One manager per KV cache group, and the longest prefix hit all of them can serve
(vllm/v1/core/kv_cache_coordinator.py).

KVCacheManager always goes through a coordinator, as vLLM's does: UnitaryKVCacheCoordinator for a model with
one group (every layer full attention, or every layer one window), HybridKVCacheCoordinator for several.
Coordinators speak in tuples with one list of blocks per group; KVCacheManager wraps them in KVCacheBlocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from nanoengine.kv_cache_interface import KVCacheGroupSpec

from .block_pool import BlockPoolInterface
from .kv_cache_utils import BlockHash, KVCacheBlock
from .single_type_kv_cache_manager import FullAttentionManager, SingleTypeKVCacheManager, SlidingWindowManager

if TYPE_CHECKING:
    from nanoengine.request import Request

BlocksPerGroup = tuple[Sequence[KVCacheBlock], ...]


def replay_boundaries(num_prompt_tokens: int, block_size: int, use_eagle: bool) -> tuple[int, ...]:
    """Where a later request replaying a prompt can resume (vLLM 0.33's function of the same name): a resend of the
    same prompt hits at most num_prompt_tokens - 1 tokens. With EAGLE, the hits of a resend and of a longer sibling
    (the prompt's last full block), each one block lower, since EAGLE drops the last block it matches."""
    if not use_eagle:
        return (num_prompt_tokens - 1,)
    resend = (num_prompt_tokens - 1) // block_size * block_size
    extension = num_prompt_tokens // block_size * block_size
    return tuple(sorted({max(resend - block_size, 0), max(extension - block_size, 0)}))


class KVCacheCoordinator:
    """The groups' managers over one shared pool: each call goes to every group in group order.

    Invariant: every group holds the same number of entries for a request (a sliding group's entries behind
    its window are the null block), so one token count names the same blocks in every group.
    """

    def __init__(
        self,
        groups: Sequence[KVCacheGroupSpec],
        block_pool: BlockPoolInterface,
        block_size: int,
        use_eagle: bool = False,
        full_attention_manager_cls: type[FullAttentionManager] = FullAttentionManager,
        sliding_window_manager_cls: type[SlidingWindowManager] = SlidingWindowManager,
        prefix_cache_retention_interval: int | None = 0,
        max_model_len: int | None = None,
        max_in_flight_tokens: int | None = None,
    ) -> None:
        """use_eagle: a prefix hit drops its last block for an EAGLE drafter, in the groups of eagle_group_ids only.
        prefix_cache_retention_interval: which sliding blocks are cached (SlidingWindowManager.reachable_block_mask).
        max_model_len and max_in_flight_tokens (default: max_model_len) set each sliding group's admission cap
        (KVCacheGroupSpec.max_admission_blocks_per_request); without max_model_len there is none."""
        self.block_pool = block_pool
        self.block_size = block_size
        self.use_eagle = use_eagle
        self.retention_interval = prefix_cache_retention_interval
        self.eagle_group_ids = self.drop_eagle_group_ids(groups) if use_eagle else set()
        self.single_type_managers: tuple[SingleTypeKVCacheManager, ...] = tuple(
            (full_attention_manager_cls if g.sliding_window is None else sliding_window_manager_cls)(
                g, block_pool, block_size, group_id, group_id in self.eagle_group_ids
            )
            for group_id, g in enumerate(groups)
        )
        if max_model_len is not None:
            in_flight = max_model_len if max_in_flight_tokens is None else max_in_flight_tokens
            for manager, g in zip(self.single_type_managers, groups):
                if g.sliding_window is not None:
                    manager.max_admission_blocks_per_request = g.max_admission_blocks_per_request(
                        block_size, in_flight, max_model_len
                    )

    def drop_eagle_group_ids(self, groups: Sequence[KVCacheGroupSpec]) -> set[int]:
        """The groups whose managers drop EAGLE's block, as vLLM 0.33's drop_eagle_group_ids: those holding the
        drafter's layers (KVCacheGroupSpec.is_eagle_group), or every group when none is flagged (vLLM's fallback
        for a layout that does not say where the drafter's layers are)."""
        return {group_id for group_id, g in enumerate(groups) if g.is_eagle_group} or set(range(len(groups)))

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: BlocksPerGroup,
        num_computed_tokens: int,
        apply_admission_cap: bool = False,
    ) -> int:
        """Free blocks the request needs in all groups together to have slots for num_tokens tokens. With
        apply_admission_cap (the full-sequence admission gate only) a sliding group needs slots for at most its
        max_admission_blocks_per_request blocks, as vLLM 0.33's get_num_blocks_to_allocate caps its required blocks:
        the window frees blocks as the prompt's chunks advance, so the group never holds more at once."""
        total = 0
        for m, hits in zip(self.single_type_managers, new_computed_blocks, strict=True):
            cap = m.max_admission_blocks_per_request
            # Capping the tokens caps ceil(tokens / block_size), the blocks required, at cap.
            tokens = min(num_tokens, cap * self.block_size) if apply_admission_cap and cap is not None else num_tokens
            total += m.get_num_blocks_to_allocate(request_id, tokens, hits, num_computed_tokens)
        return total

    def allocate_new_computed_blocks(
        self, request_id: str, new_computed_blocks: BlocksPerGroup, num_computed_tokens: int
    ) -> None:
        for manager, hits in zip(self.single_type_managers, new_computed_blocks, strict=True):
            manager.allocate_new_computed_blocks(request_id, hits, num_computed_tokens)

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> tuple[list[KVCacheBlock], ...]:
        return tuple(m.allocate_new_blocks(request_id, num_tokens) for m in self.single_type_managers)

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        boundaries = replay_boundaries(request.num_prompt_tokens, self.block_size, self.use_eagle)
        for manager in self.single_type_managers:
            manager.cache_blocks(
                request, num_computed_tokens, retention_interval=self.retention_interval, replay_boundaries=boundaries
            )

    def free(self, request_id: str) -> None:
        for manager in self.single_type_managers:
            manager.free(request_id)

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        for manager in self.single_type_managers:
            manager.remove_skipped_blocks(request_id, num_computed_tokens)

    def get_blocks(self, request_id: str) -> tuple[list[KVCacheBlock], ...]:
        return tuple(m.req_to_blocks.get(request_id, []) for m in self.single_type_managers)

    def find_longest_cache_hit(
        self, block_hashes: list[BlockHash], max_length: int, token_ids: Sequence[int] | None = None
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        """The longest hit of at most max_length tokens every group can serve: one list per group, and its
        length in tokens. token_ids, the request's, come only for a pool that checks hash collisions, which
        KVCacheManager allows for one full-attention group."""
        hits, hit_length, _ = self.find_longest_cache_hit_and_uncached_prefix(block_hashes, max_length, token_ids)
        return hits, hit_length

    def find_longest_cache_hit_and_uncached_prefix(
        self, block_hashes: list[BlockHash], max_length: int, token_ids: Sequence[int] | None = None
    ) -> tuple[tuple[list[KVCacheBlock], ...], int, int]:
        """find_longest_cache_hit's hit and length, and num_uncached_common_prefix_tokens: how many tokens past the
        hit one attention type alone could serve (a prefix shared with earlier requests that a sparse sliding group
        has not cached), 0 for one group. vLLM 0.33's find_longest_cache_hit returns these three."""
        raise NotImplementedError


class UnitaryKVCacheCoordinator(KVCacheCoordinator):
    """One group: its manager's hit is the hit. With use_eagle (the one group is flagged, or none is and the
    fallback flags it) the manager drops its last hit block within max_length, with no extra block to search, as
    vLLM 0.33's UnitaryKVCacheCoordinator: a block-aligned prompt, whose last block the last-token rule already
    gave back, loses one more (a hybrid layout's search margin spares it)."""

    def find_longest_cache_hit_and_uncached_prefix(
        self, block_hashes: list[BlockHash], max_length: int, token_ids: Sequence[int] | None = None
    ) -> tuple[tuple[list[KVCacheBlock], ...], int, int]:
        # token_ids is passed only when given (to a pool that checks collisions), so a replacement manager class
        # may leave it out of its find_longest_cache_hit signature.
        tokens = {} if token_ids is None else {"token_ids": token_ids}
        hits = self.single_type_managers[0].find_longest_cache_hit(block_hashes, max_length, [0], **tokens)
        return hits, len(hits[0]) * self.block_size, 0  # one group: no other group to lag behind it


def _groups_by_window(groups: Sequence[KVCacheGroupSpec]) -> dict[int | None, list[int]]:
    """The group ids of each spec (a window), in the order first seen."""
    by_window: dict[int | None, list[int]] = {}
    for group_id, g in enumerate(groups):
        by_window.setdefault(g.sliding_window, []).append(group_id)
    return by_window


class SpecGroup(NamedTuple):
    """KV cache groups of one spec, searched as one (vLLM 0.33's SpecGroup, kv_cache_coordinator.py): a lookup asks
    the pool for each hash in all of them at once and counts a block only where every one of them has it. Here a
    spec is its window, since one model's groups differ in nothing else (vLLM also compares the manager class and
    the pool; here every group shares the pool). use_eagle: some group of the spec is in eagle_group_ids, so the
    search goes one block further and every group of the spec drops EAGLE's block (vLLM 0.33 gives the flag to the
    whole spec group)."""

    sliding_window: int | None
    group_ids: list[int]
    use_eagle: bool


class HybridKVCacheCoordinator(KVCacheCoordinator):
    """Several groups, and the longest prefix hit all of them can serve.

    Groups of one spec (one window) are one SpecGroup, searched together: Gemma 3's five sliding groups are one
    search. Full attention goes first: its left-to-right walk is cheap, and any prefix of its hit is a hit, so later
    types only need to shorten it. A sliding hit is not downward closed (a shorter hit needs its own
    window of cached blocks), so after a type shortens the length every type checks again, until no
    type shortens it: a fixed point. All groups share one block size here, so a hit in whole blocks
    suits every group (vLLM aligns hits to the lcm of the groups' block sizes).

    With use_eagle, only the types holding a group of eagle_group_ids (those with the drafter's layers, or every
    group as a fallback) search one block past the candidate length, up to the request's last full block, and
    drop the last hit block, as vLLM 0.33's coordinator does; the others search at the candidate length and drop
    nothing. A full-attention head on a full + sliding model flags the full group alone, so there only full
    attention drops. A dropping type never returns more than the candidate, so the fixed point cannot spiral down a
    block per round (vLLM issue #32802, fixed by PR #33524 and 0.33's eagle_verified), and a block-aligned prompt
    loses none beyond the one the last-token rule gives back. vLLM skips the drop for a type already checked at the
    current length; here every round searches the same way, which differs only for two or more sliding types that
    drop.
    """

    def __init__(
        self,
        groups: Sequence[KVCacheGroupSpec],
        block_pool: BlockPoolInterface,
        block_size: int,
        use_eagle: bool = False,
        full_attention_manager_cls: type[FullAttentionManager] = FullAttentionManager,
        sliding_window_manager_cls: type[SlidingWindowManager] = SlidingWindowManager,
        prefix_cache_retention_interval: int | None = 0,
        max_model_len: int | None = None,
        max_in_flight_tokens: int | None = None,
    ) -> None:
        super().__init__(
            groups,
            block_pool,
            block_size,
            use_eagle,
            full_attention_manager_cls,
            sliding_window_manager_cls,
            prefix_cache_retention_interval,
            max_model_len,
            max_in_flight_tokens,
        )
        self.attention_groups = sorted(
            (
                SpecGroup(window, group_ids, not self.eagle_group_ids.isdisjoint(group_ids))
                for window, group_ids in _groups_by_window(groups).items()
            ),
            key=lambda group: group.sliding_window is not None,
        )
        # With at most one type besides full attention, one round already agrees (the last type searched
        # within everyone else's hit). vLLM stops after one round for full attention plus one other type
        # (is_simple_hybrid); with one sliding type alone its second round confirms the same length.
        self.one_pass = sum(g.sliding_window is not None for g in self.attention_groups) <= 1

    def drop_eagle_group_ids(self, groups: Sequence[KVCacheGroupSpec]) -> set[int]:
        """The flagged groups (KVCacheCoordinator's), each with every group of its spec: a spec's groups are
        searched as one, so all of them drop (vLLM 0.33 gives the flag to the whole SpecGroup)."""
        flagged = super().drop_eagle_group_ids(groups)
        return {i for ids in _groups_by_window(groups).values() if not flagged.isdisjoint(ids) for i in ids}

    def find_longest_cache_hit_and_uncached_prefix(
        self, block_hashes: list[BlockHash], max_length: int, token_ids: Sequence[int] | None = None
    ) -> tuple[tuple[list[KVCacheBlock], ...], int, int]:
        hits: list[list[KVCacheBlock]] = [[] for _ in self.single_type_managers]
        hit_length = max_length
        longest = 0  # the longest hit one type alone found (the first search's: later ones search within it)
        searched_full = False
        while True:
            length = hit_length
            for window, group_ids, use_eagle in self.attention_groups:
                if window is None and searched_full:
                    continue  # any prefix of a full-attention hit is a hit: its first search serves
                # EAGLE's managers drop the last hit block: one block more to search keeps the candidate reachable.
                # As in vLLM 0.33, that block may be any full block the request has, past max_length too: a
                # block-aligned prompt, whose last block the last-token rule already gave back, loses no more.
                limit = min(length + self.block_size, len(block_hashes) * self.block_size) if use_eagle else length
                found = self.single_type_managers[group_ids[0]].find_longest_cache_hit(block_hashes, limit, group_ids)
                searched_full |= window is None
                length = len(found[0]) * self.block_size
                longest = max(longest, length)
                for group_id, blocks in zip(group_ids, found):
                    hits[group_id] = blocks
            converged = length == hit_length or self.one_pass
            hit_length = length
            if converged:
                break
        num_blocks = hit_length // self.block_size
        return tuple(blocks[:num_blocks] for blocks in hits), num_blocks * self.block_size, longest - hit_length


def get_kv_cache_coordinator(
    groups: Sequence[KVCacheGroupSpec],
    block_pool: BlockPoolInterface,
    block_size: int,
    use_eagle: bool = False,
    full_attention_manager_cls: type[FullAttentionManager] = FullAttentionManager,
    sliding_window_manager_cls: type[SlidingWindowManager] = SlidingWindowManager,
    prefix_cache_retention_interval: int | None = 0,
    max_model_len: int | None = None,
    max_in_flight_tokens: int | None = None,
) -> KVCacheCoordinator:
    """vLLM's factory of the same name. vLLM also has a coordinator for caching off; here KVCacheManager skips the
    lookup itself then (prefix_cache_lookup_enabled), and the pool names no block."""
    cls = UnitaryKVCacheCoordinator if len(groups) == 1 else HybridKVCacheCoordinator
    return cls(
        groups,
        block_pool,
        block_size,
        use_eagle,
        full_attention_manager_cls,
        sliding_window_manager_cls,
        prefix_cache_retention_interval,
        max_model_len,
        max_in_flight_tokens,
    )
