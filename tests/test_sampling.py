"""SamplingParams validation and the sampler's filters."""

import pytest
import torch

from nanoengine.errors import InvalidRequestError
from nanoengine.sampler import make_generator, sample
from nanoengine.sampling_params import SamplingParams


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"max_tokens": 0}, "max_tokens must be an integer >= 1"),
        ({"temperature": -0.1}, "temperature must be >= 0"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
        ({"top_k": 0}, "top_k must be -1"),
        ({"top_k": -2}, "top_k must be -1"),
        ({"stop": [""]}, "stop must be non-empty"),
    ],
)
def test_invalid_params_raise_one_documented_error(kwargs, match):
    with pytest.raises(InvalidRequestError, match=match):
        SamplingParams(**kwargs)


def test_defaults_mirror_vllm():
    p = SamplingParams(stop="###")
    assert (p.temperature, p.top_p, p.top_k, p.max_tokens, p.stop) == (1.0, 1.0, -1, 16, ["###"])
    assert SamplingParams(temperature=0).greedy and not p.greedy


def _draws(logits, params, n=400, seed=0):
    gen = make_generator(seed)
    return {sample(logits[None], [params], [gen])[0] for _ in range(n)}


def test_top_k_and_top_p_restrict_the_support():
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0])  # probs ~ .64 .23 .09 .03 .01
    assert _draws(logits, SamplingParams(top_k=2)) == {0, 1}
    assert _draws(logits, SamplingParams(top_p=0.8)) == {0, 1}
    assert _draws(logits, SamplingParams(top_p=0.5)) == {0}
    assert _draws(logits, SamplingParams(temperature=5.0)) == {0, 1, 2, 3, 4}


def test_greedy_and_seeded_sampling_are_reproducible():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(temperature=0), SamplingParams(seed=7), SamplingParams(seed=7)]
    a = sample(logits, params, [None, make_generator(7), make_generator(7)])
    assert a[0] == int(logits[0].argmax())
    b = sample(logits, params, [None, make_generator(7), make_generator(7)])
    assert a == b
