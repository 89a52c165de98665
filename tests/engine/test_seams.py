"""Each mechanism has one seam: a Protocol that the engine's own part implements and LLM takes as an argument;
the waiting queue is one class per policy."""

from typing import ClassVar

import pytest

from nanoengine import LLM, SamplingParams
from nanoengine.config import LlamaConfig
from nanoengine.core import (
    BlockPool,
    BlockPoolInterface,
    FreeBlockQueue,
    FreeKVCacheBlockQueue,
    KVCacheBlocks,
    KVCacheManager,
    KVCacheManagerInterface,
    hash_block_tokens,
)
from nanoengine.core.sched.interface import SchedulerInterface
from nanoengine.core.sched.request_queue import (
    FCFSRequestQueue,
    PriorityRequestQueue,
    SchedulingPolicy,
    create_request_queue,
)
from nanoengine.core.sched.scheduler import Scheduler, SchedulerConfig
from nanoengine.model import LlamaForCausalLM
from nanoengine.request import Request
from nanoengine.worker.block_table import BlockTable, BlockTableInterface


def test_the_engines_parts_implement_their_seams():
    pool = BlockPool(8, True)
    manager = KVCacheManager(4, pool)
    assert isinstance(pool.free_block_queue, FreeBlockQueue) and isinstance(pool, BlockPoolInterface)
    assert isinstance(manager, KVCacheManagerInterface)
    assert isinstance(Scheduler(SchedulerConfig(), manager), SchedulerInterface)
    assert isinstance(BlockTable(4), BlockTableInterface)
    assert not isinstance(object(), BlockTableInterface), "the protocols do check"


class CountingQueue(FreeKVCacheBlockQueue):
    """A queue of one's own, as a learner's: it counts the O(1) removals a prefix hit causes."""

    removals = 0

    def remove(self, block):
        CountingQueue.removals += 1
        super().remove(block)


class RecordingScheduler(Scheduler):
    plans: ClassVar[list] = []

    def schedule(self):
        out = super().schedule()
        RecordingScheduler.plans.append(dict(out.num_scheduled_tokens))
        return out


def test_llm_runs_each_part_it_is_given():
    hashed = []

    def hash_fn(parent, tokens, extra_keys=None):
        hashed.append(tuple(tokens))
        return hash_block_tokens(parent, tokens, extra_keys)

    class Table(BlockTable):
        slots = 0

        def compute_slot_mapping(self, req_id, start_pos, num_tokens):
            Table.slots += num_tokens
            return super().compute_slot_mapping(req_id, start_pos, num_tokens)

    model = LlamaForCausalLM.random(LlamaConfig.tiny(), seed=0)
    llm = LLM(
        model,
        block_size=4,
        kv_cache_memory_bytes=2**18,
        hash_block_tokens=hash_fn,
        free_queue_cls=CountingQueue,
        kv_cache_manager_cls=KVCacheManager,
        scheduler_cls=RecordingScheduler,
        block_table_cls=Table,
    )
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    first = llm.generate(prompt_token_ids=[list(range(1, 10))], sampling_params=params)[0]
    second = llm.generate(prompt_token_ids=[list(range(1, 9)) + [50]], sampling_params=params)[0]
    assert second.num_cached_tokens == 8 and first.num_cached_tokens == 0
    assert (1, 2, 3, 4) in hashed, "the hash function named the blocks"
    assert CountingQueue.removals >= 2, "the prefix hit took two free cached blocks out of the queue"
    assert RecordingScheduler.plans[0] == {"0": 9}
    assert Table.slots == 9 + 2 + 1 + 2, "every token's slot came from the block table"
    assert isinstance(llm.engine.kv_cache_manager.block_pool.free_block_queue, CountingQueue)


def test_text_prompts_need_a_tokenizer():
    from nanoengine.errors import InvalidRequestError

    llm = LLM(LlamaForCausalLM.random(LlamaConfig.tiny(), seed=0), block_size=4, kv_cache_memory_bytes=2**18)
    with pytest.raises(InvalidRequestError, match="prompt_token_ids"):
        llm.generate("hello")


def _req(rid, priority=0, arrival=0.0):
    return Request(rid, [1], priority=priority, arrival_time=arrival)


def test_fcfs_queue_keeps_arrival_order_and_prepends_a_preempted_request():
    q = create_request_queue(SchedulingPolicy.FCFS)
    assert isinstance(q, FCFSRequestQueue) and not q
    a, b, c = _req("a"), _req("b"), _req("c")
    q.add_request(a)
    q.add_request(b)
    q.prepend_request(c)
    assert [r.request_id for r in q] == ["c", "a", "b"] and q.peek_request() is c and len(q) == 3
    q.remove_request(a)
    assert q.pop_request() is c and list(q) == [b] and a not in q


