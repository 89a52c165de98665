"""Every member the engine calls on a part is declared on that part's Protocol.

The engine runs with each of its own parts seen through its Protocol alone (ProtocolOnly): reaching any other
member raises. Workloads cover every path that touches a part: prefix hits, chunked prefill, preemption, n > 1,
logprobs, n-gram drafts, a hybrid model's sliding groups, a failed step's recovery, an abandoned stream,
resetting the cache. A member the engine calls but a Protocol lacks fails here, naming both.
"""

import pytest

from nanoengine import LLM, SamplingParams
from nanoengine.attention.backend import AttentionBackend, TorchBackend
from nanoengine.config import LlamaConfig
from nanoengine.core import (
    BlockPool,
    BlockPoolInterface,
    FreeBlockQueue,
    FreeKVCacheBlockQueue,
    KVCacheManager,
    KVCacheManagerInterface,
)
from nanoengine.core.sched.interface import SchedulerInterface
from nanoengine.core.sched.scheduler import Scheduler
from nanoengine.model import LlamaForCausalLM
from nanoengine.parts import protocol_members
from nanoengine.worker import model_runner
from nanoengine.worker.block_table import BlockTable, BlockTableInterface

VIOLATIONS: list[str] = []


class ProtocolOnly:
    """`impl` seen through `protocol`: only the Protocol's members can be read or set. A violation is raised and
    also recorded, since the engine may catch it (a failed step's recovery does)."""

    def __init__(self, impl, protocol):
        object.__setattr__(self, "_impl", impl)
        object.__setattr__(self, "_protocol", protocol)
        object.__setattr__(self, "_members", protocol_members(protocol))

    def _check(self, name: str) -> None:
        if name not in self._members:
            VIOLATIONS.append(f"{type(self._impl).__name__}.{name} ({self._protocol.__name__} lacks it)")
            raise AttributeError(f"the engine used {VIOLATIONS[-1]}")

    def __getattr__(self, name):
        self._check(name)
        return getattr(self._impl, name)

    def __setattr__(self, name, value):
        self._check(name)
        setattr(self._impl, name, value)


def pool_factory(num_blocks, enable_caching, **kwargs):
    return ProtocolOnly(BlockPool(num_blocks, enable_caching, **kwargs), BlockPoolInterface)


def queue_factory(blocks):
    return ProtocolOnly(FreeKVCacheBlockQueue(blocks), FreeBlockQueue)


def manager_factory(*args, **kwargs):
    return ProtocolOnly(KVCacheManager(*args, **kwargs), KVCacheManagerInterface)


def table_factory(block_size):
    return ProtocolOnly(BlockTable(block_size), BlockTableInterface)


class ProtocolOnlyScheduler:
    @classmethod
    def from_config(cls, config, kv_cache_config):
        return ProtocolOnly(Scheduler.from_config(config, kv_cache_config), SchedulerInterface)


PARTS = {
    "block_pool": pool_factory,
    "free_queue_cls": queue_factory,
    "kv_cache_manager_cls": manager_factory,
    "scheduler_cls": ProtocolOnlyScheduler,
    "block_table_cls": table_factory,
    "attention_backend": ProtocolOnly(TorchBackend(), AttentionBackend),
}
GREEDY = SamplingParams(temperature=0, max_tokens=6)
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13], [1, 2, 3, 4, 5, 6, 7, 8, 20, 21], [7] * 30]


def build(model, num_blocks=24, **kwargs) -> LLM:
    return LLM(
        model,
        block_size=4,
        num_gpu_blocks_override=num_blocks,
        max_num_batched_tokens=16,
        max_num_seqs=3,
        progress=False,
        **PARTS,
        **kwargs,
    )


def run_workloads(llm: LLM) -> list:
    outs = [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY)]
    # The same prompts again: prefix hits; sampled, several completions, logprobs of both kinds.
    params = SamplingParams(temperature=0.8, seed=1, n=2, max_tokens=4, logprobs=2, prompt_logprobs=1)
    outs += [o.outputs[1].token_ids for o in llm.generate(prompt_token_ids=PROMPTS, sampling_params=params)]
    engine = llm.engine
    req_id = engine.add_request(PROMPTS[0], GREEDY)
    engine.step()
    engine.abort_request([req_id])
    assert llm.reset_prefix_cache()
    return outs


@pytest.fixture(autouse=True)
def no_violation():
    VIOLATIONS.clear()
    yield
    assert VIOLATIONS == [], "members the engine calls that their Protocol does not declare"


@pytest.fixture(scope="module")
def model():
    return LlamaForCausalLM.random(LlamaConfig.tiny(), seed=0, std=0.2)


def test_the_engine_reaches_its_parts_through_their_protocols_only(model):
    llm = build(model)
    engine = llm.engine
    seen = [engine.scheduler, engine.kv_cache_manager, engine.kv_cache_manager.block_pool, llm.backend]
    seen += [engine.kv_cache_manager.block_pool.free_block_queue, engine.runner.input_block_table[0]]
    assert all(type(part) is ProtocolOnly for part in seen), "every part is seen through its Protocol"
    plain = LLM(model, block_size=4, num_gpu_blocks_override=24, max_num_batched_tokens=16, max_num_seqs=3,
                progress=False)  # fmt: skip
    assert run_workloads(llm) == run_workloads(plain)


def test_preemption_and_ngram_drafts_too(model):
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
    llm = build(model, num_blocks=12, speculative_config=spec)
    run_workloads(llm)
    long = SamplingParams(temperature=0, max_tokens=24)
    llm.generate(prompt_token_ids=PROMPTS, sampling_params=long)
    assert llm.get_stats().num_preemptions > 0 and llm.get_stats().num_drafts > 0


def test_a_hybrid_models_sliding_groups_too():
    hybrid = LlamaForCausalLM.random(LlamaConfig.tiny_hybrid(8), seed=0, std=0.2)
    run_workloads(build(hybrid, num_blocks=48))


def test_a_failed_forward_pass_with_a_protocol_only_pool_reports_its_own_error(model, monkeypatch):
    """The engine evicts the blocks a failed step named before writing their KV, through the pool's Protocol:
    the step's own exception is what the caller sees, and the next request of that prompt hits nothing
    unwritten (its tokens are those of a fresh engine)."""
    expected = [o.outputs[0].token_ids for o in build(model).generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY)]
    llm = build(model)

    class Fault(Exception):
        pass

    def fail(*args):
        raise Fault("the forward pass failed")

    monkeypatch.setattr(model_runner.ModelRunner, "execute_model", fail)
    with pytest.raises(Fault):
        llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY)
    monkeypatch.undo()
    outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == expected
    assert all(o.num_cached_tokens == 0 for o in outs[:1]), "no block of the failed step is served as a hit"
