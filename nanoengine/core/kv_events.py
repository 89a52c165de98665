"""KV cache events, as in vllm/distributed/kv_events.py.

BlockPool queues them only when events are enabled; a router replaying
BlockStored (hash, parent) pairs rebuilds the replica's prefix tree.
"""

from __future__ import annotations

from dataclasses import dataclass

from .kv_cache_utils import BlockHash


@dataclass(slots=True, frozen=True)
class KVCacheEvent:
    """Base class of the events BlockPool.take_events() returns."""


@dataclass(slots=True, frozen=True)
class BlockStored(KVCacheEvent):
    """Consecutive blocks of one request were cached.

    block_hashes are in chain order; parent_block_hash is the hash of the
    block before the first one, or None when the first one is the root.
    token_ids are the tokens of all the stored blocks, block_size per block.
    """

    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_name: str | None = None


@dataclass(slots=True, frozen=True)
class BlockRemoved(KVCacheEvent):
    """Cached blocks were evicted: their hashes no longer name them."""

    block_hashes: list[BlockHash]


@dataclass(slots=True, frozen=True)
class AllBlocksCleared(KVCacheEvent):
    """reset_prefix_cache() dropped every cached hash."""
