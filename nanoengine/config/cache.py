"""How the KV cache is laid out and sized (vllm/config/cache.py's CacheConfig, the subset nanoengine has)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True, kw_only=True)
class CacheConfig:
    """The one owner of the KV cache's settings: every part that needs one reads it from here.

    block_size: tokens per KV block (vLLM's default, 16). The pool, the KV cache managers, the scheduler, the
    runner's block tables and the paged cache all take this value, and the pool checks that the blocks it
    names by hash are this size (its hash_block_size).
    enable_prefix_caching: whether full blocks are kept, named by hash, for later requests.
    hash_algo: how a block is named, "xxhash" or "sha256" (vLLM's prefix_caching_hash_algo).
    The pool's size comes from one of: num_gpu_blocks_override (blocks, the null block included, as vLLM
    names it), kv_cache_memory_bytes (a byte budget), or gpu_memory_utilization (on CUDA, the share of the
    memory free after loading the weights; vLLM's is a share of the whole GPU). On a CPU with neither, the
    budget is 512 MiB.
    """

    block_size: int = 16
    enable_prefix_caching: bool = True
    hash_algo: str = "xxhash"
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: int | None = None
