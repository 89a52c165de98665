"""bench/spec_decode.py's measure, which chapter 13 also runs live: every configuration keeps speculation off's
greedy tokens, and the copy workload drafts and accepts."""

import pytest

from bench.spec_decode import chat, measure, repetitive
from nanoengine import LLM, SamplingParams


@pytest.mark.model
def test_measure_keeps_greedy_tokens_and_copying_accepts_drafts():
    tok = LLM(progress=False).tokenizer
    params = SamplingParams(temperature=0, max_tokens=12)
    copy = measure(repetitive(tok, 1), params, runs=1, ks=(2,), prompt_lookup=(2, 5))
    assert set(copy) == {"off", "k=2"} and copy["off"]["speedup"] == 1.0
    assert copy["k=2"]["same_tokens_as_off"] and copy["k=2"]["accepted_tokens"] > 0
    assert copy["k=2"]["steps"] < copy["off"]["steps"], "accepted drafts save steps"
    assert measure(chat(tok, 1), params, runs=1, ks=(2,))["k=2"]["same_tokens_as_off"]
