"""Chapter 00 graded tasks: prompts, tokens and blocks. Run with `make grade CH=00`."""

import functools

import pytest

from nanoengine.core import KVCacheManager, get_request_block_hasher
from nanocourse.hash_chains import block_chain
from nanoengine.model.loader import unpacked_folder
from nanoengine.request import Request
from nanoengine.model.tokenizer import Tokenizer

CHAPTER = "ch00_tour"


@functools.cache
def _tokenizer():
    return Tokenizer(unpacked_folder(None, progress=False)[1])


def _engine_shared_blocks(ids_a, ids_b, block_size):
    a, b = block_chain(list(ids_a), block_size), block_chain(list(ids_b), block_size)
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _engine_cached_tokens(prompt_len, shared_prefix_tokens, block_size):
    """Ask the real KV cache manager: cache a request holding the shared prefix, then look up."""
    hasher = get_request_block_hasher(block_size)
    kv = KVCacheManager(block_size, 1 + 2 * (prompt_len // block_size + 2))
    first = Request("first", list(range(1, shared_prefix_tokens + 1)) + [0], block_hasher=hasher)
    kv.allocate_slots(first, first.num_tokens)
    kv.free(first)
    second = Request("second", (list(range(1, shared_prefix_tokens + 1)) + [7] * prompt_len)[:prompt_len],
                     block_hasher=hasher)
    return kv.get_computed_blocks(second)[1]


NANOENGINE = {
    "render_chatml": lambda messages: _tokenizer().apply_chat_template(messages),
    "shared_prefix_blocks": _engine_shared_blocks,
    "expected_cached_tokens": _engine_cached_tokens,
}


@pytest.mark.task("00.1", "render_chatml matches SmolLM2's chat template")
def test_chatml(impl):
    assert impl.render_chatml([{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"), "SmolLM2's format, written out by hand"
    tok = _tokenizer()
    for messages in (
        [{"role": "user", "content": "What is the capital of Japan?"}],
        [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}],
    ):
        assert impl.render_chatml(messages) == tok.apply_chat_template(messages)


@pytest.mark.task("00.2", "shared_prefix_blocks counts identical leading full blocks")
def test_shared_blocks(impl):
    a = list(range(50))
    assert impl.shared_prefix_blocks(a, a, 16) == 3
    assert impl.shared_prefix_blocks(a, a[:40] + [0] * 10, 16) == 2
    assert impl.shared_prefix_blocks(a, [99] + a[1:], 16) == 0
    assert impl.shared_prefix_blocks(a, a[:20], 16) == 1, "only full blocks count"


@pytest.mark.task("00.3", "expected_cached_tokens follows whole blocks and the last-token rule")
def test_expected_cached(impl):
    assert impl.expected_cached_tokens(100, 60, 16) == 48
    assert impl.expected_cached_tokens(64, 64, 16) == 48, "a fully cached aligned prompt recomputes its last block"
    assert impl.expected_cached_tokens(65, 64, 16) == 64
    assert impl.expected_cached_tokens(40, 10, 16) == 0
