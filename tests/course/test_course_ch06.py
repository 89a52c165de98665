"""Chapter 06's LRU view shows the pool's real state at every t, and its policy tools measure the engine."""

import json
import re
from pathlib import Path

import pytest
import torch

from nanocourse.free_policies import POLICIES, free_in_order
from nanocourse.lru_view import (
    SYSTEM_PROMPT,
    ForwardFreePool,
    LRUView,
    chatbot_prompts,
    free_queue_ids,
    old_pool,
    replay_hit_rate,
    short_hash,
)
from nanoengine.attention import TorchBackend
from nanoengine.attention.paged import PagedKVCache
from nanoengine.config import LlamaConfig
from nanoengine.core import BlockPool, KVCacheManager, get_request_block_hasher
from nanoengine.core.sched.scheduler import Scheduler, SchedulerConfig
from nanoengine.engine.llm_engine import LLMEngine
from nanoengine.model import LlamaForCausalLM
from nanoengine.request import Request
from nanoengine.sampling_params import SamplingParams
from nanoengine.worker.model_runner import ModelRunner

CELL = re.compile(
    r"data-block='(\d+)' data-ref='(\d+)' data-hash='(\w*)' data-pos='(\d*)' "
    r"data-evicted='([01])' data-owners='([\w,]*)'"
)


def displayed(view):
    """(block, ref_cnt, hash, queue position, evicted, owners) of every cell, as the learner sees it."""
    return [
        (int(b), int(ref), h, int(pos) if pos else None, ev == "1", owners)
        for b, ref, h, pos, ev, owners in CELL.findall(view.table.value)
    ]


def expected(view):
    """The same six facts read straight from the pool and the manager."""
    manager = view.timeline.manager
    queue = free_queue_ids(manager.block_pool)
    return [
        (
            b.block_id,
            b.ref_cnt,
            short_hash(b.block_hash),
            queue.index(b.block_id) if b.block_id in queue else None,
            b.block_id in view.timeline.evicted,
            ",".join(
                r
                for r, blocks in sorted(manager.coordinator.single_type_managers[0].req_to_blocks.items())
                if b in blocks
            ),
        )
        for b in manager.block_pool.blocks
    ]


def run_to_end(view):
    while not view.step_button.disabled:
        view.step_button.click()
        assert displayed(view) == expected(view), f"t={view.timeline.t}"


def test_every_step_shows_the_pools_real_state():
    view = LRUView()
    assert view.timeline.t == -1 and displayed(view) == expected(view)
    assert len(displayed(view)) == 11
    run_to_end(view)
    assert view.timeline.t == 6
    view.step_button.click()  # past t=6 nothing happens
    assert view.timeline.t == 6


def test_queue_matches_what_the_chapter_claims_at_each_t():
    view = LRUView()
    queues = []
    for _ in range(7):
        view.step()
        queues.append(free_queue_ids(view.timeline.pool))
    assert queues[1] == [5, 6, 7, 8, 9, 10, 4, 3, 2, 1], "t=1: A's chain joins the tail, last block first"
    assert queues[4] == [5, 10, 4, 3, 2, 1], "t=4: B's unhashed block goes to the head"
    assert queues[5] == [5, 10, 4, 3, 2, 1, 9, 8, 7, 6]
    assert f"free queue, head to tail: {queues[6]}" in view.footer.value


def test_t6_evicts_the_system_prompt_tail_first():
    view = LRUView()
    run_to_end(view)
    assert view.timeline.evicted == [4, 3, 2, 1]
    assert [b for b, *_, ev, _ in displayed(view) if ev] == [1, 2, 3, 4]
    chain = Request("x", list(SYSTEM_PROMPT), block_hasher=get_request_block_hasher(4)).block_hashes
    assert all(h not in dict(view.timeline.pool.cached_block_hash_to_block.items()) for h in chain)
    assert "would reuse 0 tokens" in view.footer.value
    assert "evicted:  [4, 3, 2, 1]" in view.text()


