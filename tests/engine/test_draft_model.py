"""Draft-model speculative decoding (speculative_config={"method": "draft_model", ...}).

Two references make it testable without a trained draft. A random draft rejects almost everything, so greedy
outputs must equal those with speculation off. A model drafting for itself must have every draft accepted:
its drafts are the target's own greedy tokens, so a single wrong slot of the draft's KV (a chunk it skipped, a
prefix hit or a recompute whose KV it lacks) shows up as a rejection. Both run under chunked prefill,
preemption, prefix hits, max_model_len and max_tokens cuts, and after each no block leaks.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from nanoengine import LLM, SamplingParams
from nanoengine.config import LlamaConfig
from nanoengine.core.sched.output import PLACEHOLDER_TOKEN_ID
from nanoengine.core.sched.scheduler import Scheduler
from nanoengine.errors import InvalidEngineArgumentError
from nanoengine.model import LlamaForCausalLM
from nanoengine.model.loader import embedded_gguf_path

# Untied embeddings: a tied random model only repeats its last token, which any draft guesses.
TARGET = LlamaForCausalLM.random(LlamaConfig.tiny(tie_word_embeddings=False), seed=0)
DRAFT = LlamaForCausalLM.random(
    LlamaConfig.tiny(
        num_hidden_layers=1, hidden_size=24, num_attention_heads=3, num_key_value_heads=1, tie_word_embeddings=False
    ),
    seed=1,
)
K = 3
PROMPTS = [[(7 * i + 3 * j) % 256 for j in range(n)] for i, n in enumerate((5, 17, 40, 3, 23))]
GREEDY = SamplingParams(temperature=0, max_tokens=30)


def spec(model, k=K) -> dict:
    return {"method": "draft_model", "model": model, "num_speculative_tokens": k}


def tiny_llm(speculative_config=None, **kwargs) -> LLM:
    args = {"block_size": 4, "num_gpu_blocks_override": 96, "progress": False}
    return LLM(TARGET, speculative_config=speculative_config, **(args | kwargs))


def token_ids(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


def assert_no_leak(llm: LLM) -> None:
    pool = llm.engine.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == llm.kv_cache.num_blocks - 1, "every non-null block is back"
    assert not llm.engine.has_unfinished_requests()


SETTINGS = {
    "plain": {},
    "chunked": {"max_num_batched_tokens": 8},  # prompts in chunks, drafts cut by the budget
    "preempted": {"num_gpu_blocks_override": 30},  # 116 tokens: the five requests outgrow the pool
    "short": {"max_model_len": 48},  # drafts and lookahead cut at max_model_len
}


@pytest.fixture(scope="module")
def plain():
    return {
        name: token_ids(tiny_llm(**kwargs).generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY))
        for name, kwargs in SETTINGS.items()
    }


@pytest.mark.parametrize("name", SETTINGS)
def test_a_random_draft_keeps_greedy_outputs(plain, name):
    llm = tiny_llm(spec(DRAFT), **SETTINGS[name])
    outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY)
    assert token_ids(outs) == plain[name], f"{name}: greedy tokens with a random draft differ from without"
    stats = llm.get_stats()
    assert stats.num_draft_tokens > 50 and stats.num_accepted_tokens < stats.num_draft_tokens
    if name == "preempted":
        assert stats.num_preemptions > 0
    assert_no_leak(llm)


def count_placeholders(llm: LLM) -> list[int]:
    """A one-item list that counts the placeholder drafts llm's scheduler plans from now on. A new one-token
    request (a prefix hit of all but one token) is padded with them, which vLLM's stats count as drafts and no
    verify step accepts: tests leave them out."""
    placeholders, schedule = [0], llm.engine.scheduler.schedule

    def counting():
        out = schedule()
        placeholders[0] += sum(d.count(PLACEHOLDER_TOKEN_ID) for d in out.scheduled_spec_decode_tokens.values())
        return out

    llm.engine.scheduler.schedule = counting
    return placeholders


@pytest.mark.parametrize("name", SETTINGS)
def test_a_model_drafting_for_itself_has_every_draft_accepted(plain, name):
    llm = tiny_llm(spec(TARGET), **SETTINGS[name])
    placeholders = count_placeholders(llm)
    for round in ("cold", "prefix hits"):
        outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY)
        assert token_ids(outs) == plain[name], f"{name}, {round}: greedy tokens differ from without speculation"
        stats = llm.get_stats()
        assert stats.num_draft_tokens > 50
        assert stats.num_accepted_tokens == stats.num_draft_tokens - placeholders[0], (
            f"{name}, {round}: {stats.num_draft_tokens - placeholders[0] - stats.num_accepted_tokens} of "
            f"{stats.num_draft_tokens - placeholders[0]} self-drafts rejected, so some slot of the draft's KV is not "
            "the target's token"
        )
        assert_no_leak(llm)
    hits = [o.num_cached_tokens > 0 for o in outs]
    # In the small pool the last requests' blocks push out the first ones'.
    assert any(hits) if name == "preempted" else hits == [len(p) > 4 for p in PROMPTS], f"{name}: prefix hits {hits}"


def test_the_scheduler_reserves_k_lookahead_slots(monkeypatch):
    llm = tiny_llm(spec(DRAFT), max_model_len=48)
    assert llm.engine.scheduler.config.num_lookahead_tokens == K
    assert tiny_llm({"method": "ngram", "num_speculative_tokens": K}).engine.scheduler.config.num_lookahead_tokens == 0
    kv, calls = llm.engine.kv_cache_manager, []
    allocate = kv.allocate_slots

    def spy(request, num_new_tokens, num_new_computed_tokens=0, *args, **kwargs):
        end = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        calls.append((end, kwargs["num_lookahead_tokens"]))
        return allocate(request, num_new_tokens, num_new_computed_tokens, *args, **kwargs)

    monkeypatch.setattr(kv, "allocate_slots", spy)
    llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY)
    assert calls and all(lookahead == min(K, 48 - end) for end, lookahead in calls), calls
    assert any(lookahead == K for _, lookahead in calls) and any(lookahead < K for _, lookahead in calls)


class NoLookaheadScheduler(Scheduler):
    """A scheduler of one's own that reserves no lookahead slots."""

    def lookahead(self, request, num_new_tokens, num_computed_tokens=None) -> int:
        return 0


