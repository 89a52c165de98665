"""Chapter 06's free policies under neutral names, for the notebook's cells after the graded one.

Those cells are read before the chapter's design tasks (06.8, 06.2), so their code must not show which order vLLM
0.33 frees in: they name the policies "policy A", "policy B" and "policy C" and the two orders of a request's
blocks "last block first" and "first block first", and `reveal("06")` (nanocourse/reveals/06.md) says which is
which. The mapping, for whoever reads this source: A is the engine's BlockPool, B older vLLM's (`old_pool`), C the
engine's without the managers' reverse free (`ForwardFreePool`); the engine's `free` hands blocks over last first.
"""

from __future__ import annotations

from collections.abc import Callable

from nanocourse.lru_view import ForwardFreePool, old_pool
from nanoengine.core import BlockPool, KVCacheManager, get_request_block_hasher
from nanoengine.request import Request

POLICIES: dict[str, Callable[[int, bool], BlockPool]] = {
    "policy A": BlockPool,
    "policy B": old_pool,
    "policy C": ForwardFreePool,
}

FREE_ORDERS = ("last block first", "first block first")


def free_in_order(order: str) -> tuple[list[int], list[int], int]:
    """The design problem's 4-block run with A's blocks handed over in order (one of FREE_ORDERS): A's 16 tokens
    fill a pool of 4 usable blocks of 4 tokens and finish, X takes 2 blocks, then a 17-token request with A's prompt
    is looked up. Returns (X's block ids, A's blocks still cached, the tokens that request reuses)."""
    if order not in FREE_ORDERS:
        raise ValueError(f"order must be one of {FREE_ORDERS}, got {order!r}")
    hasher = get_request_block_hasher(4)
    kv = KVCacheManager(4, 5)
    a = Request("A", list(range(16)), block_hasher=hasher)
    kv.allocate_slots(a, 16)
    if order == "last block first":
        kv.free(a)  # the engine's free hands a request's blocks over last first
    else:  # release A as free does, but hand its blocks over root first
        group = kv.coordinator.single_type_managers[0]  # the one KV cache group's FullAttentionManager
        table = group.req_to_blocks.pop("A")
        del group.num_cached_block["A"]
        kv.block_pool.free_blocks(table)
    x = Request("X", list(range(900, 908)), block_hasher=hasher)
    kv.allocate_slots(x, 8)  # two blocks: both must be evicted
    x_blocks = kv.get_block_ids("X")[0]
    still_cached = sorted(
        b.block_id for _, b in kv.block_pool.cached_block_hash_to_block.items() if b.block_id not in x_blocks
    )
    reuse = kv.get_computed_blocks(Request("A2", list(range(17)), block_hasher=hasher))[1]
    return x_blocks, still_cached, reuse
