"""KV block pool and prefix cache: the pure-Python core, no torch.

Relative imports only, so this package loads whatever nanoengine/__init__.py
pulls in.
"""

from .block_pool import BlockHashToBlockMap, BlockPool, BlockPoolInterface
from .kv_cache_manager import KVCacheManager, KVCacheManagerInterface, PrefixCacheStats
from .kv_cache_utils import (
    DEFAULT_HASH_SEED,
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
    make_none_hash,
    sha256,
    xxhash_128,
)
from .kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent

__all__ = [
    "AllBlocksCleared",
    "BlockHash",
    "BlockHashToBlockMap",
    "BlockPool",
    "BlockPoolInterface",
    "BlockTokensHasher",
    "BlockRemoved",
    "BlockStored",
    "DEFAULT_HASH_SEED",
    "FreeBlockQueue",
    "FreeKVCacheBlockQueue",
    "HashFn",
    "KVCacheBlock",
    "KVCacheEvent",
    "KVCacheManager",
    "KVCacheManagerInterface",
    "NONE_HASH",
    "PrefixCacheStats",
    "encode_extra_keys",
    "generate_block_hash_extra_keys",
    "get_hash_fn_by_name",
    "get_request_block_hasher",
    "hash_block_tokens",
    "make_none_hash",
    "sha256",
    "xxhash_128",
]