def test_a_scheduler_without_lookahead_gets_fewer_drafts_and_the_same_tokens(plain):
    # k + 1 = 5 tokens a step against blocks of 4: a step's new token and drafts often cross into a block
    # the scheduler did not grant.
    llm = tiny_llm(spec(TARGET, k=4), scheduler_cls=NoLookaheadScheduler)
    outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY)
    assert token_ids(outs) == plain["plain"]
    full = tiny_llm(spec(TARGET, k=4))
    full.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY)
    stats = llm.get_stats()
    assert 0 < stats.num_draft_tokens < full.get_stats().num_draft_tokens, "drafts stop at the request's blocks"
    assert stats.num_accepted_tokens == stats.num_draft_tokens
    assert_no_leak(llm)


def test_sampled_requests_and_max_tokens():
    llm = tiny_llm(spec(DRAFT))
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=m) for i, m in enumerate((1, 2, 7, 30, 11))]
    outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params)
    assert [len(o.outputs[0].token_ids) for o in outs] == [1, 2, 7, 30, 11]
    again = tiny_llm(spec(DRAFT)).generate(prompt_token_ids=PROMPTS, sampling_params=params)
    assert token_ids(again) == token_ids(outs), "seeded requests draw the same tokens"
    assert_no_leak(llm)


@pytest.mark.parametrize("drafter", ["draft_model", "eagle"])
def test_logprobs_prompt_logprobs_and_n_are_those_without_drafts(drafter):
    from nanoengine.model.llama_eagle import EagleLlamaForCausalLM

    model = DRAFT if drafter == "draft_model" else EagleLlamaForCausalLM.random(TARGET, seed=4)
    params = SamplingParams(temperature=0, max_tokens=12, logprobs=2, prompt_logprobs=1, n=2)
    want = tiny_llm().generate(prompt_token_ids=PROMPTS[:3], sampling_params=params)
    llm = tiny_llm({"method": drafter, "model": model, "num_speculative_tokens": K})
    got = llm.generate(prompt_token_ids=PROMPTS[:3], sampling_params=params)
    assert llm.get_stats().num_draft_tokens > 0
    for g, w in zip(got, want):
        assert [c.token_ids for c in g.outputs] == [c.token_ids for c in w.outputs] == [w.outputs[0].token_ids] * 2
        for gc, wc in zip(g.outputs, w.outputs):
            for a, b in zip(gc.logprobs, wc.logprobs):
                assert a.keys() == b.keys() and all(abs(a[t].logprob - b[t].logprob) < 1e-4 for t in a)
        assert [p and p.keys() for p in g.prompt_logprobs] == [p and p.keys() for p in w.prompt_logprobs]
    assert_no_leak(llm)


def test_a_failing_draft_pass_aborts_the_call_and_the_next_one_runs(plain, monkeypatch):
    llm = tiny_llm(spec(TARGET))
    drafter = llm.engine.runner.drafter
    step, calls = drafter.draft_step, []

    def failing(*args):
        calls.append(1)
        if len(calls) == 5:
            raise RuntimeError("draft pass failed")
        return step(*args)

    monkeypatch.setattr(drafter, "draft_step", failing)
    with pytest.raises(RuntimeError, match="draft pass failed"):
        llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY)
    assert_no_leak(llm)
    placeholders = count_placeholders(llm)
    assert token_ids(llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY)) == plain["plain"]
    stats = llm.get_stats()
    assert stats.num_accepted_tokens == stats.num_draft_tokens - placeholders[0], (
        "no KV the failed step left unwritten is reused"
    )


