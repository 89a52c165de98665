"""SamplingParams validation and the sampler's filters."""

import pytest
import torch

from nanoengine.errors import InvalidRequestError
from nanoengine.sample.sampler import make_generator, sample
from nanoengine.sampling_params import SamplingParams


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"max_tokens": 0}, "max_tokens must be an integer >= 1"),
        ({"temperature": -0.1}, r"temperature must be a finite number in \[0.0, 2.0\]"),
        ({"temperature": 2.5}, r"temperature must be a finite number in \[0.0, 2.0\]"),
        ({"temperature": float("nan")}, "temperature .* got nan"),
        ({"top_p": 0.0}, r"top_p must be a finite number in \(0.0, 1.0\]"),
        ({"top_p": 1.5}, r"top_p must be a finite number in \(0.0, 1.0\]"),
        ({"top_k": -2}, "top_k must be an integer >= -1.* 0 or -1 disables it"),
        ({"stop": [""]}, "stop must be a string or a list of non-empty strings"),
        ({"stop": 5}, "stop must be a string or a list of non-empty strings, got 5"),
        ({"n": 0}, r"n must be an integer in \[1, 16384\]"),
        ({"seed": "abc"}, "seed must be an integer"),
        ({"max_tokens": True}, "max_tokens must be an integer >= 1, got True"),
    ],
)
def test_invalid_params_raise_one_documented_error(kwargs, match):
    with pytest.raises(InvalidRequestError, match=match):
        SamplingParams(**kwargs)


def test_defaults_mirror_vllm():
    p = SamplingParams(stop="###")
    assert (p.temperature, p.top_p, p.top_k, p.max_tokens, p.stop, p.n) == (1.0, 1.0, -1, 16, ["###"], 1)
    assert SamplingParams(temperature=0).greedy and not p.greedy


def _draws(logits, params, n=400, seed=0):
    gen = make_generator(seed)
    return {sample(logits[None], [params], [gen])[0] for _ in range(n)}


def test_top_k_and_top_p_restrict_the_support():
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0])  # probs ~ .64 .23 .09 .03 .01
    assert _draws(logits, SamplingParams(top_k=2)) == {0, 1}
    assert _draws(logits, SamplingParams(top_p=0.8)) == {0, 1}
    assert _draws(logits, SamplingParams(top_p=0.5)) == {0}
    assert _draws(logits, SamplingParams(top_p=1e-300)) == {0}, "a top_p that float32 rounds to 0 keeps the top token"
    assert _draws(logits, SamplingParams(temperature=2.0)) == {0, 1, 2, 3, 4}
    assert _draws(logits, SamplingParams(top_k=0)) == _draws(logits, SamplingParams(top_k=-1)), "0 disables, as in vLLM"


def test_greedy_and_seeded_sampling_are_reproducible():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(temperature=0), SamplingParams(seed=7), SamplingParams(seed=7)]
    a = sample(logits, params, [None, make_generator(7), make_generator(7)])
    assert a[0] == int(logits[0].argmax())
    b = sample(logits, params, [None, make_generator(7), make_generator(7)])
    assert a == b


def _held(llm) -> int:
    pool = llm.engine.kv_cache_manager.block_pool
    return pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()


def _peak_blocks(llm, prompts, params) -> int:
    for prompt in prompts:
        for i in range(params.n):
            llm.engine.add_request(prompt, params.child(i))
    peak = 0
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
        peak = max(peak, _held(llm))
    return peak


def test_n_samples_share_the_prompts_blocks_and_seeds_make_them_reproducible():
    from nanoengine import LLM
    from nanoengine.config import LlamaConfig
    from nanoengine.model import LlamaForCausalLM

    model = LlamaForCausalLM.random(LlamaConfig.tiny(max_position_embeddings=1024), seed=0, std=0.2)
    prompt = [(7 * i) % 200 + 3 for i in range(500)]  # 31 full blocks of 16 and 4 tokens
    params = SamplingParams(temperature=1.0, max_tokens=20, n=4, seed=1, ignore_eos=True)
    llm = LLM(model, block_size=16, num_gpu_blocks_override=300)
    # The prompt's 31 full blocks once, plus each sample's own: its partial block and one more (520 tokens).
    assert _peak_blocks(llm, [prompt], params) == 31 + 4 * 2
    separate = LLM(model, block_size=16, num_gpu_blocks_override=300, enable_prefix_caching=False)
    assert _peak_blocks(separate, [prompt] * 4, params.child(0)) == 4 * 33

    (out,) = llm.generate(prompt_token_ids=prompt, sampling_params=params)
    assert [c.index for c in out.outputs] == [0, 1, 2, 3] and len({tuple(c.token_ids) for c in out.outputs}) == 4
    (again,) = llm.generate(prompt_token_ids=prompt, sampling_params=params)
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in out.outputs]
    assert params.child(2).seed == 3 and params.child(2).n == 1  # vLLM: sample i draws with seed + i
    assert _held(llm) == 0
