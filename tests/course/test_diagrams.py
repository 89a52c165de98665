"""The course diagrams draw from real engine objects, and the numbers they show are the pool's."""

import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest

from nanocourse.diagrams import (
    block_lifecycle_diagram,
    free_queue_diagram,
    hash_chain_tree,
    lifecycle_counts,
)
from nanoengine.core import KVCacheManager, get_request_block_hasher
from nanoengine.request import Request

HASHER = get_request_block_hasher(4)


@pytest.fixture
def kvm():
    """A 15-block pool with blocks in every state: a request running, one finished, never-used blocks."""
    kvm = KVCacheManager(4, 16)
    done = Request("done", list(range(100, 114)), block_hasher=HASHER)  # 3 full blocks + a partial one
    running = Request("running", list(range(200, 206)), block_hasher=HASHER)
    for r in (done, running):
        kvm.allocate_slots(r, r.num_tokens)
    kvm.free(done)
    yield kvm
    plt.close("all")


def texts(fig):
    return " ".join(t.get_text() for ax in fig.axes for t in ax.texts)


def test_free_queue_diagram_draws_every_free_block_with_its_sentinels(kvm):
    queue = kvm.block_pool.free_block_queue
    fig = free_queue_diagram(queue)
    shown = texts(fig)
    assert "head" in shown and "tail" in shown
    for block in queue.get_all_free_blocks():
        assert str(block.block_id) in shown
    assert f"{queue.num_free_blocks} free blocks, 3 of them cached" in fig.axes[0].get_title()


def test_free_queue_diagram_elides_the_middle_of_a_long_queue():
    fig = free_queue_diagram(KVCacheManager(4, 101).block_pool.free_block_queue, max_blocks=6)
    assert "… 94 more …" in texts(fig)
    plt.close(fig)


def test_lifecycle_counts_are_the_pools(kvm):
    pool = kvm.block_pool
    counts = lifecycle_counts(pool)
    free = pool.free_block_queue.get_all_free_blocks()
    assert counts["cached-free"] == sum(b.block_hash is not None for b in free) == 3
    assert counts["free"] == sum(b.block_hash is None for b in free)
    assert counts["in use"] == sum(b.ref_cnt > 0 for b in pool.blocks if not b.is_null) == 2
    assert sum(counts.values()) == pool.num_gpu_blocks - 1
    shown = texts(block_lifecycle_diagram(pool))
    for state, n in counts.items():
        assert f"{n} block" in shown, state
    for method in ("get_new_blocks", "free_blocks", "touch", "cache_full_blocks", "reset_prefix_cache"):
        assert method in shown


def test_hash_chain_tree_shares_a_prefix_and_marks_cached_blocks(kvm):
    prompts = [list(range(100, 114)), list(range(100, 108)) + [1, 2, 3, 4, 5], list(range(300, 308))]
    fig = hash_chain_tree(prompts, 4, pool=kvm.block_pool, labels=["done", "branch", "new"])
    shown = texts(fig)
    # branch shares done's first two nodes and adds one; new adds two: 3 + 1 + 2 nodes.
    assert len([t for t in fig.axes[0].texts if re.match(r"b\d+ [0-9a-f]{6}", t.get_text())]) == 6
    assert shown.count("→ block") == 3  # done's blocks, cached-free in the pool
    assert "branch (13 tok)" in shown and "1 token in a partial block" in shown
    with pytest.raises(ValueError):
        hash_chain_tree(prompts, 4, labels=["one"])
