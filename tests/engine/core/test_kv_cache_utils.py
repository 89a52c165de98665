"""Hashing, KVCacheBlock and FreeKVCacheBlockQueue."""

from __future__ import annotations

import hashlib
import struct
import subprocess
import sys

import pytest
import xxhash

from nanoengine.core import (
    NONE_HASH,
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    encode_extra_keys,
    generate_block_hash_extra_keys,
    get_hash_fn_by_name,
    get_request_block_hasher,
    hash_block_tokens,
    make_none_hash,
    sha256,
)
from nanoengine.request import Request

TOKENS = [11, 12, 13, 14]


# Hashing


def test_default_hash_is_xxh3_128_over_canonical_bytes():
    expected = xxhash.xxh3_128_digest(NONE_HASH + struct.pack("<5I", 4, *TOKENS))
    assert hash_block_tokens(None, TOKENS) == expected
    assert len(expected) == 16


def test_extra_keys_are_appended_as_tagged_length_prefixed_bytes():
    data = NONE_HASH + struct.pack("<5I", 4, *TOKENS) + b"s" + struct.pack("<I", 4) + b"lora"
    assert hash_block_tokens(None, TOKENS, ("lora",)) == xxhash.xxh3_128_digest(data)


def test_sha256_is_selectable_by_name():
    fn = get_hash_fn_by_name("sha256")
    assert fn is sha256
    root = make_none_hash(fn)
    data = root + struct.pack("<5I", 4, *TOKENS)
    assert hash_block_tokens(root, TOKENS, None, fn) == hashlib.sha256(data).digest()


def test_unknown_hash_name_is_a_clear_error():
    with pytest.raises(ValueError, match="choose one of"):
        get_hash_fn_by_name("md5")


def test_hash_is_chained_through_the_parent():
    first = hash_block_tokens(None, TOKENS)
    other_first = hash_block_tokens(None, [11, 12, 13, 99])
    assert hash_block_tokens(first, TOKENS) != hash_block_tokens(other_first, TOKENS)
    assert hash_block_tokens(first, TOKENS) == hash_block_tokens(first, tuple(TOKENS))


def test_none_hash_is_deterministic_from_the_seed():
    assert make_none_hash() == NONE_HASH
    assert make_none_hash(hash_seed="tenant-a") != NONE_HASH
    # A random root (vLLM's xxhash without PYTHONHASHSEED) differs on every draw.
    assert make_none_hash(hash_seed=None) != make_none_hash(hash_seed=None)


def test_default_hashes_carry_across_processes():
    code = "from nanoengine.core import hash_block_tokens;print(hash_block_tokens(None, [11, 12, 13, 14]).hex())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": ":".join(sys.path), "PYTHONHASHSEED": "random"},
    )
    assert out.stdout.strip() == hash_block_tokens(None, TOKENS).hex()


@pytest.mark.parametrize(
    "a, b",
    [
        (("ab",), ("a", "b")),
        (("1",), (1,)),
        (("x",), (b"x",)),
        ((("a", "b"),), ("a", "b")),
        ((1,), (-1,)),
    ],
)
def test_extra_key_encoding_is_unambiguous(a, b):
    assert encode_extra_keys(a) != encode_extra_keys(b)


@pytest.mark.parametrize("bad", [1.5, True, None])
def test_bad_extra_key_type_is_a_clear_error(bad):
    with pytest.raises(TypeError, match="Extra hash keys must be"):
        hash_block_tokens(None, TOKENS, (bad,))


@pytest.mark.parametrize("bad", [[-1, 2, 3, 4], [2**32, 1, 2, 3]])
def test_out_of_range_token_is_a_clear_error(bad):
    with pytest.raises(ValueError, match=r"Token ids must be integers in \[0, 2\*\*32\)"):
        hash_block_tokens(None, bad)


# Extra keys and the per-request hasher


def _request(tokens, **kwargs):
    return Request("r", list(tokens), block_hasher=get_request_block_hasher(4), **kwargs)


def test_cache_salt_goes_on_the_first_block_only():
    salted = _request(range(12), cache_salt="s3cret")
    assert generate_block_hash_extra_keys(salted, 0) == ("s3cret",)
    assert generate_block_hash_extra_keys(salted, 4) is None
    # The chain carries the salt into every later block.
    plain = _request(range(12))
    assert all(s != p for s, p in zip(salted.block_hashes, plain.block_hashes))


def test_lora_name_goes_on_every_block():
    request = _request(range(12), lora_name="sql-adapter", cache_salt="s")
    assert generate_block_hash_extra_keys(request, 0) == ("sql-adapter", "s")
    assert generate_block_hash_extra_keys(request, 8) == ("sql-adapter",)
    parent = request.block_hashes[0]
    assert request.block_hashes[1] == hash_block_tokens(parent, [4, 5, 6, 7], ("sql-adapter",))


