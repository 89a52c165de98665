"""The scheduler's view of the KV cache (vllm/v1/core/kv_cache_manager.py).

KVCacheManager always goes through a coordinator (kv_cache_coordinator.py) with one single-type manager
per KV cache group, and hands out blocks as KVCacheBlocks, one list per group, as vLLM's does: one
shape for a model of one full-attention group and for a hybrid model alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from nanoengine.kv_cache_interface import KVCacheGroupSpec

from .block_pool import BlockPool, BlockPoolInterface
from .kv_cache_coordinator import BlocksPerGroup, get_kv_cache_coordinator
from .kv_cache_utils import KVCacheBlock
from .kv_events import KVCacheEvent
from .single_type_kv_cache_manager import FullAttentionManager, SlidingWindowManager

if TYPE_CHECKING:
    from nanoengine.request import Request

# The KV cache groups of a model whose every layer has full attention: one group.
FULL_ATTENTION_GROUPS = (KVCacheGroupSpec(layer_ids=()),)


@dataclass(slots=True)
class PrefixCacheStats:
    """Prefix-cache lookups at admission, counted in tokens.

    Requests readmitted after preemption are counted apart (vLLM PR #25787, for issue #25780):
    their recompute mostly hits blocks they cached themselves, which would
    inflate the hit rate. reset is True when the cache was cleared since the
    last snapshot.
    """

    reset: bool = False
    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


@dataclass(slots=True)
class KVCacheBlocks:
    """What KVCacheManager hands the scheduler: blocks[g][i] is group g's block for tokens
    i * block_size .. (i + 1) * block_size - 1 (vLLM's KVCacheBlocks). Every group has the same number
    of entries; a sliding group's entries behind its window are the null block."""

    blocks: tuple[Sequence[KVCacheBlock], ...]

    def get_block_ids(self) -> tuple[list[int], ...]:
        """One list of block ids per group, the shape the model runner's block table takes."""
        return tuple([block.block_id for block in group] for group in self.blocks)


@runtime_checkable
class KVCacheManagerInterface(Protocol):
    """Every KV cache manager operation the scheduler and the engine call; KVCacheManager below is the engine's.

    get_computed_blocks finds a waiting request's cached prefix without taking it; allocate_slots
    takes it and new blocks all at once or not at all (None, nothing changed), and with
    full_sequence_must_fit only if the request's whole sequence would fit (the scheduler's admission
    gate); free releases every block of a request, each group's last block first; evict_blocks forgets the
    cached content of blocks whose KV a failed step never wrote. Blocks come as KVCacheBlocks, one list per KV
    cache group. The scheduler reads the pool only through these. LLM(kv_cache_manager_cls=...) takes another
    class with KVCacheManager's constructor.
    """

    block_size: int
    block_pool: BlockPoolInterface
    enable_caching: bool

    @property
    def usage(self) -> float: ...
    def get_computed_blocks(self, request: Request, record_stats: bool = True) -> tuple[KVCacheBlocks, int]: ...
    def record_prefix_cache_stats(self, request: Request, num_hit_tokens: int) -> None: ...
    def make_prefix_cache_stats(self) -> PrefixCacheStats | None: ...
    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        full_sequence_must_fit: bool = False,
    ) -> KVCacheBlocks | None: ...
    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None: ...
    def free(self, request: Request) -> None: ...
    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]: ...
    def reset_prefix_cache(self) -> bool: ...
    def take_events(self) -> list[KVCacheEvent]: ...
    def evict_blocks(self, block_ids: Iterable[int]) -> None: ...


