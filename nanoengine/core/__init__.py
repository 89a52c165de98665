"""KV block pool and prefix cache: the pure-Python core, no torch.

Relative imports only, so this package loads whatever nanoengine/__init__.py
pulls in.
"""

from .block_pool import BlockHashToBlockMap, BlockPool, BlockPoolInterface
from .kv_cache_coordinator import (
    HybridKVCacheCoordinator,
    KVCacheCoordinator,
    UnitaryKVCacheCoordinator,
    get_kv_cache_coordinator,
)
from .kv_cache_manager import KVCacheBlocks, KVCacheManager, KVCacheManagerInterface, PrefixCacheStats
from .kv_cache_utils import (
    DEFAULT_HASH_SEED,
    HASH_ALGOS,
    NONE_HASH,
    BlockHash,
    BlockTokensHasher,
    FreeBlockQueue,
    FreeKVCacheBlockQueue,
    HashFn,
    KVCacheBlock,
    encode_extra_keys,
    generate_block_hash_extra_keys,
    get_hash_fn_by_name,
    get_request_block_hasher,
    hash_block_tokens,
    make_block_hash_with_group_id,
    make_none_hash,
    sha256,
    xxhash_128,
)
from .kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from .single_type_kv_cache_manager import FullAttentionManager, SingleTypeKVCacheManager, SlidingWindowManager

__all__ = [
    "DEFAULT_HASH_SEED",
    "HASH_ALGOS",
    "NONE_HASH",
    "AllBlocksCleared",
    "BlockHash",
    "BlockHashToBlockMap",
    "BlockPool",
    "BlockPoolInterface",
    "BlockRemoved",
    "BlockStored",
    "BlockTokensHasher",
    "FreeBlockQueue",
    "FreeKVCacheBlockQueue",
    "FullAttentionManager",
    "HashFn",
    "HybridKVCacheCoordinator",
    "KVCacheBlock",
    "KVCacheBlocks",
    "KVCacheCoordinator",
    "KVCacheEvent",
    "KVCacheManager",
    "KVCacheManagerInterface",
    "PrefixCacheStats",
    "SingleTypeKVCacheManager",
    "SlidingWindowManager",
    "UnitaryKVCacheCoordinator",
    "encode_extra_keys",
    "generate_block_hash_extra_keys",
    "get_hash_fn_by_name",
    "get_kv_cache_coordinator",
    "get_request_block_hasher",
    "hash_block_tokens",
    "make_block_hash_with_group_id",
    "make_none_hash",
    "sha256",
    "xxhash_128",
]
