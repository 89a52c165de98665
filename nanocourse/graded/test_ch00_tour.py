"""Chapter 00 graded tasks: prompts, tokens and blocks. Run with `make grade CH=00`."""

import copy
import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanocourse.differential import short
from nanocourse.hash_chains import block_chain
from nanocourse.policies import longest_common_prefix
from nanoengine.core import KVCacheManager, get_request_block_hasher
from nanoengine.model.loader import unpacked_folder
from nanoengine.model.tokenizer import Tokenizer
from nanoengine.request import Request

CHAPTER = "ch00_tour"
RANDOM = settings(max_examples=200)


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
    second = Request(
        "second", (list(range(1, shared_prefix_tokens + 1)) + [7] * prompt_len)[:prompt_len], block_hasher=hasher
    )
    return kv.get_computed_blocks(second)[1]


def _first_difference(got, want: str) -> str:
    """Where two renderings part, shown as the few characters each has from there (for a failure message)."""
    if not isinstance(got, str):
        return f"got a {type(got).__name__}, not a str: {got!r:.80}"
    at = longest_common_prefix(got, want)
    return f"they part at character {at}: expected {want[at : at + 30]!r}, got {got[at : at + 30]!r}"


NANOENGINE = {
    "render_chatml": lambda messages: _tokenizer().apply_chat_template(messages),
    "shared_prefix_blocks": _engine_shared_blocks,
    "expected_cached_tokens": _engine_cached_tokens,
}

# ---- 00.1 ------------------------------------------------------------------------------------------------

# Contents with the whitespace a careless renderer trims or adds, and markers that must pass through as text.
_CONTENT = st.one_of(
    st.sampled_from(["", "Hi", " Hi ", "two\nlines\n", "\n", "<|im_end|>", "Be terse."]),
    st.text(alphabet=" \n\tab<|>é", max_size=8),
)
_CONVERSATION = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": _CONTENT}),
    max_size=5,
)


@RANDOM
@given(messages=_CONVERSATION)
def _matches_the_template_on_random_conversations(impl, messages):
    want = _tokenizer().apply_chat_template(copy.deepcopy(messages))
    got = impl.render_chatml(copy.deepcopy(messages))
    assert got == want, (
        f"render_chatml({short(messages)}) must match SmolLM2's chat template "
        f"(apply_chat_template) on any conversation: {_first_difference(got, want)}"
    )