class KVCacheManager:
    """Allocates, caches and frees the KV blocks of requests, through one coordinator.

    Each request's block lists are append-only: blocks are added as it grows and never replaced (a
    sliding group's old entries become the null block), so the block table on the device only grows.
    num_blocks may be a ready pool (any BlockPoolInterface), which then keeps its own caching, event
    and collision settings. kv_cache_groups defaults to one full-attention group; the manager classes
    are replaceable (full_attention_manager_cls, sliding_window_manager_cls).

    Sliding groups, as vLLM 0.33 runs them by default: prefix_cache_retention_interval (vLLM's CacheConfig option,
    default 0) caches only the sliding blocks a later hit can reach (SlidingWindowManager.reachable_block_mask; None
    caches every block); max_model_len and max_in_flight_tokens (the tokens of the steps not yet settled: the token
    budget, or twice it under async scheduling) cap what admission reserves per sliding group
    (KVCacheGroupSpec.max_admission_blocks_per_request); without max_model_len nothing is capped.
    """

    def __init__(
        self,
        block_size: int,
        num_blocks: int | BlockPoolInterface,
        enable_caching: bool = True,
        log_stats: bool = True,
        enable_kv_cache_events: bool = False,
        check_hash_collisions: bool = False,
        kv_cache_groups: Sequence[KVCacheGroupSpec] = FULL_ATTENTION_GROUPS,
        use_eagle: bool = False,
        full_attention_manager_cls: type[FullAttentionManager] = FullAttentionManager,
        sliding_window_manager_cls: type[SlidingWindowManager] = SlidingWindowManager,
        prefix_cache_retention_interval: int | None = 0,
        max_model_len: int | None = None,
        max_in_flight_tokens: int | None = None,
    ) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}.")
        interval = prefix_cache_retention_interval
        if interval is not None and (interval < 0 or interval % block_size):
            raise ValueError(
                f"prefix_cache_retention_interval must be None (dense), 0 (vLLM 0.33's default) or a positive multiple "
                f"of block_size {block_size}, got {interval}."
            )
        if interval and all(g.sliding_window is None for g in kv_cache_groups):
            raise ValueError(
                f"prefix_cache_retention_interval={interval} has no effect without a sliding-window group; set it to 0."
            )
        self.block_size = block_size
        if not isinstance(num_blocks, int):
            self.block_pool = num_blocks
        else:
            self.block_pool = BlockPool(
                num_blocks,
                enable_caching,
                block_size,
                enable_kv_cache_events,
                check_hash_collisions=check_hash_collisions,
            )
        self.enable_caching = self.block_pool.enable_caching
        hash_block_size = self.block_pool.hash_block_size
        if hash_block_size not in (None, block_size):
            # vLLM 0.33 hashes finer than a block only for sub-block prefix hits (a hit ending inside a block, whose
            # shared tail block is copied on write; one block carrying several hashes), which it enables for a
            # hybrid model with a Mamba group in mamba_cache_mode="align" (kv_cache_utils.partial_hash_hits_enabled).
            raise ValueError(
                f"The pool's hash_block_size {hash_block_size} differs from block_size {block_size}: nanoengine reuses "
                "a block whole or not at all, so it has no sub-block prefix hits (vLLM 0.33's, for "
                'mamba_cache_mode="align"). Build the pool with hash_block_size=block_size.'
            )
        self.kv_cache_groups = tuple(kv_cache_groups)
        # Only a full-attention walk hands the pool each block's tokens to compare.
        self._check_tokens = self.block_pool.cached_token_ids is not None
        if self._check_tokens and (len(self.kv_cache_groups) > 1 or self.kv_cache_groups[0].sliding_window):
            raise ValueError("check_hash_collisions serves a model of one full-attention KV cache group only.")
        self.prefix_cache_stats = PrefixCacheStats() if log_stats else None
        self.coordinator = get_kv_cache_coordinator(
            self.kv_cache_groups,
            self.block_pool,
            block_size,
            use_eagle=use_eagle,
            full_attention_manager_cls=full_attention_manager_cls,
            sliding_window_manager_cls=sliding_window_manager_cls,
            prefix_cache_retention_interval=interval,
            max_model_len=max_model_len,
            max_in_flight_tokens=max_in_flight_tokens,
        )
        self.empty_kv_cache_blocks = KVCacheBlocks(tuple(() for _ in self.kv_cache_groups))

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """The stats since the last call, which start afresh."""
        stats = self.prefix_cache_stats
        if stats is not None:
            self.prefix_cache_stats = PrefixCacheStats()
        return stats

    def get_computed_blocks(self, request: Request, record_stats: bool = True) -> tuple[KVCacheBlocks, int]:
        """The longest cached prefix of a waiting request that every group can serve, and its token count.

        The hit stops one token short of the request so that the last token is
        always computed (its logits give the next token); since hits are whole
        blocks, a fully cached block-aligned prompt recomputes its last block.
        The blocks are not touched: allocate_slots does that on admission.
        A request that skips reading the cache (it wants prompt logprobs) gets no hit and is not
        counted in the stats, as in vLLM; the blocks it computes are still cached for others.
        It sets request.shared_prefix_boundary, where vLLM's scheduler stores the third value its
        get_computed_blocks returns: the end of a prefix one attention type has cached beyond the hit
        (full attention's, which a sparse sliding group has not), or 0. The request's sliding groups then
        cache the blocks that end there, so the next request sharing that prefix hits all of it.
        """
        request.shared_prefix_boundary = 0
        if not self.prefix_cache_lookup_enabled(request):
            return self.empty_kv_cache_blocks, 0
        max_length = request.num_tokens - 1
        tokens = {"token_ids": request.all_token_ids} if self._check_tokens else {}
        hits, num_hit_tokens, num_uncached = self.coordinator.find_longest_cache_hit_and_uncached_prefix(
            request.block_hashes, max_length, **tokens
        )
        request.shared_prefix_boundary = num_hit_tokens + num_uncached if num_uncached else 0
        if record_stats:
            self.record_prefix_cache_stats(request, num_hit_tokens)
        return KVCacheBlocks(hits), num_hit_tokens

    def prefix_cache_lookup_enabled(self, request: Request) -> bool:
        """Whether the request looks the prefix cache up at all (vLLM's method of the same name): not with
        caching off, nor for a request that skips reading it."""
        return self.enable_caching and not request.skip_reading_prefix_cache

    def record_prefix_cache_stats(self, request: Request, num_hit_tokens: int) -> None:
        """Count one admission's lookup; a request that made none (caching off, or it skips reading the
        cache) is not counted, as in vLLM 0.33. A scheduler that may hold a request back after looking it
        up passes record_stats=False above and calls this once the request is admitted, so a request
        waiting at the gate is not counted again at every step."""
        if self.prefix_cache_stats is not None and self.prefix_cache_lookup_enabled(request):
            self.prefix_cache_stats.record(request.num_tokens, num_hit_tokens, request.num_preemptions > 0)

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        full_sequence_must_fit: bool = False,
    ) -> KVCacheBlocks | None:
        """Make room for num_new_tokens more tokens of the request, in every group.

        Layout of the request's tokens:
        | computed | new computed (cache hit) | new | lookahead |
        Blocks are needed up to the end of lookahead; blocks full after the
        new tokens are cached. Returns the newly allocated blocks, or None if
        the pool cannot provide them. Blocks that have left a sliding window are
        freed first, so they can serve this step; if the pool still falls short,
        that is the only change. With full_sequence_must_fit, also None (and no
        change) unless the blocks for the request's whole sequence (num_tokens)
        fit now, a sliding group's capped at its max_admission_blocks_per_request:
        the scheduler admits a request only then, as vLLM 0.33's
        scheduler_reserve_full_isl does.
        """
        self._check_allocation(
            request, num_new_tokens, num_new_computed_tokens, new_computed_blocks, num_lookahead_tokens
        )
        request_id = request.request_id
        hits = (new_computed_blocks or self.empty_kv_cache_blocks).blocks
        num_computed = request.num_computed_tokens + num_new_computed_tokens
        if full_sequence_must_fit and not self._fits(request_id, request.num_tokens, hits, num_computed, True):
            return None
        # Free on the processed tokens (vLLM 0.33): under async scheduling a step in flight still reads the
        # window below the optimistic num_computed_tokens.
        self.coordinator.remove_skipped_blocks(request_id, max(0, num_computed - request.num_in_flight_tokens))
        num_tokens_need_slot = num_computed + num_new_tokens + num_lookahead_tokens
        if not self._fits(request_id, num_tokens_need_slot, hits, num_computed):
            return None
        # Every group takes its hits before any group takes a new block: a hit that sits free in the queue
        # would otherwise be evicted by another group's new blocks and then written twice.
        self.coordinator.allocate_new_computed_blocks(request_id, hits, num_computed)
        new_blocks = self.coordinator.allocate_new_blocks(request_id, num_tokens_need_slot)
        if self.enable_caching:
            self.coordinator.cache_blocks(request, min(num_computed + num_new_tokens, request.num_tokens))
        return KVCacheBlocks(new_blocks)

    def _fits(
        self, request_id: str, num_tokens: int, hits: BlocksPerGroup, num_computed: int, admission: bool = False
    ) -> bool:
        needed = self.coordinator.get_num_blocks_to_allocate(
            request_id, num_tokens, hits, num_computed, apply_admission_cap=admission
        )
        return needed <= self.block_pool.get_num_free_blocks()

    def _check_allocation(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int,
        new_computed_blocks: KVCacheBlocks | None,
        num_lookahead_tokens: int,
    ) -> None:
        """Raise, before anything changes, on an allocate_slots call that cannot be right."""
        if min(num_new_tokens, num_new_computed_tokens, num_lookahead_tokens) < 0:
            raise ValueError(
                f"Token counts must be non-negative, got num_new_tokens={num_new_tokens}, "
                f"num_new_computed_tokens={num_new_computed_tokens}, "
                f"num_lookahead_tokens={num_lookahead_tokens}."
            )
        request_id = request.request_id
        if new_computed_blocks is not None and not isinstance(new_computed_blocks, KVCacheBlocks):
            raise TypeError(
                f"new_computed_blocks must be the KVCacheBlocks that get_computed_blocks returned, got a "
                f"{type(new_computed_blocks).__name__}."
            )
        running = request_id in self.coordinator.single_type_managers[0].num_cached_block
        if running and new_computed_blocks is not None and any(new_computed_blocks.blocks):
            raise ValueError(
                f"Request {request_id!r} already holds blocks; cache hits can only "
                "be added when it is admitted (free it first if it was preempted)."
            )
        num_tokens_to_cache = min(
            request.num_computed_tokens + num_new_computed_tokens + num_new_tokens, request.num_tokens
        )
        if self.enable_caching and len(request.block_hashes) < num_tokens_to_cache // self.block_size:
            raise ValueError(
                f"Request {request_id!r} lacks block hashes for its full blocks; "
                "create it with block_hasher=get_request_block_hasher(block_size)."
            )

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Name every block of the request that its first num_computed_tokens tokens fill, in every group; nothing
        with prefix caching off (vLLM 0.33's KVCacheManager.cache_blocks, which the scheduler calls once a
        step's drafts are verified)."""
        if self.enable_caching:
            self.coordinator.cache_blocks(request, num_computed_tokens)

    def free(self, request: Request) -> None:
        """Release the request's blocks in every group, each group last block first.

        Freeing in reverse puts a chain's tail ahead of its root in the free
        queue, so the shared root (the likeliest future hit) is evicted last.
        Freeing a request twice is a no-op.
        """
        self.coordinator.free(request.request_id)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Forget the cached content of these blocks (vLLM's KVCacheManager.evict_blocks): the engine calls it
        after a failed step for the blocks that step named before writing their KV."""
        self.block_pool.evict_blocks(block_ids)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return KVCacheBlocks(self.coordinator.get_blocks(request_id))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return self.get_blocks(request_id).get_block_ids()

    def reset_prefix_cache(self) -> bool:
        """Clear the prefix cache; False (and no change) while requests hold blocks."""
        if not self.block_pool.reset_prefix_cache():
            return False
        if self.prefix_cache_stats is not None:
            self.prefix_cache_stats.reset = True
        return True

    def take_events(self) -> list[KVCacheEvent]:
        return self.block_pool.take_events()
