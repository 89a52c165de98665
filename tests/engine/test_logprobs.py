"""Logprobs and prompt logprobs: against HF transformers on the same weights, through chunked
prefill and preemption, and with the prefix cache, which a prompt-logprobs request must not read."""

import pytest
import torch
from tiny_gguf import hf_state_dict

from nanoengine import LLM, SamplingParams
from nanoengine.config import LlamaConfig
from nanoengine.errors import InvalidRequestError
from nanoengine.model import LlamaForCausalLM

TOL = 1e-4
CONFIG = LlamaConfig.tiny()
PROMPT = torch.randint(0, CONFIG.vocab_size, (50,), generator=torch.Generator().manual_seed(3)).tolist()


@pytest.fixture(scope="module")
def models():
    transformers = pytest.importorskip("transformers")
    ours = LlamaForCausalLM.random(CONFIG, std=0.2)  # a trained model's 0.02 gives near-flat logits here
    hf = transformers.LlamaForCausalLM(CONFIG.to_hf()).eval()
    hf.load_state_dict(hf_state_dict(ours))
    return ours, hf


def hf_logprobs(hf, token_ids: list[int]) -> torch.Tensor:
    """[len - 1, V]: row t is the distribution over token t + 1."""
    with torch.no_grad():
        return hf(torch.tensor([token_ids])).logits[0, :-1].float().log_softmax(-1)


def run(model, params, **llm_kwargs):
    llm = LLM(model, progress=False, **llm_kwargs)
    return llm, llm.generate(prompt_token_ids=PROMPT, sampling_params=params)[0]


def assert_entry_matches(entry: dict, token: int, lp: torch.Tensor, k: int):
    assert next(iter(entry)) == token, "the scored token comes first"
    assert entry[token].logprob == pytest.approx(lp[token].item(), abs=TOL)
    assert entry[token].rank == int((lp >= lp[token]).sum())
    top = lp.topk(k)
    for rank, (tid, value) in enumerate(zip(top.indices.tolist(), top.values.tolist()), 1):
        assert entry[tid].logprob == pytest.approx(value, abs=TOL)
        if tid != token:
            assert entry[tid].rank == rank
    assert len(entry) in (k, k + 1)


def test_logprobs_and_prompt_logprobs_match_hf(models):
    ours, hf = models
    _, out = run(ours, SamplingParams(temperature=0, max_tokens=12, logprobs=3, prompt_logprobs=2))
    completion = out.outputs[0]
    lp = hf_logprobs(hf, PROMPT + completion.token_ids)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(PROMPT)
    for t in range(1, len(PROMPT)):
        assert_entry_matches(out.prompt_logprobs[t], PROMPT[t], lp[t - 1], 2)
    assert len(completion.logprobs) == len(completion.token_ids) == 12
    for j, (token, entry) in enumerate(zip(completion.token_ids, completion.logprobs)):
        assert_entry_matches(entry, token, lp[len(PROMPT) - 1 + j], 3)
        assert entry[token].rank == 1, "greedy picks the likeliest token"
    expected = sum(e[t].logprob for t, e in zip(completion.token_ids, completion.logprobs))
    assert completion.cumulative_logprob == pytest.approx(expected)


def test_sampled_logprobs_are_raw_not_tempered(models):
    """vLLM's default: the logits before temperature and top-k, whatever token was drawn."""
    ours, hf = models
    params = SamplingParams(temperature=2.0, top_k=5, seed=1, max_tokens=8, logprobs=0)
    completion = run(ours, params)[1].outputs[0]
    lp = hf_logprobs(hf, PROMPT + completion.token_ids)
    for j, (token, entry) in enumerate(zip(completion.token_ids, completion.logprobs)):
        assert list(entry) == [token]
        assert entry[token].logprob == pytest.approx(lp[len(PROMPT) - 1 + j, token].item(), abs=TOL)


def test_no_logprobs_unless_asked(models):
    out = run(models[0], SamplingParams(temperature=0, max_tokens=4))[1]
    assert out.prompt_logprobs is None
    assert out.outputs[0].logprobs is None and out.outputs[0].cumulative_logprob is None


@pytest.mark.parametrize("value", [-2, 1.5, "3"])
def test_invalid_logprobs_are_refused(value):
    for name in ("logprobs", "prompt_logprobs"):
        with pytest.raises(InvalidRequestError, match=name):
            SamplingParams(**{name: value})


def test_whole_vocabulary(models):
    """-1 asks for every token's logprob, which only max_logprobs=-1 allows (vLLM's rule)."""
    whole = SamplingParams(temperature=0, max_tokens=2, logprobs=-1, prompt_logprobs=-1)
    out = run(models[0], whole, max_logprobs=-1)[1]
    assert all(len(e) == CONFIG.vocab_size for e in out.outputs[0].logprobs)
    assert all(len(e) == CONFIG.vocab_size for e in out.prompt_logprobs[1:])
    llm = LLM(models[0], progress=False, max_logprobs=CONFIG.vocab_size)
    assert llm.generate(prompt_token_ids=PROMPT, sampling_params=whole)[0].prompt_logprobs
    for name, k in (("logprobs", -1), ("prompt_logprobs", 21), ("logprobs", 10**9)):
        with pytest.raises(InvalidRequestError, match=f"{name}={k} asks for more than max_logprobs=20"):
            run(models[0], SamplingParams(**{name: k}))


