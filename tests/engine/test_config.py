"""One engine, one config tree: EngineArgs checks LLM's arguments once and builds an EngineConfig, and every
layer reads its settings from that tree, each setting from its one owner."""

import dataclasses

import pytest

from nanoengine import LLM, SamplingParams
from nanoengine.config import CacheConfig, LlamaConfig, SchedulerConfig
from nanoengine.config.engine import EngineConfig
from nanoengine.engine.arg_utils import EngineArgs
from nanoengine.errors import InvalidEngineArgumentError
from nanoengine.model import LlamaForCausalLM

MODEL = LlamaForCausalLM.random(LlamaConfig.tiny(), seed=0)
HYBRID = LlamaForCausalLM.random(LlamaConfig.tiny_hybrid(8), seed=0)


@pytest.mark.parametrize("model", [MODEL, HYBRID], ids=["full attention", "hybrid"])
def test_every_part_takes_block_size_and_max_model_len_from_the_config(model):
    llm = LLM(model, block_size=8, max_model_len=200, num_gpu_blocks_override=40, progress=False)
    engine, config = llm.engine, llm.engine.config
    block_size = config.cache_config.block_size
    manager = engine.kv_cache_manager
    holders = {
        "scheduler": engine.scheduler.block_size,
        "KV cache manager": manager.block_size,
        "coordinator": manager.coordinator.block_size,
        "pool (hash_block_size)": manager.block_pool.hash_block_size,
        "runner": engine.runner.block_size,
        "paged KV cache": engine.runner.kv_cache.block_size,
        **{f"block table {g}": table.block_size for g, table in enumerate(engine.runner.input_block_table)},
        **{f"group {g} manager": m.block_size for g, m in enumerate(manager.coordinator.single_type_managers)},
    }
    assert holders == dict.fromkeys(holders, block_size) and block_size == 8
    assert config.scheduler_config.max_model_len == config.model_config.max_model_len == llm.max_model_len == 200
    out = llm.generate(prompt_token_ids=[list(range(1, 30))] * 2, sampling_params=SamplingParams(max_tokens=3))
    assert out[1].num_cached_tokens == 24, "the pool's own hash_block_size check passed while caching"


def test_the_tree_refuses_copies_that_disagree_with_their_owner():
    config = EngineArgs(model=MODEL, progress=False).create_engine_config()
    other = dataclasses.replace(config.scheduler_config, max_model_len=config.model_config.max_model_len - 1)
    with pytest.raises(ValueError, match="max_model_len"):
        dataclasses.replace(config, scheduler_config=other)
    ahead = dataclasses.replace(config.scheduler_config, num_lookahead_tokens=3)
    with pytest.raises(ValueError, match="num_lookahead_tokens"):
        dataclasses.replace(config, scheduler_config=ahead)
    slots = dataclasses.replace(config.scheduler_config, max_num_new_slots_for_drafting=1)
    with pytest.raises(ValueError, match="max_num_new_slots_for_drafting"):
        dataclasses.replace(config, scheduler_config=slots)
    assert isinstance(config, EngineConfig) and isinstance(config.cache_config, CacheConfig)


def test_a_draft_model_gets_its_input_slot_and_a_budget_past_its_lookahead():
    """SpeculativeConfig.max_num_new_slots_for_drafting reaches the scheduler (1 for a draft model, 0 for n-gram),
    and a budget no larger than the lookahead slots is refused by name, as vLLM's VllmConfig refuses it."""
    for method, slots in (("draft_model", 1), ("ngram", 0)):
        spec = {"method": method, "num_speculative_tokens": 3} | ({"model": MODEL} if method == "draft_model" else {})
        config = EngineArgs(model=MODEL, speculative_config=spec, progress=False).create_engine_config()
        assert config.scheduler_config.max_num_new_slots_for_drafting == slots
    spec = {"method": "draft_model", "num_speculative_tokens": 3, "model": MODEL}
    with pytest.raises(InvalidEngineArgumentError, match="max_num_batched_tokens=3") as info:
        EngineArgs(
            model=MODEL, speculative_config=spec, max_num_batched_tokens=3, progress=False
        ).create_engine_config()
    assert info.value.parameter == "max_num_batched_tokens"


def test_a_budget_below_a_padded_step_is_refused_by_name():
    """n-gram k=3 with budget 3: a new one-token request padded to 1 + k = 4 tokens could never be scheduled, and
    with nothing else running the engine would stall (vLLM 0.33 accepts this config); 4 is accepted."""
    spec = {"method": "ngram", "num_speculative_tokens": 3}
    with pytest.raises(InvalidEngineArgumentError, match=r"max_num_batched_tokens >= 4") as info:
        EngineArgs(
            model=MODEL, speculative_config=spec, max_num_batched_tokens=3, progress=False
        ).create_engine_config()
    assert info.value.parameter == "max_num_batched_tokens"
    EngineArgs(model=MODEL, speculative_config=spec, max_num_batched_tokens=4, progress=False).create_engine_config()


def test_configs_are_built_by_keyword():
    with pytest.raises(TypeError):
        SchedulerConfig(2048)  # type: ignore[misc]
    with pytest.raises(TypeError):
        CacheConfig(16)  # type: ignore[misc]


def test_an_unknown_argument_is_named_with_the_known_ones():
    with pytest.raises(InvalidEngineArgumentError, match="unknown argument.*blocksize.*block_size") as info:
        LLM(MODEL, blocksize=16, progress=False)
    assert info.value.parameter == "blocksize"


def test_an_empty_list_of_prompts_gives_an_empty_list():
    llm = LLM(MODEL, progress=False, num_gpu_blocks_override=8)
    assert llm.generate([]) == [] and llm.generate([], []) == []
