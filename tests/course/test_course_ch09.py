"""Chapter 09's widgets show the engine's real state: the eviction explorer's numbers are the
engine's hit rates and pool contents, and the router view's grid is what the pools hold."""

from nanocourse.beyond import (
    POLICIES,
    BurstyWorkload,
    EvictionExplorer,
    RouterView,
    TenantWorkload,
    block_hashes,
    cached_prefix_blocks,
    hit_rate,
    pool_hashes,
    pool_of,
    run_policy,
    tenant_blocks,
)


def test_explorer_table_is_the_engines_hit_rate():
    ex = EvictionExplorer(burst_size=1)
    ex.burst.value = 3
    for policy in POLICIES:
        fresh = run_policy(policy, BurstyWorkload(burst_size=3), 65)
        run = ex.runs[policy]
        assert run.hit_rate == fresh.hit_rate and run.chat_hit_rate == fresh.chat_hit_rate
        assert f"{fresh.hit_rate:.1%}" in ex.table.value
        stats = run.replica.get_stats()
        assert run.hit_rate == stats.prefix_cache_hits / stats.prefix_cache_queries
    assert ex.hot_cached == {"LRU": 0, "frequency-aware": 16}, "the burst flushed LRU, not the frequency-aware pool"


def hot_segments(ex):
    return {seg for _, kind, seg in ex.pool_strips["frequency-aware"] if kind == "hot"}


def test_explorer_strips_show_each_pool():
    ex = EvictionExplorer(burst_size=3)
    (system, *_), _ = BurstyWorkload(burst_size=3).build()
    hot = set(block_hashes(system))
    for policy, strip in ex.pool_strips.items():
        pool = pool_of(ex.runs[policy].replica)
        assert [b for b, _, _ in strip] == [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
        assert sum(kind == "hot" for _, kind, _ in strip) == len(hot & pool_hashes(pool))
    assert hot_segments(ex) == {"protected"}
    assert ex.strips.value.count("data-kind='hot'") == 16, "16 hot blocks, all in the frequency-aware pool"
    # Bigger bursts outlast the reuse window: the hot prompt is demoted, yet still cached, at
    # probation's newest end.
    ex.burst.value = 4
    assert hot_segments(ex) == {"probation"} and ex.hot_cached["frequency-aware"] == 16


def test_explorer_without_bursts_policies_agree():
    ex = EvictionExplorer(burst_size=2)
    ex.burst.value = 0
    rates = {p: run.hit_rate for p, run in ex.runs.items()}
    assert rates["LRU"] == rates["frequency-aware"] > 0.8


def test_router_view_grid_is_what_the_pools_hold():
    view = RouterView()
    for _ in range(4):
        view.next_button.click()
    systems, waves = TenantWorkload(num_waves=12).build()
    assert len(view.results) == 4 * len(waves[0])
    assert view.in_sync is True
    assert view.grid == tenant_blocks(view.cluster, systems, from_events=False)
    for r, replica in enumerate(view.cluster.replicas):
        assert view.grid[r] == [cached_prefix_blocks(pool_of(replica), s) for s in systems]
    assert view.hit_rate == hit_rate([r.output for r in view.results])
    assert f"{view.hit_rate:.1%}" in view.view.value and "waves sent: 4/12" in view.view.value


def test_router_view_cache_aware_beats_round_robin():
    view = RouterView()
    for _ in range(12):
        view.step()
    cache_aware = view.hit_rate
    view.choice.value = "round-robin"
    assert view.results == [] and view.in_sync is None
    for _ in range(13):  # one click past the end does nothing
        view.step()
    assert len(view.results) == 36
    assert view.hit_rate < cache_aware
    view.reset_button.click()
    assert view.results == [] and "waves sent: 0/12" in view.view.value
