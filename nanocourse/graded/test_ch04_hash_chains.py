"""Chapter 04 graded tasks: hash chains. Run with `make grade CH=04`."""

import pytest

from nanoengine.core import kv_cache_utils as kcu

CHAPTER = "ch04_hash_chains"


def _engine_request_hashes(token_ids, block_size, cache_salt=None):
    from nanoengine.request import Request

    return Request("r", token_ids, block_hasher=kcu.get_request_block_hasher(block_size), cache_salt=cache_salt).block_hashes


def _engine_num_cached(block_hashes, cached, num_tokens, block_size):
    """The engine's own lookup: KVCacheManager.get_computed_blocks over a pool holding `cached`."""
    from types import SimpleNamespace

    from nanoengine.core import KVCacheManager

    kv = KVCacheManager(block_size, len(cached) + 1)
    for block, h in zip(kv.block_pool.get_new_blocks(len(cached)), sorted(cached)):
        block.block_hash = h
        kv.block_pool.cached_block_hash_to_block.insert(h, block)
    request = SimpleNamespace(block_hashes=list(block_hashes), num_tokens=num_tokens, num_preemptions=0,
                              all_token_ids=[0] * num_tokens)
    return kv.get_computed_blocks(request)[1]


NANOENGINE = {
    "hash_block_tokens": kcu.hash_block_tokens,
    "hash_request_blocks": _engine_request_hashes,
    "num_cached_tokens": _engine_num_cached,
}
A, B = list(range(16)), list(range(100, 116))


@pytest.mark.task("04.1", "hash_block_tokens is deterministic, content-addressed and 16 bytes")
def test_hash_is_content_addressed(impl):
    h = impl.hash_block_tokens(None, A)
    assert isinstance(h, bytes) and len(h) == 16, (
        f"hash_block_tokens(None, tokens 0..15) must return 16 bytes, an xxh3_128_digest: got {h!r:.60} "
        f"({type(h).__name__}{f', length {len(h)}' if isinstance(h, (bytes, str)) else ''})")
    assert impl.hash_block_tokens(None, list(A)) == h, "same content must give the same hash"
    assert impl.hash_block_tokens(None, B) != h, "different tokens must give different hashes"
    assert impl.hash_block_tokens(None, A[::-1]) != h, "token order must matter"


@pytest.mark.task("04.1b", "hash_block_tokens chains through the parent and the extra keys")
def test_hash_is_chained_and_keyed(impl):
    parent = impl.hash_block_tokens(None, A)
    assert impl.hash_block_tokens(parent, B) != impl.hash_block_tokens(None, B), "the parent must change the hash"
    assert impl.hash_block_tokens(None, A, ("tenant-1",)) != parent, "extra keys must change the hash"
    assert impl.hash_block_tokens(None, A, ("tenant-1",)) != impl.hash_block_tokens(None, A, ("tenant-2",)), (
        "extra keys ('tenant-1',) and ('tenant-2',) must give different hashes: encode the keys' content, "
        "not just their presence")


@pytest.mark.task("04.2", "hash_request_blocks hashes full blocks only, as one chain")
def test_request_chain(impl):
    tokens = list(range(50))
    hashes = impl.hash_request_blocks(tokens, 16)
    assert len(hashes) == 3, "50 tokens hold 3 full blocks of 16; the partial 4th gets no hash"
    assert len(set(hashes)) == 3, (f"hash_request_blocks(tokens 0..49, 16): the 3 full blocks hold different tokens, "
                                   f"so their 3 hashes must differ; got {len(set(hashes))} distinct")
    assert impl.hash_request_blocks(tokens[:48], 16) == hashes, (
        "hash_request_blocks(tokens[:48], 16) must equal hash_request_blocks(tokens 0..49, 16): the 2 tokens of the "
        "partial 4th block must not enter any hash")
    other = impl.hash_request_blocks([999] + tokens[1:], 16)
    assert all(x != y for x, y in zip(other, hashes)), "a change in block 0 must change every later hash"
    shared = impl.hash_request_blocks(tokens[:32] + [7] * 16, 16)
    assert shared[:2] == hashes[:2] and shared[2] != hashes[2], "a shared prefix shares its hashes"


@pytest.mark.task("04.2b", "cache_salt goes on the first block and the chain carries it")
def test_salt(impl):
    tokens = list(range(48))
    plain = impl.hash_request_blocks(tokens, 16)
    salted = impl.hash_request_blocks(tokens, 16, cache_salt="alice")
    assert all(x != y for x, y in zip(plain, salted)), "the salt must reach every block through the chain"
    assert salted == impl.hash_request_blocks(tokens, 16, cache_salt="alice"), \
        "hashing the same 48 tokens with the same cache_salt='alice' twice must give the same hashes"
    assert salted[0] != impl.hash_request_blocks(tokens, 16, cache_salt="bob")[0], (
        "cache_salt 'alice' and 'bob' must give different first-block hashes: the salt is an extra key of block 0")


@pytest.mark.task("04.3", "num_cached_tokens stops at the first miss and keeps the last token")
def test_lookup(impl):
    hashes = [b"h0", b"h1", b"h2", b"h3"]
    assert impl.num_cached_tokens(hashes, {b"h0", b"h1", b"h3"}, 70, 16) == 32, "stop at the first miss"
    got = impl.num_cached_tokens(hashes, set(hashes), 70, 16)
    assert got == 64, (f"num_cached_tokens(4 hashes all cached, num_tokens=70, block_size=16) must be 64: all 4 "
                       f"blocks hit, since (70 - 1) // 16 = 4 leaves the last token (position 69) outside them; "
                       f"got {got}")
    assert impl.num_cached_tokens(hashes, set(hashes), 64, 16) == 48, "a block-aligned prompt recomputes its last block"
    got = impl.num_cached_tokens(hashes, set(), 70, 16)
    assert got == 0, f"num_cached_tokens(4 hashes, nothing cached, 70, 16) must be 0: block 0 misses; got {got}"


@pytest.mark.task("04.4", "your hash_block_tokens runs the real engine's prefix cache")
def test_plugs_into_the_engine(impl):
    from nanoengine.core import KVCacheManager
    from nanoengine.request import Request

    hasher = kcu.get_request_block_hasher(16, hash_block=impl.hash_block_tokens)
    kv = KVCacheManager(16, 32)
    first = Request("a", list(range(40)), block_hasher=hasher)
    kv.allocate_slots(first, 40)
    kv.free(first)
    second = Request("b", list(range(40)) + [5, 6], block_hasher=hasher)
    blocks, hit = kv.get_computed_blocks(second)
    assert hit == 32, "the second request must hit the two full blocks the first one cached"