@pytest.mark.task("00.1", "render_chatml matches SmolLM2's chat template")
def test_chatml(impl):
    got = impl.render_chatml([{"role": "user", "content": "Hi"}])
    want = (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert got == want, (
        f"render_chatml([user 'Hi']) must be SmolLM2's format, written out by hand (the default "
        f"system turn, the user turn, the assistant's opening): {_first_difference(got, want)}"
    )
    tok = _tokenizer()
    for messages in (
        [{"role": "user", "content": "What is the capital of Japan?"}],
        [
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Bye"},
        ],
        [{"role": "user", "content": "Hi"}, {"role": "system", "content": "Be terse."}],
        [],
        [{"role": "user", "content": "  two\nlines \n"}],
    ):
        given_messages = copy.deepcopy(messages)
        got, want = impl.render_chatml(given_messages), tok.apply_chat_template(messages)
        assert got == want, (
            f"render_chatml({short(messages)}) must match SmolLM2's chat template "
            f"(apply_chat_template): {_first_difference(got, want)}"
        )
        assert given_messages == messages, (
            f"render_chatml must leave the caller's list as it was: "
            f"render_chatml({short(messages)}) changed it to {short(given_messages)}"
        )
    _matches_the_template_on_random_conversations(impl)


# ---- 00.2 ------------------------------------------------------------------------------------------------

_TOKENS = st.lists(st.integers(0, 2), max_size=14)


@RANDOM
@given(
    block_size=st.integers(1, 5),
    prefix=_TOKENS,
    tail_a=_TOKENS,
    tail_b=_TOKENS,
    as_tuple=st.tuples(st.booleans(), st.booleans()),
    swap=st.booleans(),
)
def _matches_the_engines_hashes_on_random_sequences(impl, block_size, prefix, tail_a, tail_b, as_tuple, swap):
    a, b = prefix + tail_a, prefix + tail_b
    if swap:
        a, b = b, a
    a, b = (tuple(x) if t else x for x, t in zip((a, b), as_tuple))
    want = _engine_shared_blocks(a, b, block_size)
    got = impl.shared_prefix_blocks(a, b, block_size)
    assert got == want, (
        f"shared_prefix_blocks({short(a)}, {short(b)}, {block_size}) must be {want}, the leading "
        f"full blocks whose engine block hashes agree; got {got}"
    )


@pytest.mark.task("00.2", "shared_prefix_blocks counts identical leading full blocks")
def test_shared_blocks(impl):
    a = list(range(50))
    got = impl.shared_prefix_blocks(a, a, 16)
    assert got == 3, (
        f"shared_prefix_blocks(a, a, 16) with a = tokens 0..49 must be 3: the 50 tokens hold 3 full "
        f"blocks of 16, and the partial 4th block (tokens 48, 49) does not count; got {got}"
    )
    got = impl.shared_prefix_blocks(a, a[:40] + [0] * 10, 16)
    assert got == 2, (
        f"shared_prefix_blocks(a, a[:40] + [0] * 10, 16) must be 2: the sequences part at token 40, "
        f"inside block 2 (tokens 32..47), so only blocks 0 and 1 are identical; got {got}"
    )
    got = impl.shared_prefix_blocks(a, [99] + a[1:], 16)
    assert got == 0, (
        f"shared_prefix_blocks(a, [99] + a[1:], 16) must be 0: token 0 differs, so block 0 differs "
        f"and the count stops there, even though blocks 1 and 2 are equal again; got {got}"
    )
    got = impl.shared_prefix_blocks(a, a[:20], 16)
    assert got == 1, (
        f"shared_prefix_blocks(a, a[:20], 16) must be 1: a[:20] holds one full block of 16, and "
        f"tokens 16..19 are only a partial block; got {got}"
    )
    got = impl.shared_prefix_blocks(a, tuple(a[:40]), 16)
    assert got == 2, (
        f"shared_prefix_blocks(a, tuple(a[:40]), 16) must be 2: a list and a tuple holding the same "
        f"token ids share their blocks (only the values count); got {got}"
    )
    got = impl.shared_prefix_blocks([], a, 16)
    assert got == 0, f"shared_prefix_blocks([], a, 16) must be 0: an empty sequence has no block; got {got}"
    _matches_the_engines_hashes_on_random_sequences(impl)


# ---- 00.3 ------------------------------------------------------------------------------------------------


@RANDOM
@given(block_size=st.integers(1, 8), prompt_len=st.integers(1, 40), data=st.data())
def _matches_the_kv_cache_manager(impl, block_size, prompt_len, data):
    shared = data.draw(st.integers(0, prompt_len), label="shared_prefix_tokens")
    want = _engine_cached_tokens(prompt_len, shared, block_size)
    got = impl.expected_cached_tokens(prompt_len, shared, block_size)
    assert got == want, (
        f"expected_cached_tokens({prompt_len}, {shared}, {block_size}) must be {want}, what the "
        f"engine's KVCacheManager.get_computed_blocks reports; got {got}"
    )


@pytest.mark.task("00.3", "expected_cached_tokens follows whole blocks and the last-token rule")
def test_expected_cached(impl):
    got = impl.expected_cached_tokens(100, 60, 16)
    assert got == 48, (
        f"expected_cached_tokens(100, 60, 16) must be 48: 60 shared tokens fill 3 whole blocks of 16, "
        f"and the 12 shared tokens of the partial 4th block are computed again; got {got}"
    )
    got = impl.expected_cached_tokens(64, 64, 16)
    assert got == 48, (
        f"expected_cached_tokens(64, 64, 16) must be 48: the prompt's last token (position 63) lies "
        f"in its 4th block, which must be computed again, so only 3 blocks are reused; got {got}"
    )
    got = impl.expected_cached_tokens(65, 64, 16)
    assert got == 64, (
        f"expected_cached_tokens(65, 64, 16) must be 64: all 4 shared blocks are reused, since the "
        f"prompt's last token (position 64) lies past them, (65 - 1) // 16 = 4; got {got}"
    )
    got = impl.expected_cached_tokens(60, 60, 16)
    assert got == 48, (
        f"expected_cached_tokens(60, 60, 16) must be 48: a wholly shared prompt of 60 tokens has 3 "
        f"whole blocks, all reused; its last token (position 59) is in the partial 4th block, which "
        f"was never cached, so no whole block is given up; got {got}"
    )
    got = impl.expected_cached_tokens(40, 10, 16)
    assert got == 0, (
        f"expected_cached_tokens(40, 10, 16) must be 0: 10 shared tokens fill no whole block of 16, "
        f"and only whole blocks are reused; got {got}"
    )
    _matches_the_kv_cache_manager(impl)
