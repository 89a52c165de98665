"""Helpers shared by the core tests: small requests and pool snapshots.

They are handed out as fixtures rather than imported, so the tests work under
any pytest import mode next to the top-level tests/conftest.py.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

from nanoengine.core import BlockPool, KVCacheManager, get_request_block_hasher
from nanoengine.request import Request

BLOCK_SIZE = 4

# The stateful machines' shared settings; each sets its own example and step counts on top. No deadline: a
# step's time varies with the pool's size. No database: no .hypothesis/ directory in the work tree.
settings.register_profile("stateful", deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def make_request(request_id: str, tokens, block_size: int = BLOCK_SIZE, **kwargs) -> Request:
    return Request(request_id, list(tokens), block_hasher=get_request_block_hasher(block_size), **kwargs)


def free_ids(pool: BlockPool) -> list[int]:
    """Block ids in the free queue, head (evicted first) to tail."""
    return [block.block_id for block in pool.free_block_queue.get_all_free_blocks()]


def pool_state(pool: BlockPool) -> tuple:
    """Everything a failed call must leave unchanged."""
    return (
        free_ids(pool),
        pool.get_num_free_blocks(),
        [(b.block_id, b.ref_cnt, b.block_hash) for b in pool.blocks],
        sorted((h, b.block_id) for h, b in pool.cached_block_hash_to_block.items()),
        len(pool.kv_event_queue),
    )


def manager_state(manager: KVCacheManager) -> tuple:
    (group,) = manager.coordinator.single_type_managers
    return (
        pool_state(manager.block_pool),
        {rid: [b.block_id for b in blocks] for rid, blocks in group.req_to_blocks.items()},
        dict(group.num_cached_block),
    )


def run_step(manager: KVCacheManager, request: Request, num_new_tokens: int | None = None):
    """Admit or continue a request the way the scheduler does; returns new blocks."""
    computed, num_computed = None, 0
    if request.num_computed_tokens == 0:
        computed, num_computed = manager.get_computed_blocks(request)
    if num_new_tokens is None:
        num_new_tokens = request.num_tokens - request.num_computed_tokens - num_computed
    new_blocks = manager.allocate_slots(request, num_new_tokens, num_computed, computed)
    if new_blocks is not None:
        request.num_computed_tokens += num_computed + num_new_tokens
    return new_blocks


@pytest.fixture
def manager() -> KVCacheManager:
    """Block size 4, null block + 10 usable blocks, events on."""
    return KVCacheManager(BLOCK_SIZE, 11, enable_kv_cache_events=True)


def _helper_fixture(helper):
    @pytest.fixture(name=helper.__name__)
    def fixture():
        return helper

    return fixture


make_request_fixture = _helper_fixture(make_request)
free_ids_fixture = _helper_fixture(free_ids)
pool_state_fixture = _helper_fixture(pool_state)
manager_state_fixture = _helper_fixture(manager_state)
run_step_fixture = _helper_fixture(run_step)
