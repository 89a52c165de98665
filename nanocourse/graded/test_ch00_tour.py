"""Chapter 00 graded tasks: prompts, tokens and blocks. Run with `make grade CH=00`."""

import functools

import pytest

from nanoengine.core import KVCacheManager, get_request_block_hasher
from nanoengine.policies import longest_common_prefix
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


def _first_difference(got, want: str) -> str:
    """Where two renderings part, shown as the few characters each has from there (for a failure message)."""
    if not isinstance(got, str):
        return f"got a {type(got).__name__}, not a str: {got!r:.80}"
    at = longest_common_prefix(got, want)
    return f"they part at character {at}: expected {want[at:at + 30]!r}, got {got[at:at + 30]!r}"


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
        got, want = impl.render_chatml(messages), tok.apply_chat_template(messages)
        assert got == want, (f"render_chatml(roles {[m['role'] for m in messages]}) must match SmolLM2's chat "
                             f"template (apply_chat_template): {_first_difference(got, want)}")


@pytest.mark.task("00.2", "shared_prefix_blocks counts identical leading full blocks")
def test_shared_blocks(impl):
    a = list(range(50))
    got = impl.shared_prefix_blocks(a, a, 16)
    assert got == 3, (f"shared_prefix_blocks(a, a, 16) with a = tokens 0..49 must be 3: the 50 tokens hold 3 full "
                      f"blocks of 16, and the partial 4th block (tokens 48, 49) does not count; got {got}")
    got = impl.shared_prefix_blocks(a, a[:40] + [0] * 10, 16)
    assert got == 2, (f"shared_prefix_blocks(a, a[:40] + [0] * 10, 16) must be 2: the sequences part at token 40, "
                      f"inside block 2 (tokens 32..47), so only blocks 0 and 1 are identical; got {got}")
    got = impl.shared_prefix_blocks(a, [99] + a[1:], 16)
    assert got == 0, (f"shared_prefix_blocks(a, [99] + a[1:], 16) must be 0: token 0 differs, so block 0 differs "
                      f"and the count stops there, even though blocks 1 and 2 are equal again; got {got}")
    assert impl.shared_prefix_blocks(a, a[:20], 16) == 1, "only full blocks count"


@pytest.mark.task("00.3", "expected_cached_tokens follows whole blocks and the last-token rule")
def test_expected_cached(impl):
    got = impl.expected_cached_tokens(100, 60, 16)
    assert got == 48, (f"expected_cached_tokens(100, 60, 16) must be 48: 60 shared tokens fill 3 whole blocks of 16, "
                       f"and the 12 shared tokens of the partial 4th block are computed again; got {got}")
    assert impl.expected_cached_tokens(64, 64, 16) == 48, "a fully cached aligned prompt recomputes its last block"
    got = impl.expected_cached_tokens(65, 64, 16)
    assert got == 64, (f"expected_cached_tokens(65, 64, 16) must be 64: all 4 shared blocks are reused, since the "
                       f"prompt's last token (position 64) lies past them, (65 - 1) // 16 = 4; got {got}")
    got = impl.expected_cached_tokens(40, 10, 16)
    assert got == 0, (f"expected_cached_tokens(40, 10, 16) must be 0: 10 shared tokens fill no whole block of 16, "
                      f"and only whole blocks are reused; got {got}")