def test_slider_replays_t6_with_fewer_blocks_and_the_root_survives():
    view = LRUView()
    run_to_end(view)
    view.e_slider.value = 4
    assert view.timeline.t == 6 and view.timeline.evicted == [4, 3]
    assert displayed(view) == expected(view)
    assert "would reuse 8 tokens" in view.footer.value, "blocks 1 and 2 survive and still hit"


def test_reset_goes_back_before_t0():
    view = LRUView()
    view.step()
    view.step()
    view.reset_button.click()
    assert view.timeline.t == -1 and not view.step_button.disabled
    assert free_queue_ids(view.timeline.pool) == list(range(1, 11))
    assert displayed(view) == expected(view)


def test_old_pool_frees_every_block_to_the_tail():
    queues = {}
    for name, factory in (("new", BlockPool), ("old", old_pool)):
        manager = KVCacheManager(4, factory(8, True))
        request = Request("A", list(range(10)), block_hasher=get_request_block_hasher(4))
        manager.allocate_slots(request, 10)
        manager.free(request)
        queues[name] = free_queue_ids(manager.block_pool)
    assert queues["new"] == [3, 4, 5, 6, 7, 2, 1], "the partial block 3 goes to the head"
    assert queues["old"] == [4, 5, 6, 7, 3, 2, 1], "older vLLM appended it behind the chain"


def tiny_engine(pool):
    config = LlamaConfig.tiny(vocab_size=40_000)
    cache = PagedKVCache(config, pool.num_gpu_blocks, 16, TorchBackend())
    runner = ModelRunner(LlamaForCausalLM.random(config, seed=0), cache, torch.device("cpu"))
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=4), KVCacheManager(16, pool))
    return LLMEngine(runner, scheduler, None)


@pytest.mark.parametrize("factory", [BlockPool, old_pool])
def test_replay_without_a_model_gives_the_engines_hit_rate(factory):
    prompts = chatbot_prompts(24, num_systems=4)
    engine = tiny_engine(factory(14, True))
    for tokens in prompts:
        engine.add_request(tokens, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.stats.prefix_cache_hit_rate == replay_hit_rate(prompts, factory(14, True))


def test_unhashed_blocks_at_the_head_raise_the_hit_rate():
    prompts = chatbot_prompts(300)
    new, old = (replay_hit_rate(prompts, factory(32, True)) for factory in (BlockPool, old_pool))
    assert new > old + 0.05


def test_replay_refuses_a_pool_too_small_for_a_prompt():
    with pytest.raises(ValueError, match="cannot hold the next prompt"):
        replay_hit_rate(chatbot_prompts(2, question_tokens=120), BlockPool(8, True))


def test_free_in_order_shows_what_each_order_leaves_of_a_chain():
    """The notebook's "Two orders for free": last block first keeps A's root and its child reachable."""
    assert free_in_order("last block first") == ([4, 3], [1, 2], 8)
    assert free_in_order("first block first") == ([1, 2], [3, 4], 0), "the survivors are cached but unreachable"
    with pytest.raises(ValueError, match="order must be one of"):
        free_in_order("root last")


def test_the_policies_keep_their_names_out_of_the_notebook():
    """The notebook is read top to bottom before tasks 06.2 and 06.8 ask for a free order, so nothing in it, code or
    prose, locked cells included, may say where vLLM 0.33 puts freed blocks: its policies are A, B and C
    (nanocourse.free_policies), and reveal("06") maps them."""
    assert [POLICIES[name] for name in ("policy A", "policy B", "policy C")] == [BlockPool, old_pool, ForwardFreePool]
    notebook = Path(__file__).resolve().parents[2] / "notebooks" / "06_prefix_caching.ipynb"
    text = "\n".join("".join(cell["source"]) for cell in json.loads(notebook.read_text())["cells"])
    giveaways = ["unhashed", "prepend", "reverse", "old_pool", "ForwardFreePool", "last first", "a free without"]
    assert not [word for word in giveaways if word in text]
