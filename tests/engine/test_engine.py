"""The serving engine: greedy outputs must not depend on caching, preemption, chunking or batching."""

import pytest
import torch

from nanoengine import LLM, SamplingParams

pytestmark = pytest.mark.model

QUESTIONS = [
    "What is the capital of Japan?",
    "Name three primary colors.",
    "Write a haiku about the sea.",
    "What is 12 times 12?",
    "Explain what a KV cache is in one sentence.",
    "Give me a synonym for happy.",
    "What do bees make?",
    "How many legs does a spider have?",
]
GREEDY = SamplingParams(temperature=0, max_tokens=24)


def assert_no_leak(llm: LLM) -> None:
    kv = llm.engine.kv_cache_manager
    assert not kv.coordinator.single_type_managers[0].req_to_blocks, "a finished request still holds blocks"
    assert kv.block_pool.get_num_free_blocks() == llm.kv_cache.num_blocks - 1
    assert not llm.engine.has_unfinished_requests()


@pytest.fixture(scope="module")
def prompts(llm):
    return _prompts(llm)


@pytest.fixture(scope="module")
def reference(llm, prompts):
    """One request at a time on a fresh cache: the outputs every other configuration must equal."""
    llm.reset_prefix_cache()
    outs = [llm.generate(p, GREEDY)[0].token_ids for p in prompts]
    assert_no_leak(llm)
    return outs


def make_llm(**kwargs) -> LLM:
    return LLM(progress=False, **kwargs)


def test_batched_equals_one_at_a_time(llm, prompts, reference):
    outs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == reference
    assert all(o.num_cached_tokens > 0 for o in outs)  # the reference run left the prefixes cached
    assert_no_leak(llm)


def _prompts(llm):
    # A shared system prompt makes requests overlap by whole blocks, so caching has work to do.
    system = "You are a concise assistant for a course on inference engines. Answer in one short sentence."
    return [
        llm.tokenizer.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": q}])
        for q in QUESTIONS
    ]


def test_prefix_caching_off_matches_reference(reference):
    llm = make_llm(enable_prefix_caching=False)
    outs = llm.generate(_prompts(llm), GREEDY)
    assert [o.token_ids for o in outs] == reference
    assert all(o.num_cached_tokens == 0 for o in outs)
    assert llm.get_stats().prefix_cache_hits == 0
    assert_no_leak(llm)


def test_tiny_pool_preempts_and_still_matches(reference):
    # 13 usable blocks (208 tokens) for 8 requests of ~70 tokens growing by 24: they cannot all fit.
    llm = make_llm(num_gpu_blocks_override=14)
    outs = llm.generate(_prompts(llm), GREEDY)
    assert llm.get_stats().num_preemptions > 0
    assert [o.token_ids for o in outs] == reference
    assert_no_leak(llm)


@pytest.mark.parametrize("threshold", [16, 64, 0])
def test_chunked_prefill_matches(reference, threshold):
    llm = make_llm(long_prefill_token_threshold=threshold, max_num_batched_tokens=96)
    outs = llm.generate(_prompts(llm), GREEDY)
    assert [o.token_ids for o in outs] == reference
    assert_no_leak(llm)


def test_block_aligned_fully_cached_prompt_recomputes_last_block(llm):
    ids = llm.tokenizer.encode("one two three four five six seven eight nine ten " * 4)[:48]
    first = llm.generate(prompt_token_ids=ids, sampling_params=GREEDY)[0]
    second = llm.generate(prompt_token_ids=ids, sampling_params=GREEDY)[0]
    assert second.num_cached_tokens == 32  # the num_tokens-1 rule: the last block is computed again
    assert second.token_ids == first.token_ids
    assert_no_leak(llm)


def test_stop_strings_streaming_and_stats(llm, golden):
    """Golden text, cpu/float32 (see tests/conftest.py)."""
    params = SamplingParams(temperature=0, max_tokens=32, stop=["Tokyo"])
    out = llm.chat("What is the capital of Japan?", params)
    assert out.text == "The capital of Japan is " and out.finish_reason == "stop"
    pieces = list(llm.stream(llm.apply_chat_template("What is the capital of Japan?"), GREEDY))
    assert len(pieces) > 3 and "".join(pieces) == "The capital of Japan is Tokyo."
    stats = llm.get_stats()
    assert 0 < stats.prefix_cache_hit_rate <= 1 and stats.num_steps > 0
    assert out.arrival_time <= out.first_token_time <= out.finish_time
    assert_no_leak(llm)


