"""Chapter 01's tools, driven from Python: the attention recorder, cached and uncached generation, and
the KV-memory calculator checked against the pool the real engine allocates."""

import pytest

from nanocourse.kv_memory import (
    BUDGETS,
    KVMemoryCalculator,
    RecordingAttention,
    forward_step,
    greedy_generate,
    llama_8b,
    llama_70b,
)
from nanoengine.attention import ContiguousKVCache
from nanoengine.config import LlamaConfig
from nanoengine.model import LlamaForCausalLM


@pytest.fixture(scope="module")
def tiny():
    return LlamaForCausalLM.random(LlamaConfig.tiny(), seed=0)


def test_recorder_sees_every_layer_with_gqa_shapes(tiny):
    rec = RecordingAttention(ContiguousKVCache(tiny.config, 8))
    logits = forward_step(tiny, [1, 2, 3, 4, 5], rec)
    assert logits.shape == (tiny.config.vocab_size,)
    assert rec.calls == [(i, (5, 6, 8), (5, 2, 8), (5, 2, 8)) for i in range(2)]


def test_forward_step_fills_the_cache(tiny):
    cache = ContiguousKVCache(tiny.config, 8)
    forward_step(tiny, [1, 2, 3], cache)
    forward_step(tiny, [4], cache)
    assert cache.num_tokens == 4
    assert cache.k[:, :4].abs().sum(-1).gt(0).all() and not cache.k[:, 4:].any()


def test_generation_with_and_without_cache_agree(tiny):
    prompt = [7, 1, 200, 33, 9]
    cached = greedy_generate(tiny, prompt, 6, use_cache=True)
    recomputed = greedy_generate(tiny, prompt, 6, use_cache=False)
    assert cached.token_ids == recomputed.token_ids
    assert cached.rows == [5, 1, 1, 1, 1, 1], "the cache feeds only the new token after the prefill"
    assert recomputed.rows == [5, 6, 7, 8, 9, 10], "without it every step recomputes the whole sequence"
    assert len(cached.step_seconds) == 6 and all(s > 0 for s in cached.step_seconds)


def calculator(config=None):
    presets = {"Llama-3.1-70B": llama_70b(), "Llama-3.1-8B": llama_8b()}
    if config is not None:
        presets = {"SmolLM2-135M": config, **presets}
    return KVMemoryCalculator(presets)


def test_llama_70b_block_is_the_blog_posts_5_24_mb():
    calc = calculator()
    calc.model.value, calc.dtype.value = "Llama-3.1-70B", "fp16"
    assert calc.result.bytes_per_token == 327_680
    assert calc.result.bytes_per_block == 5_242_880
    assert "5,242,880 B (5.24 MB, 5.00 MiB)" in calc.output.value
    calc.budget.value = "the blog post's H100 pool (45 GB)"
    assert calc.result.budget_blocks == 8_582, "8,583 whole blocks in 45e9 bytes, minus the null block"
    assert "8,582 blocks" in calc.summary()


def test_sliders_change_the_displayed_bill():
    calc = calculator()
    calc.model.value, calc.dtype.value, calc.budget.value = "Llama-3.1-8B", "bf16", "80 GiB"
    calc.context.value, calc.batch.value = 8192, 1
    one = calc.result.total_bytes
    calc.batch.value = 4
    assert calc.result.total_bytes == 4 * one
    assert calc.result.bytes_per_block == 2 * 2**20
    assert calc.result.max_batch == 79, "40,959 usable 2 MiB blocks, 512 per 8,192-token request"
    assert calc.result.fits and "fits" in calc.output.value
    calc.batch.value = calc.result.max_batch + 1
    assert not calc.result.fits and "does NOT fit" in calc.output.value
    calc.dtype.value = "fp8"
    assert calc.result.bytes_per_token == 32 * 8 * 128 * 2


def test_context_past_the_model_limit_warns():
    calc = calculator()
    calc.context.value = 131072
    assert not calc.warnings()
    calc.presets["tiny"] = LlamaConfig.tiny()
    calc.model.options = list(calc.presets)
    calc.model.value = "tiny"
    assert calc.warnings() and "⚠" in calc.output.value


@pytest.mark.model
def test_calculator_matches_the_engines_real_pool(llm):
    calc = calculator(llm.config)
    calc.model.value, calc.dtype.value = "SmolLM2-135M", "fp32"
    calc.budget.value = next(k for k, v in BUDGETS.items() if v == 512 * 2**20)
    m = calc.result
    assert m.budget_tokens == llm.num_kv_tokens
    assert m.budget_blocks == llm.kv_cache.num_blocks - 1
    pool_bytes = sum(t.nbytes for t in llm.kv_cache.k_caches + llm.kv_cache.v_caches)
    assert pool_bytes == llm.kv_cache.num_blocks * m.bytes_per_block
    assert f"{llm.num_kv_tokens:,} tokens" in calc.output.value