@pytest.mark.parametrize(
    "bad, words",
    [
        ({"method": "draft_model", "num_speculative_tokens": 2}, 'needs "model"'),
        (spec(DRAFT) | {"prompt_lookup_min": 2}, "n-gram lengths"),
        ({"method": "ngram", "num_speculative_tokens": 2, "model": DRAFT}, '"ngram" method does not use'),
        (spec(3), "expected a GGUF path or a LlamaForCausalLM"),
        (spec("/no/such/draft.gguf"), "No model file at '/no/such/draft.gguf'"),
        (spec(LlamaForCausalLM.random(LlamaConfig.tiny(vocab_size=128), seed=0)), "vocabulary has 128 tokens"),
        (spec(LlamaForCausalLM.random(LlamaConfig.tiny(), seed=0, dtype=torch.float64)), "move it with"),
        (spec(LlamaForCausalLM.random(LlamaConfig.tiny(max_position_embeddings=64), seed=0)), "fewer than"),
        (
            spec(LlamaForCausalLM.random(LlamaConfig.tiny_hybrid(sliding_window=8), seed=0)),
            "full-attention models only",
        ),
    ],
)
def test_a_bad_draft_is_refused_by_name(bad, words):
    with pytest.raises(InvalidEngineArgumentError, match=words) as info:
        tiny_llm(bad)
    assert info.value.parameter == "speculative_config"


@pytest.mark.model
def test_smollm2_drafting_for_itself(llm):
    prompts = [llm.apply_chat_template(q) for q in ("What is the capital of France?", "List three prime numbers.")]
    greedy = SamplingParams(temperature=0, max_tokens=24)
    spec_llm = LLM(progress=False, speculative_config=spec(str(embedded_gguf_path())))
    assert spec_llm.draft_model is spec_llm.model, "one copy of the weights serves both"
    assert spec_llm.kv_cache.num_blocks < llm.kv_cache.num_blocks, "the draft's layers share the KV budget"
    outs = spec_llm.generate(prompts, greedy)
    assert [o.text for o in outs] == [o.text for o in llm.generate(prompts, greedy)]
    stats = spec_llm.get_stats()
    assert stats.num_accepted_tokens == stats.num_draft_tokens > 0 and stats.num_steps < 24
    assert_no_leak(spec_llm)


@pytest.mark.triton
def test_draft_passes_run_through_the_triton_kernels():
    pytest.importorskip("triton", reason="the Triton backend needs triton; make test-no-triton runs without it")
    # The kernels take head_dim >= 16.
    model = LlamaForCausalLM.random(LlamaConfig.tiny(hidden_size=96, head_dim=16, tie_word_embeddings=False), seed=2)
    params = SamplingParams(temperature=0, max_tokens=10)
    want = token_ids(
        LLM(model, block_size=8, num_gpu_blocks_override=32, progress=False).generate(
            prompt_token_ids=PROMPTS[:2], sampling_params=params
        )
    )
    llm = LLM(
        model,
        block_size=8,
        num_gpu_blocks_override=32,
        progress=False,
        attention_backend="triton",
        speculative_config=spec(model),
    )
    assert token_ids(llm.generate(prompt_token_ids=PROMPTS[:2], sampling_params=params)) == want
    stats = llm.get_stats()
    assert stats.num_accepted_tokens == stats.num_draft_tokens > 0
    assert_no_leak(llm)


@pytest.mark.gpu
@pytest.mark.parametrize("drafter", ["draft_model", "eagle"])
def test_gpu_drafters_beside_cuda_graphs(drafter):
    """On CUDA a draft model runs eagerly beside the target's replayed pure-decode graphs, and drafting for itself
    keeps the greedy tokens with every draft accepted (fp32). An EAGLE head reads each step's hidden states, so
    no step replays a graph; greedy tokens stay."""
    from nanoengine.model.llama_eagle import EagleLlamaForCausalLM

    config = dataclasses.replace(LlamaConfig.smollm2_135m(), tie_word_embeddings=False)
    model = LlamaForCausalLM.random(config, std=0.02, device="cuda", dtype=torch.float32)
    prompts = [[5, 6, 7, 8] * 6, list(range(100, 140))]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    want = token_ids(
        LLM(model, kv_cache_memory_bytes=2**30, progress=False).generate(
            prompt_token_ids=prompts, sampling_params=params
        )
    )
    if drafter == "eagle":
        speculative = {"method": "eagle", "model": EagleLlamaForCausalLM.random(model), "num_speculative_tokens": 3}
    else:
        speculative = spec(model, k=4)
    llm = LLM(model, kv_cache_memory_bytes=2**30, progress=False, speculative_config=speculative)
    assert (llm.engine.runner.cuda_graphs is None) == (drafter == "eagle")
    assert token_ids(llm.generate(prompt_token_ids=prompts, sampling_params=params)) == want
    stats = llm.get_stats()
    if drafter == "eagle":
        assert stats.num_draft_tokens > 0
    else:
        assert stats.num_accepted_tokens == stats.num_draft_tokens > 0 and stats.num_steps < 24
    assert_no_leak(llm)
