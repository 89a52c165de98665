"""Chapter 02's pool map: what the widget displays is the pool's real state, step after step."""

import re

import pytest
import torch

from nanocourse.pool_map import PoolMap, block_states, grid_text
from nanoengine import LLM
from nanoengine.attention import TorchBackend
from nanoengine.attention.paged import PagedKVCache
from nanoengine.config import LlamaConfig
from nanoengine.core import KVCacheManager
from nanoengine.core.sched.scheduler import Scheduler, SchedulerConfig
from nanoengine.engine.llm_engine import LLMEngine
from nanoengine.model import LlamaForCausalLM
from nanoengine.sampling_params import SamplingParams
from nanoengine.worker.model_runner import ModelRunner

BLOCK_SIZE, NUM_BLOCKS = 4, 16
PREFIX = list(range(10, 22))  # three full blocks, shared by requests 0 and 2


def tiny_engine() -> LLMEngine:
    """A real engine (scheduler, pool, runner) over a random 2-layer model: fast enough for unit tests."""
    config = LlamaConfig.tiny()
    cache = PagedKVCache(config, NUM_BLOCKS, BLOCK_SIZE, TorchBackend())
    runner = ModelRunner(LlamaForCausalLM.random(config, seed=0), cache, torch.device("cpu"))
    scheduler = Scheduler(SchedulerConfig(max_model_len=256), KVCacheManager(BLOCK_SIZE, NUM_BLOCKS))
    return LLMEngine(runner, scheduler, None)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n)


@pytest.fixture
def pool_map():
    arrivals = {0: [(PREFIX + [1, 2], greedy(2)), (list(range(50, 59)), greedy(6))], 4: [(PREFIX + [3], greedy(2))]}
    return PoolMap(tiny_engine(), arrivals, columns=8)


def displayed(pool_map) -> list[tuple[int, str, int]]:
    """(block id, kind, ref_cnt) of every cell of the HTML grid, as the learner sees it."""
    cells = re.findall(r"data-block='(\d+)' data-kind='(\w+)' data-ref='(-?\d+)'", pool_map.grid.value)
    return [(int(b), kind, int(ref)) for b, kind, ref in cells]


def assert_matches_pool(pool_map) -> None:
    manager = pool_map.engine.kv_cache_manager
    req_to_blocks = manager.coordinator.single_type_managers[0].req_to_blocks  # the model's one KV cache group
    cells = displayed(pool_map)
    assert [b for b, _, _ in cells] == list(range(NUM_BLOCKS)), "one cell per block, in id order"
    for (block_id, kind, ref), block in zip(cells, manager.block_pool.blocks):
        assert ref == block.ref_cnt
        owners = [r for r, blocks in req_to_blocks.items() if block in blocks]
        if block.is_null:
            expected = "null"
        elif block.ref_cnt:
            expected = "shared" if block.ref_cnt > 1 else "used"
            assert len(owners) == block.ref_cnt
        else:
            expected = "cached" if block.block_hash is not None else "free"
            assert owners == []
        assert kind == expected, f"block {block_id}"
    for req_id, blocks in req_to_blocks.items():
        assert f"blocks {[b.block_id for b in blocks]}" in pool_map.tables.value, f"block table of req {req_id}"


def test_before_any_step_only_the_null_block_is_taken(pool_map):
    assert displayed(pool_map)[0] == (0, "null", 0)
    assert {kind for _, kind, _ in displayed(pool_map)[1:]} == {"free"}
    assert "waiting" in pool_map.tables.value and pool_map.num_steps == 0
    assert_matches_pool(pool_map)


def test_every_click_runs_one_real_step_and_redraws(pool_map):
    engine = pool_map.engine
    kinds_seen = set()
    while engine.has_unfinished_requests():
        steps = engine.stats.num_steps
        pool_map.step_button.click()
        assert engine.stats.num_steps == steps + 1 and pool_map.num_steps == engine.stats.num_steps
        assert_matches_pool(pool_map)
        kinds_seen |= {kind for _, kind, _ in displayed(pool_map)}
    # Request 0's full prefix blocks stay cached after it finishes, and request 2 takes them back.
    assert {"used", "cached", "free", "null"} <= kinds_seen
    assert engine.stats.prefix_cache_hits == len(PREFIX)


def test_finished_request_leaves_cached_blocks_that_a_later_prefix_reuses(pool_map):
    manager = pool_map.engine.kv_cache_manager
    pool_map.step()
    first_table = manager.get_block_ids("0")[0]
    while "0" in pool_map.engine.scheduler.requests:
        pool_map.step()
    cached = [s.block_id for s in pool_map.states if s.kind == "cached"]
    assert cached == sorted(first_table[: len(PREFIX) // BLOCK_SIZE]), "the full prefix blocks keep their hashes"
    while pool_map.num_steps < 5:
        pool_map.step()
    assert manager.get_block_ids("2")[0][:3] == first_table[:3], "request 2 reuses request 0's cached blocks"
    assert_matches_pool(pool_map)


def test_text_view_agrees_with_the_grid(pool_map):
    pool_map.step()
    text = pool_map.text()
    assert text.splitlines()[0] == pool_map.summary()
    assert grid_text(block_states(pool_map.engine.kv_cache_manager), 8) in text
    assert text.splitlines()[1].split("|")[1].split()[0] == "##", "block 0 shows as the null block"


def test_step_is_disabled_when_the_story_ends_and_reset_replays_it(pool_map):
    first = pool_map.text()
    while not pool_map.ended:
        assert not pool_map.step_button.disabled
        pool_map.step_button.click()
    assert pool_map.step_button.disabled and "no unfinished requests" in pool_map.tables.value
    pool_map.reset_button.click()
    assert not pool_map.step_button.disabled and pool_map.num_steps == 0
    assert pool_map.summary() == first.splitlines()[0]  # block ids may differ: the free queue's order moved
    assert_matches_pool(pool_map)


def test_legend_shows_every_request_colour():
    from nanocourse.pool_map import _REQUEST_COLORS, legend_html

    assert all(c in legend_html() for c in _REQUEST_COLORS)


def test_runner_step_shows_what_the_runner_received_and_built():
    """Chapter 02's model-runner section: new requests with one block list per group, then a step whose decode
    the runner puts before the prompt chunk, with one slot mapping per group."""
    from nanocourse.runner_view import runner_step

    llm = LLM(
        LlamaForCausalLM.random(LlamaConfig.tiny_hybrid(8), seed=0),
        block_size=4,
        num_gpu_blocks_override=32,
        max_num_batched_tokens=16,
        long_prefill_token_threshold=8,
        progress=False,
    )
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    llm.engine.add_request(list(range(100, 120)), params)
    llm.engine.add_request([7, 8], params)
    first, second = runner_step(llm.engine), runner_step(llm.engine)
    groups = len(llm.engine.runner.kv_cache.groups)
    assert "new request 0: 20 prompt tokens" in first and first.count("slot_mapping") == groups > 1
    assert "cached request 1: 2 computed" in second and "order ['1', '0']" in second and "num_decodes 1" in second
    assert not llm.engine.observers, "runner_step leaves no observer behind"