def test_hasher_hashes_full_blocks_only_and_incrementally():
    calls = []

    def counting_hash(data: bytes) -> bytes:
        calls.append(data)
        return xxhash.xxh3_128_digest(data)

    hasher = get_request_block_hasher(4, counting_hash)
    request = Request("r", list(range(10)), block_hasher=hasher)
    assert len(request.block_hashes) == 2
    calls.clear()
    request.append_output_token_ids(10)
    assert len(request.block_hashes) == 2 and calls == []
    request.append_output_token_ids([11, 12])
    assert len(request.block_hashes) == 3 and len(calls) == 1
    at_once = Request("s", list(range(13)), block_hasher=hasher)
    assert at_once.block_hashes == request.block_hashes


def test_hasher_uses_its_own_root():
    root = make_none_hash(hash_seed="replica-7")
    request = Request("r", TOKENS, block_hasher=get_request_block_hasher(4, none_hash=root))
    assert request.block_hashes == [hash_block_tokens(root, TOKENS)]
    assert request.block_hashes != [hash_block_tokens(None, TOKENS)]


def test_attach_block_hasher_hashes_existing_tokens():
    request = Request("r", list(range(9)))
    assert request.block_hashes == []
    request.attach_block_hasher(get_request_block_hasher(4))
    assert request.block_hashes == _request(range(9)).block_hashes


def test_bad_block_size_is_a_clear_error():
    with pytest.raises(ValueError, match="block_size must be positive"):
        get_request_block_hasher(0)


# KVCacheBlock


def test_block_is_slotted_and_hash_is_set_once():
    block = KVCacheBlock(block_id=3)
    assert not hasattr(block, "__dict__")
    block.block_hash = b"h"
    with pytest.raises(ValueError, match="already has a hash"):
        block.block_hash = b"g"
    assert block.block_hash == b"h"
    block.reset_hash()
    assert block.block_hash is None


def test_block_repr_does_not_follow_the_links():
    blocks = [KVCacheBlock(block_id=i) for i in range(3)]
    FreeKVCacheBlockQueue(blocks)
    assert "prev_free_block=0, next_free_block=2" in repr(blocks[1])


# FreeKVCacheBlockQueue


def _queue(n=6):
    blocks = [KVCacheBlock(block_id=i) for i in range(n)]
    return FreeKVCacheBlockQueue(blocks), blocks


def _ids(queue):
    return [b.block_id for b in queue.get_all_free_blocks()]


def test_queue_starts_in_block_order_between_sentinels():
    queue, blocks = _queue()
    assert _ids(queue) == [0, 1, 2, 3, 4, 5]
    assert queue.fake_free_list_head.next_free_block is blocks[0]
    assert queue.fake_free_list_tail.prev_free_block is blocks[-1]
    assert queue.num_free_blocks == 6


def test_popleft_and_popleft_n_take_from_the_head():
    queue, blocks = _queue()
    assert queue.popleft() is blocks[0]
    assert queue.popleft_n(2) == blocks[1:3]
    assert _ids(queue) == [3, 4, 5] and queue.num_free_blocks == 3
    assert blocks[1].prev_free_block is None and blocks[1].next_free_block is None
    assert queue.popleft_n(0) == []


@pytest.mark.parametrize("index", [0, 2, 5])
def test_remove_unlinks_any_position(index):
    queue, blocks = _queue()
    queue.remove(blocks[index])
    assert _ids(queue) == [i for i in range(6) if i != index]
    assert queue.num_free_blocks == 5
    assert blocks[index].prev_free_block is None and blocks[index].next_free_block is None


def test_append_append_n_and_prepend_n_keep_order():
    queue, _blocks = _queue()
    taken = queue.popleft_n(6)
    queue.append(taken[2])
    queue.append_n([taken[4], taken[0]])
    queue.prepend_n([taken[5], taken[1]])
    assert _ids(queue) == [5, 1, 2, 4, 0]
    queue.prepend_n([])
    queue.append_n([])
    assert queue.num_free_blocks == 5
    # Links agree in both directions.
    backwards, curr = [], queue.fake_free_list_tail.prev_free_block
    while curr is not queue.fake_free_list_head:
        backwards.append(curr.block_id)
        curr = curr.prev_free_block
    assert backwards == [0, 4, 2, 1, 5]


def test_prepend_into_empty_queue():
    queue, blocks = _queue(2)
    queue.popleft_n(2)
    queue.prepend_n(blocks)
    assert _ids(queue) == [0, 1]


def test_queue_errors_leave_it_intact():
    queue, _blocks = _queue(3)
    outsider = queue.popleft()
    with pytest.raises(ValueError, match="not in the free queue"):
        queue.remove(outsider)
    with pytest.raises(ValueError, match="Cannot take 3 blocks: 2 are free"):
        queue.popleft_n(3)
    with pytest.raises(ValueError, match="Cannot take -1 blocks"):
        queue.popleft_n(-1)
    assert _ids(queue) == [1, 2] and queue.num_free_blocks == 2
    queue.popleft_n(2)
    with pytest.raises(ValueError):
        queue.popleft()
