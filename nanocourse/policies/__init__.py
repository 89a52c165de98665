"""Policies beyond vLLM's defaults (chapter 09): frequency-aware eviction, a radix-tree prefix
index, and cache-aware routing over several engine replicas fed by KV events.

Each plugs into the engine from the outside: the eviction policy through
`LLM(block_pool=lambda n, c: FrequencyAwareBlockPool(n, c))`, the router through the replicas'
`BlockPool(enable_kv_cache_events=True)` event queues.
"""

from .eviction import FrequencyAwareBlockPool, SegmentedFreeQueue
from .radix import RadixTree, longest_common_prefix
from .router import (
    CacheAwareRouter,
    ReplicaCluster,
    ReplicaIndex,
    RoundRobinRouter,
    Routed,
    prefix_match,
    route,
    run_requests,
)

__all__ = [
    "CacheAwareRouter",
    "FrequencyAwareBlockPool",
    "RadixTree",
    "ReplicaCluster",
    "ReplicaIndex",
    "RoundRobinRouter",
    "Routed",
    "SegmentedFreeQueue",
    "longest_common_prefix",
    "prefix_match",
    "route",
    "run_requests",
]