def test_seeded_sampling_is_independent_of_the_batch(llm, prompts):
    params = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, max_tokens=16, seed=11)
    alone = llm.generate(prompts[0], params)[0].token_ids
    together = llm.generate(prompts[:4], [params, GREEDY, GREEDY, GREEDY])[0].token_ids
    assert alone == together


@pytest.mark.reference
def test_greedy_continuations_equal_hf(llm, hf_model):
    """8 chat prompts of about 40 tokens, 32 new tokens each, batched through the paged engine."""
    prompts = [llm.apply_chat_template(q) for q in QUESTIONS]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=32))
    for prompt, out in zip(prompts, outs):
        ids = llm.tokenizer.encode(prompt)
        assert 35 <= len(ids) <= 45
        with torch.no_grad():
            hf = hf_model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False, pad_token_id=2)
        assert out.token_ids == hf[0, len(ids) :].tolist(), prompt
    assert_no_leak(llm)


def test_custom_block_pool_factory_runs_the_engine(reference):
    """The plug-in point the course's exercises use: a factory building the engine's BlockPool."""
    from nanoengine.core import BlockPool, FreeKVCacheBlockQueue

    built = []

    class CountingQueue(FreeKVCacheBlockQueue):
        def popleft_n(self, n):
            built.append(n)
            return super().popleft_n(n)

    llm = make_llm(block_pool=lambda n, caching: BlockPool(n, caching, free_queue_cls=CountingQueue))
    assert [o.token_ids for o in llm.generate(_prompts(llm), GREEDY)] == reference
    assert sum(built) > 0
    assert_no_leak(llm)


def test_cache_salt_isolates_tenants(llm, prompts):
    llm.reset_prefix_cache()
    llm.generate(prompts[0], GREEDY, cache_salt="alice")
    assert llm.generate(prompts[0], GREEDY, cache_salt="bob")[0].num_cached_tokens == 0
    assert llm.generate(prompts[0], GREEDY, cache_salt="alice")[0].num_cached_tokens > 0
    assert_no_leak(llm)


def test_outputs_have_vllms_shape_and_the_short_forms_are_aliases(llm, golden):
    from nanoengine import CompletionOutput, RequestOutput

    out = llm.generate(
        llm.apply_chat_template("What is the capital of Japan?"),
        SamplingParams(temperature=0, max_tokens=32, stop=["Tokyo"]),
    )[0]
    assert isinstance(out, RequestOutput) and out.finished and out.prompt_logprobs is None
    (completion,) = out.outputs
    assert isinstance(completion, CompletionOutput) and completion.index == 0 and completion.finished()
    assert completion.text == out.text == "The capital of Japan is " and completion.stop_reason == "Tokyo"
    assert completion.token_ids == out.token_ids and completion.finish_reason == out.finish_reason == "stop"
    assert completion.cumulative_logprob is None and completion.logprobs is None
    assert out.metrics.arrival_time == out.arrival_time <= out.metrics.first_token_time <= out.metrics.finish_time
    capped = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=3))[0]
    assert capped.outputs[0].finish_reason == "length" and capped.outputs[0].stop_reason is None


def test_detokenizing_never_decodes_the_whole_output_and_stops_span_tokens(llm, golden, monkeypatch):
    def whole_decode(*args, **kwargs):
        raise AssertionError("the engine decoded the whole output again (O(n^2) over a generation)")

    monkeypatch.setattr(llm.tokenizer, "decode", whole_decode)
    # "of Ja" starts inside one token and ends inside another.
    out = llm.chat("What is the capital of Japan?", SamplingParams(temperature=0, max_tokens=32, stop=["of Ja"]))
    assert out.text == "The capital " and out.outputs[0].stop_reason == "of Ja"