def test_priority_queue_orders_by_priority_then_arrival_wherever_a_request_is_put():
    q = create_request_queue("priority")
    assert isinstance(q, PriorityRequestQueue)
    late_urgent, early_batch, early_urgent = _req("u2", 0, 5.0), _req("b", 1, 0.0), _req("u1", 0, 1.0)
    for r in (late_urgent, early_batch):
        q.add_request(r)
    q.prepend_request(early_urgent)  # "prepend" has no front under priority: the key decides
    assert [r.request_id for r in q] == ["u1", "u2", "b"] and early_batch in q
    q.remove_request(late_urgent)
    assert q.pop_request() is early_urgent and q.peek_request() is early_batch and len(q) == 1
    with pytest.raises(IndexError):
        create_request_queue("priority").peek_request()


def test_a_part_that_stalls_the_engine_gets_a_clear_error():
    from nanoengine.errors import EngineStalledError

    class NoLastTokenRule(KVCacheManager):
        """A learner's classic slip: the hit covers the whole block-aligned prompt, nothing is left to compute."""

        def get_computed_blocks(self, request, record_stats=True):
            blocks = [self.block_pool.get_cached_block(h) for h in request.block_hashes]
            hits = blocks[: blocks.index(None)] if None in blocks else blocks
            return KVCacheBlocks((hits,)), len(hits) * self.block_size

    llm = LLM(
        LlamaForCausalLM.random(LlamaConfig.tiny(), seed=0),
        block_size=4,
        kv_cache_memory_bytes=2**18,
        kv_cache_manager_cls=NoLastTokenRule,
    )
    params = SamplingParams(temperature=0, max_tokens=2)
    first = llm.generate(prompt_token_ids=[list(range(1, 9))], sampling_params=params)[0].token_ids
    with pytest.raises(EngineStalledError, match="last token to compute") as info:
        llm.generate(prompt_token_ids=[list(range(1, 9))], sampling_params=params)
    # The stall ends that call only: its request is aborted, and the engine serves the next one.
    assert "1 unfinished request(s) were aborted" in info.value.__notes__[0]
    assert not llm.engine.has_unfinished_requests() and llm.engine.kv_cache_manager.usage == 0
    assert llm.reset_prefix_cache()
    assert llm.generate(prompt_token_ids=[list(range(1, 9))], sampling_params=params)[0].token_ids == first


def test_speculative_parts_plug_in_through_their_seams():
    """proposer_cls is built as cls(SpeculativeConfig, max_model_len) and its drafts are verified; rejection_sampler
    decides every verify step; neither is used with speculation off, and a non-callable is refused by name."""
    from nanoengine.errors import InvalidEngineArgumentError
    from nanoengine.sample.rejection_sampler import rejection_sample
    from nanoengine.spec_decode.ngram_proposer import NgramProposer

    proposed, verified = [], []

    class Proposer(NgramProposer):
        def propose(self, token_ids, k=None):
            proposed.append(len(token_ids))
            return super().propose(token_ids, k)

    def sampler(logits, draft_token_ids, params, generators):
        verified.append(draft_token_ids)
        return rejection_sample(logits, draft_token_ids, params, generators)

    model = LlamaForCausalLM.random(LlamaConfig.tiny(), seed=0)
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompt = [[3, 4, 5] * 5]
    plain = LLM(
        model,
        block_size=4,
        kv_cache_memory_bytes=2**18,
        progress=False,
        proposer_cls=Proposer,
        rejection_sampler=sampler,
    ).generate(prompt_token_ids=prompt, sampling_params=params)
    assert proposed == [] and verified == [], "with speculation off no part of it runs"
    llm = LLM(
        model,
        block_size=4,
        kv_cache_memory_bytes=2**18,
        progress=False,
        speculative_config=spec,
        proposer_cls=Proposer,
        rejection_sampler=sampler,
    )
    out = llm.generate(prompt_token_ids=prompt, sampling_params=params)[0]
    assert out.token_ids == plain[0].token_ids
    assert proposed and any(any(d) for d in verified), "the given proposer drafted and the given sampler verified"
    for name in ("proposer_cls", "rejection_sampler"):
        with pytest.raises(InvalidEngineArgumentError, match=name):
            LLM(model, progress=False, speculative_config=spec, **{name: 3})
