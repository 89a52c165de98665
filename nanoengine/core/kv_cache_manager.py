"""The scheduler's view of the KV cache (vllm/v1/core/kv_cache_manager.py).

One cache group with full attention, so vLLM's coordinator and
single-type manager fold into this class. A hybrid model, with several
groups, runs on HybridKVCacheManager (kv_cache_coordinator.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .block_pool import BlockPool, BlockPoolInterface
from .kv_cache_utils import KVCacheBlock
from .kv_events import KVCacheEvent

if TYPE_CHECKING:
    from nanoengine.request import Request


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


@runtime_checkable
class KVCacheManagerInterface(Protocol):
    """The seam of chapter 06 the scheduler allocates through; KVCacheManager below is the engine's.

    get_computed_blocks finds a waiting request's cached prefix without taking it; allocate_slots
    takes it and new blocks all at once or not at all (None, nothing changed), and with
    full_sequence_must_fit only if the request's whole sequence would fit (the scheduler's admission
    gate); free releases every block of a request, last block first. The scheduler reads the pool only
    through these. LLM(kv_cache_manager_cls=...) takes another class with KVCacheManager's constructor.
    """

    block_size: int
    block_pool: BlockPoolInterface
    enable_caching: bool

    @property
    def usage(self) -> float: ...
    def get_computed_blocks(
        self, request: Request, record_stats: bool = True
    ) -> tuple[list[KVCacheBlock], int]: ...
    def record_prefix_cache_stats(self, request: Request, num_hit_tokens: int) -> None: ...
    def make_prefix_cache_stats(self) -> PrefixCacheStats | None: ...
    def allocate_slots(
        self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
        new_computed_blocks: list[KVCacheBlock] | None = None, num_lookahead_tokens: int = 0,
        full_sequence_must_fit: bool = False,
    ) -> list[KVCacheBlock] | None: ...
    def free(self, request: Request) -> None: ...
    def get_block_ids(self, request_id: str) -> list[int]: ...
    def reset_prefix_cache(self) -> bool: ...
    def take_events(self) -> list[KVCacheEvent]: ...


class KVCacheManager:
    """Allocates, caches and frees the KV blocks of requests.

    Each request's block list is append-only: blocks are added as it grows
    and never replaced, so the block table on the device only ever grows.
    num_blocks may be a ready pool (any BlockPoolInterface), which then keeps
    its own caching, event and collision settings.
    """

    def __init__(
        self,
        block_size: int,
        num_blocks: int | BlockPoolInterface,
        enable_caching: bool = True,
        log_stats: bool = True,
        enable_kv_cache_events: bool = False,
        check_hash_collisions: bool = False,
    ) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}.")
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
        self.prefix_cache_stats = PrefixCacheStats() if log_stats else None
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # Number of leading blocks of each request that are in the cache map.
        self.num_cached_block: dict[str, int] = {}

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """The stats since the last call, which start afresh."""
        stats = self.prefix_cache_stats
        if stats is not None:
            self.prefix_cache_stats = PrefixCacheStats()
        return stats

    def get_computed_blocks(self, request: Request, record_stats: bool = True) -> tuple[list[KVCacheBlock], int]:
        """The longest cached prefix of a waiting request, and its token count.

        The hit stops one token short of the request so that the last token is
        always computed (its logits give the next token); since hits are whole
        blocks, a fully cached block-aligned prompt recomputes its last block.
        The blocks are not touched: allocate_slots does that on admission.
        A request that skips reading the cache (it wants prompt logprobs) gets no hit and is not
        counted in the stats, as in vLLM; the blocks it computes are still cached for others.
        """
        if not self.prefix_cache_lookup_enabled(request):
            return [], 0
        max_num_blocks = (request.num_tokens - 1) // self.block_size
        blocks = self._find_longest_cache_hit(request, max_num_blocks)
        num_hit_tokens = len(blocks) * self.block_size
        if record_stats:
            self.record_prefix_cache_stats(request, num_hit_tokens)
        return blocks, num_hit_tokens

    def prefix_cache_lookup_enabled(self, request: Request) -> bool:
        """Whether the request looks the prefix cache up at all (vLLM's method of the same name): not with
        caching off, nor for a request that skips reading it."""
        return self.enable_caching and not getattr(request, "skip_reading_prefix_cache", False)

    def record_prefix_cache_stats(self, request: Request, num_hit_tokens: int) -> None:
        """Count one admission's lookup; a request that made none (caching off, or it skips reading the
        cache) is not counted, as in vLLM 0.33. A scheduler that may hold a request back after looking it
        up passes record_stats=False above and calls this once the request is admitted, so a request
        waiting at the gate is not counted again at every step."""
        if self.prefix_cache_stats is not None and self.prefix_cache_lookup_enabled(request):
            self.prefix_cache_stats.record(request.num_tokens, num_hit_tokens, request.num_preemptions > 0)

    def _find_longest_cache_hit(
        self, request: Request, max_num_blocks: int
    ) -> list[KVCacheBlock]:
        # A miss ends the walk: every later hash chains through the missing one.
        get_cached_block = self.block_pool.get_cached_block
        check_tokens = self.block_pool.cached_token_ids is not None
        tokens, size = request.all_token_ids, self.block_size
        hits = []
        for i, block_hash in enumerate(islice(request.block_hashes, max_num_blocks)):
            block = get_cached_block(
                block_hash, tokens[i * size : (i + 1) * size] if check_tokens else None
            )
            if block is None:
                break
            hits.append(block)
        return hits

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: list[KVCacheBlock] | None = None,
        num_lookahead_tokens: int = 0,
        full_sequence_must_fit: bool = False,
    ) -> list[KVCacheBlock] | None:
        """Make room for num_new_tokens more tokens of the request.

        Layout of the request's tokens:
        | computed | new computed (cache hit) | new | lookahead |
        Blocks are needed up to the end of lookahead; blocks full after the
        new tokens are cached. Returns the newly allocated blocks, or None if
        the pool cannot provide them, in which case nothing has changed.
        With full_sequence_must_fit, also None unless the blocks for the
        request's whole sequence (num_tokens) fit now: the scheduler admits a
        request only then, as vLLM 0.33's scheduler_reserve_full_isl does.
        """
        self._check_allocation(request, num_new_tokens, num_new_computed_tokens, new_computed_blocks,
                               num_lookahead_tokens)
        request_id = request.request_id
        new_computed_blocks = new_computed_blocks or []
        if full_sequence_must_fit and not self._fits(request, request.num_tokens, new_computed_blocks):
            return None
        num_computed_tokens = request.num_computed_tokens + num_new_computed_tokens
        num_tokens_need_slot = num_computed_tokens + num_new_tokens + num_lookahead_tokens
        if not self._fits(request, num_tokens_need_slot, new_computed_blocks):
            return None

        req_blocks = self.req_to_blocks.setdefault(request_id, [])
        if request_id not in self.num_cached_block:
            self.block_pool.touch(new_computed_blocks)
            req_blocks.extend(new_computed_blocks)
            self.num_cached_block[request_id] = len(new_computed_blocks)
        num_new_blocks = max(-(-num_tokens_need_slot // self.block_size) - len(req_blocks), 0)
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
        req_blocks.extend(new_blocks)
        if self.enable_caching:
            self.cache_blocks(request, min(num_computed_tokens + num_new_tokens, request.num_tokens))
        return new_blocks

    def _fits(self, request: Request, num_tokens: int, new_computed_blocks) -> bool:
        return self.get_num_blocks_to_allocate(request, num_tokens, new_computed_blocks) <= \
            self.block_pool.get_num_free_blocks()

    def get_num_blocks_to_allocate(self, request: Request, num_tokens: int,
                                   new_computed_blocks: list[KVCacheBlock]) -> int:
        """Free blocks the request needs to have slots for num_tokens tokens, taking new_computed_blocks.

        A hit on a free cached block takes it out of the free queue, so it costs a free block just
        like a new one.
        """
        num_required = -(-num_tokens // self.block_size)
        num_held = len(self.req_to_blocks.get(request.request_id, ()))
        num_new = max(num_required - num_held - len(new_computed_blocks), 0)
        return num_new + sum(block.ref_cnt == 0 for block in new_computed_blocks)

    def _check_allocation(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int,
                          new_computed_blocks, num_lookahead_tokens: int) -> None:
        """Raise, before anything changes, on an allocate_slots call that cannot be right."""
        if min(num_new_tokens, num_new_computed_tokens, num_lookahead_tokens) < 0:
            raise ValueError(
                f"Token counts must be non-negative, got num_new_tokens={num_new_tokens}, "
                f"num_new_computed_tokens={num_new_computed_tokens}, "
                f"num_lookahead_tokens={num_lookahead_tokens}."
            )
        request_id = request.request_id
        if new_computed_blocks and request_id in self.num_cached_block:
            raise ValueError(
                f"Request {request_id!r} already holds blocks; cache hits can only "
                "be added when it is admitted (free it first if it was preempted)."
            )
        num_tokens_to_cache = min(request.num_computed_tokens + num_new_computed_tokens + num_new_tokens,
                                  request.num_tokens)
        if self.enable_caching and len(request.block_hashes) < num_tokens_to_cache // self.block_size:
            raise ValueError(
                f"Request {request_id!r} lacks block hashes for its full blocks; "
                "create it with block_hasher=get_request_block_hasher(block_size)."
            )

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Cache the request's blocks that the first num_computed_tokens fill."""
        request_id = request.request_id
        num_cached_blocks = self.num_cached_block[request_id]
        num_full_blocks = num_computed_tokens // self.block_size
        if num_cached_blocks >= num_full_blocks:
            return
        self.block_pool.cache_full_blocks(
            request,
            self.req_to_blocks[request_id],
            num_cached_blocks,
            num_full_blocks,
            self.block_size,
        )
        self.num_cached_block[request_id] = num_full_blocks

    def free(self, request: Request) -> None:
        """Release the request's blocks, last block first.

        Freeing in reverse puts a chain's tail ahead of its root in the free
        queue, so the shared root (the likeliest future hit) is evicted last.
        Freeing a request twice is a no-op. The record goes only once the pool
        has taken the blocks back, so a pool that raises leaves them to free again.
        """
        self.block_pool.free_blocks(reversed(self.req_to_blocks.get(request.request_id, [])))
        self.req_to_blocks.pop(request.request_id, None)
        self.num_cached_block.pop(request.request_id, None)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Forget the cached content of these blocks (vLLM's KVCacheManager.evict_blocks): the engine calls it
        after a failed step for the blocks that step named before writing their KV."""
        self.block_pool.evict_blocks(block_ids)

    def get_blocks(self, request_id: str) -> list[KVCacheBlock]:
        return self.req_to_blocks.get(request_id, [])

    def get_block_ids(self, request_id: str) -> list[int]:
        return [block.block_id for block in self.get_blocks(request_id)]

    def reset_prefix_cache(self) -> bool:
        """Clear the prefix cache; False (and no change) while requests hold blocks."""
        if not self.block_pool.reset_prefix_cache():
            return False
        if self.prefix_cache_stats is not None:
            self.prefix_cache_stats.reset = True
        return True

    def take_events(self) -> list[KVCacheEvent]:
        return self.block_pool.take_events()
