"""Routing: the pure route() rule, the event-built ReplicaIndex, and ReplicaCluster driving
model-free replicas (the real engine loop, scheduler and pool, without a model)."""

from collections import Counter

from nanocourse.beyond import GREEDY_ONE, ModelFreeReplica
from nanocourse.policies import (
    CacheAwareRouter,
    ReplicaCluster,
    ReplicaIndex,
    RoundRobinRouter,
    prefix_match,
    route,
    run_requests,
)
from nanoengine.core import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheManager


def stored(*hashes):
    return BlockStored(list(hashes), None, [0] * 4 * len(hashes), 4)


def test_prefix_match_stops_at_the_first_miss():
    assert prefix_match([b"a", b"b", b"c"], {b"a", b"c"}) == 1
    assert prefix_match([b"a", b"b"], {b"a", b"b"}) == 2
    assert prefix_match([], {b"a"}) == 0


def test_route_prefers_the_longest_prefix_then_the_least_loaded():
    replicas = [{b"a"}, {b"a", b"b"}, set()]
    assert route([b"a", b"b", b"c"], replicas, [0, 5, 0]) == 1
    assert route([b"x"], replicas, [2, 1, 1]) == 1, "no hit anywhere: least loaded, lowest index"
    assert route([b"a"], replicas, [3, 2, 0]) == 1, "a tie on the prefix goes to the less loaded"


def test_index_counts_copies():
    index = ReplicaIndex()
    index.apply([stored(b"a", b"b"), stored(b"a")])  # two copies of a
    index.apply([BlockRemoved([b"a"])])
    assert b"a" in index, "one copy of a is still cached"
    index.apply([BlockRemoved([b"a", b"b"])])
    assert b"a" not in index and len(index) == 0
    index.apply([stored(b"c"), AllBlocksCleared()])
    assert len(index) == 0


def test_index_follows_a_real_pool():
    """Replaying a pool's events gives exactly the hashes in its map, duplicates and evictions included."""
    replica = ModelFreeReplica(9, block_size=4, long_prefill_token_threshold=4)
    engine, index = replica.engine, ReplicaIndex()
    run_requests(engine, [list(range(12)), list(range(12))], GREEDY_ONE)  # chunked side by side: two copies
    run_requests(engine, [list(range(100, 116))], GREEDY_ONE)  # evicts one of them
    events = engine.kv_cache_manager.take_events()
    assert any(isinstance(e, BlockRemoved) for e in events)
    index.apply(events)
    pool = engine.kv_cache_manager.block_pool
    # One count per (hash, block) entry, so a hash cached twice counts twice. The map is no dict (it has no keys()),
    # which ruff's PERF102 cannot tell: a for loop over items() here would be "fixed" into a call that fails.
    truth = Counter(block_hash for block_hash, _ in pool.cached_block_hash_to_block.items())
    assert dict(index.counts) == dict(truth)


def test_round_robin_cycles():
    router = RoundRobinRouter(3)
    assert [router.route([], [0, 0, 0]) for _ in range(4)] == [0, 1, 2, 0]


def _cluster(router_cls, num_blocks=12):
    replicas = [ModelFreeReplica(num_blocks, block_size=4) for _ in range(2)]
    return ReplicaCluster(replicas, router_cls(2)), replicas


def test_cache_aware_cluster_sends_a_tenant_back_to_its_replica():
    cluster, _replicas = _cluster(CacheAwareRouter)
    tenant_a, tenant_b = list(range(16)), list(range(50, 66))
    first = cluster.serve_wave([tenant_a + [1], tenant_b + [2]], GREEDY_ONE)
    assert [r.replica for r in first] == [0, 1], "no hits yet: the load spreads them"
    second = cluster.serve_wave([tenant_b + [3], tenant_a + [4]], GREEDY_ONE)
    assert [r.replica for r in second] == [1, 0]
    assert [r.output.num_cached_tokens for r in second] == [16, 16]


def test_round_robin_cluster_misses_where_cache_aware_hits():
    cluster, _ = _cluster(RoundRobinRouter)
    tenant_a, tenant_b = list(range(16)), list(range(50, 66))
    cluster.serve_wave([tenant_a + [1], tenant_b + [2]], GREEDY_ONE)
    second = cluster.serve_wave([tenant_b + [3], tenant_a + [4]], GREEDY_ONE)
    assert [r.output.num_cached_tokens for r in second] == [0, 0]


def test_router_hashes_are_the_replicas_hashes_and_salt_splits_them():
    cluster, _replicas = _cluster(CacheAwareRouter)
    tokens = list(range(20))
    cluster.serve_wave([tokens], GREEDY_ONE, salts=["alice"])
    index = cluster.router.indexes[0]
    assert all(h in index for h in cluster.block_hashes(tokens, "alice"))
    assert not any(h in index for h in cluster.block_hashes(tokens, "bob"))
    assert cluster.place([tokens, tokens], ["alice", "bob"]) == [0, 1]


def test_model_free_replica_uses_the_real_manager():
    replica = ModelFreeReplica(5, block_size=4)
    assert isinstance(replica.engine.kv_cache_manager, KVCacheManager)
    out = run_requests(replica.engine, [list(range(9))], GREEDY_ONE)[0]
    assert out.token_ids == [0] and out.finish_reason == "length"
    assert replica.get_stats().prefix_cache_queries == 9