def test_prompt_logprobs_skip_reading_the_prefix_cache(models):
    """A cached prefix has no logits, so the request recomputes it (and is not counted as a lookup);
    the blocks it computes still serve the next request."""
    ours, _ = models
    plain = SamplingParams(temperature=0, max_tokens=3)
    wants = SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=1)
    llm, first = run(ours, plain)
    assert first.num_cached_tokens == 0
    queries = llm.get_stats().prefix_cache_queries
    second = llm.generate(prompt_token_ids=PROMPT, sampling_params=wants)[0]
    assert second.num_cached_tokens == 0, "a prefix hit would skip the logits prompt logprobs need"
    assert llm.get_stats().prefix_cache_queries == queries, "as in vLLM, a skipped lookup is not counted"
    fresh = run(ours, wants)[1]
    assert [e and e[t].logprob for e, t in zip(second.prompt_logprobs, PROMPT)] == [
        e and e[t].logprob for e, t in zip(fresh.prompt_logprobs, PROMPT)
    ]
    third = llm.generate(prompt_token_ids=PROMPT, sampling_params=plain)[0]
    assert third.num_cached_tokens == 48, "the blocks computed for the logprobs request are cached"


def assert_same_logprobs(out, reference):
    assert out.outputs[0].token_ids == reference.outputs[0].token_ids
    pairs = [
        *zip(out.prompt_logprobs[1:], reference.prompt_logprobs[1:]),
        *zip(out.outputs[0].logprobs, reference.outputs[0].logprobs),
    ]
    assert len(pairs) == len(reference.prompt_logprobs) - 1 + len(reference.outputs[0].logprobs)
    for got, want in pairs:
        assert got.keys() == want.keys()
        assert all(got[t].logprob == pytest.approx(want[t].logprob, abs=TOL) for t in got)


def test_prompt_logprobs_survive_chunked_prefill_and_preemption(models):
    ours, _ = models
    params = SamplingParams(temperature=0, max_tokens=20, logprobs=1, prompt_logprobs=1)
    assert_same_logprobs(run(ours, params, max_num_batched_tokens=16)[1], run(ours, params)[1])
    # Two 40-token prompts take 3 blocks each of the 6 usable; growing to 60 tokens, one is preempted
    # and recomputed from scratch (its prompt logprobs once more), yet the output is the same.
    prompts = [PROMPT[:40], PROMPT[10:]]
    small = LLM(ours, progress=False, num_gpu_blocks_override=7)
    outs = small.generate(prompt_token_ids=prompts, sampling_params=params)
    assert small.get_stats().num_preemptions > 0
    for prompt, out in zip(prompts, outs):
        assert_same_logprobs(
            out, LLM(ours, progress=False).generate(prompt_token_ids=prompt, sampling_params=params)[0]
        )


@pytest.mark.model
def test_decoded_tokens_spell_the_text(llm):
    out = llm.generate(
        "The capital of France is", SamplingParams(temperature=0, max_tokens=8, logprobs=2, prompt_logprobs=1)
    )[0]
    completion = out.outputs[0]
    assert "".join(e[t].decoded_token for t, e in zip(completion.token_ids, completion.logprobs)) == completion.text
    assert (
        "".join(e[t].decoded_token for t, e in zip(out.prompt_token_ids[1:], out.prompt_logprobs[1:]))
        == " capital of France is"
    )


def test_a_manager_that_reads_the_cache_anyway_gets_a_clear_error(models, monkeypatch):
    """A KV cache manager plugged in through the seam that ignores skip_reading_prefix_cache would
    leave the cached positions without logprobs; the runner says so instead of returning fewer."""
    from nanoengine.request import Request

    llm, _ = run(models[0], SamplingParams(temperature=0, max_tokens=2))
    monkeypatch.setattr(Request, "skip_reading_prefix_cache", property(lambda self: False))
    with pytest.raises(InvalidRequestError, match="skip_reading_prefix_cache"):
        llm.generate(prompt_token_ids=PROMPT, sampling_params=SamplingParams(max_tokens=2, prompt_logprobs=0))


@pytest.mark.model
@pytest.mark.reference
def test_real_model_logprobs_match_hf(llm, hf_model):
    params = SamplingParams(temperature=0, max_tokens=10, logprobs=5, prompt_logprobs=5)
    out = llm.generate("The capital of France is", params)[0]
    if (llm.device.type, llm.dtype) != (torch.device("cpu").type, torch.float32):
        pytest.skip(f"the 1e-4 bar is for fp32; this engine runs {llm.device.type}/{llm.dtype}")
    completion = out.outputs[0]
    lp = hf_logprobs(hf_model, out.prompt_token_ids + completion.token_ids)
    for t in range(1, len(out.prompt_token_ids)):
        assert_entry_matches(out.prompt_logprobs[t], out.prompt_token_ids[t], lp[t - 1], 5)
    for j, (token, entry) in enumerate(zip(completion.token_ids, completion.logprobs)):
        assert_entry_matches(entry, token, lp[len(out.prompt_token_ids) - 1 + j], 5)
