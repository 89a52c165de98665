"""Chapter 04's hash-chain explorer shows the engine's real hashes and the hit the engine really gets."""

import pytest

from nanocourse.hash_chains import HashChainExplorer, block_chain
from nanoengine import SamplingParams
from nanoengine.core import NONE_HASH, hash_block_tokens

pytestmark = pytest.mark.model

SYSTEM = "You are a helpful assistant. Answer briefly and politely, and say when you are unsure. " * 2
Q_A = "What is RAM, and how does it differ from the storage in a laptop's solid state drive?"
Q_B = "Why is the sky blue during the day but red and orange when the sun sets in the evening?"


def test_chain_is_the_engines_hash_chain():
    tokens = list(range(40))
    chain = block_chain(tokens, 16)
    assert len(chain) == 2
    assert chain[0] == hash_block_tokens(NONE_HASH, tokens[:16])
    assert chain[1] == hash_block_tokens(chain[0], tokens[16:32])


def test_explorer_marks_shared_links_and_predicts_the_engines_hit(llm):
    ex = HashChainExplorer(llm.tokenizer, SYSTEM + Q_A, SYSTEM + Q_B)
    shared = [link.shared for link in ex.links_b]
    assert shared[0] and not shared[-1]
    assert shared == sorted(shared, reverse=True), "once a link differs, every later link differs"
    assert "table" in ex.view.value and f"{ex.cached_tokens} tokens" in ex.summary.value

    llm.reset_prefix_cache()
    llm.generate(SYSTEM + Q_A, SamplingParams(temperature=0, max_tokens=1))
    out = llm.generate(SYSTEM + Q_B, SamplingParams(temperature=0, max_tokens=1))[0]
    assert out.num_cached_tokens == ex.cached_tokens


def test_salt_on_b_breaks_every_link(llm):
    ex = HashChainExplorer(llm.tokenizer, SYSTEM, SYSTEM)
    assert all(link.shared for link in ex.links_b)
    ex.salt_b.value = "tenant-b"
    assert not any(link.shared for link in ex.links_b)
