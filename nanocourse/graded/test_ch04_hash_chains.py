"""Chapter 04 graded tasks: hash chains. Run with `make grade CH=04`."""

import os
import subprocess
import sys
import types

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nanocourse.differential import Story
from nanoengine.core import kv_cache_utils as kcu

CHAPTER = "ch04_hash_chains"


def _engine_request_hashes(token_ids, block_size, cache_salt=None):
    from nanoengine.request import Request

    return Request(
        "r", token_ids, block_hasher=kcu.get_request_block_hasher(block_size), cache_salt=cache_salt
    ).block_hashes


def _engine_num_cached(block_hashes, cached, num_tokens, block_size):
    """The engine's own lookup: KVCacheManager.get_computed_blocks over a pool holding `cached`."""
    from types import SimpleNamespace

    from nanoengine.core import KVCacheManager

    if num_tokens < 1:  # no request is empty: the engine's lookup never meets one (the contract's answer is 0)
        return 0
    kv = KVCacheManager(block_size, len(cached) + 1)
    for block, h in zip(kv.block_pool.get_new_blocks(len(cached)), sorted(cached)):
        block.block_hash = h
        kv.block_pool.cached_block_hash_to_block.insert(h, block)
    request = SimpleNamespace(
        block_hashes=list(block_hashes),
        num_tokens=num_tokens,
        num_preemptions=0,
        all_token_ids=[0] * num_tokens,
        skip_reading_prefix_cache=False,
    )
    return kv.get_computed_blocks(request)[1]


NANOENGINE = {
    "hash_block_tokens": kcu.hash_block_tokens,
    "hash_request_blocks": _engine_request_hashes,
    "num_cached_tokens": _engine_num_cached,
    "ROOT_HASH": kcu.NONE_HASH,
}
A, B = list(range(16)), list(range(100, 116))


_IN_A_PROCESS = """
import importlib, importlib.util, sys
name, path = sys.argv[1], sys.argv[2]
if importlib.util.find_spec(name.split(".")[0]) is None or name.startswith("graded_"):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
else:
    module = importlib.import_module(name)
h = module.hash_block_tokens(None, [1, 2, 3, 4], ("tenant-1", "lora-a"))
print(h.hex() if isinstance(h, bytes) else repr(h))
"""


def _shown(h) -> str:
    return h.hex() if isinstance(h, bytes) else repr(h)


def _hash_in_a_process(impl, seed: str) -> str:
    """hash_block_tokens(None, [1, 2, 3, 4], ('tenant-1', 'lora-a')) of impl's module, in a fresh Python with this
    PYTHONHASHSEED."""
    module = impl if isinstance(impl, types.ModuleType) else sys.modules[impl.hash_block_tokens.__module__]
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.run(
        [sys.executable, "-c", _IN_A_PROCESS, module.__name__, module.__file__],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return proc.stdout.strip() or f"(it raised: {proc.stderr.strip().splitlines()[-1:]})"


@pytest.mark.task("04.1", "hash_block_tokens is deterministic, content-addressed and 16 bytes")
def test_hash_is_content_addressed(impl):
    h = impl.hash_block_tokens(None, A)
    assert isinstance(h, bytes) and len(h) == 16, (
        f"hash_block_tokens(None, tokens 0..15) must return 16 bytes, an xxh3_128_digest: got {h!r:.60} "
        f"({type(h).__name__}{f', length {len(h)}' if isinstance(h, (bytes, str)) else ''})"
    )
    assert impl.hash_block_tokens(None, list(A)) == h, "same content must give the same hash"
    got = impl.hash_block_tokens(None, tuple(A))
    assert got == h, (
        f"hash_block_tokens(None, tuple(ids)) must equal hash_block_tokens(None, list(ids)): the ids' content counts, "
        f"not the sequence's type (an encoding through repr or str tells a list from a tuple); got {got!r:.60} and "
        f"{h!r:.60}"
    )
    root = impl.hash_block_tokens(impl.ROOT_HASH, [1, 2, 3, 4])
    assert impl.hash_block_tokens(None, [1, 2, 3, 4]) == root, (
        f"None means the first block, whose parent is ROOT_HASH: hash_block_tokens(None, [1, 2, 3, 4]) must equal "
        f"hash_block_tokens(ROOT_HASH, [1, 2, 3, 4]); got {impl.hash_block_tokens(None, [1, 2, 3, 4])!r:.60} and "
        f"{root!r:.60}"
    )
    keyed = impl.hash_block_tokens(None, [1, 2, 3, 4], ("tenant-1", "lora-a"))
    in_processes = {seed: _hash_in_a_process(impl, seed) for seed in ("1", "2")}
    assert set(in_processes.values()) == {_shown(keyed)}, (
        f"hash_block_tokens(None, [1, 2, 3, 4], ('tenant-1', 'lora-a')) must be the same in any process: here "
        f"{_shown(keyed)}, in a process with PYTHONHASHSEED=1 {in_processes['1']}, with PYTHONHASHSEED=2 "
        f"{in_processes['2']} (Python's hash() of a str changes from process to process: encode the keys' bytes)"
    )

    assert impl.hash_block_tokens(None, B) != h, "different tokens must give different hashes"
    assert impl.hash_block_tokens(None, A[::-1]) != h, "token order must matter"


@pytest.mark.task("04.1b", "hash_block_tokens chains through the parent and the extra keys")
def test_hash_is_chained_and_keyed(impl):
    parent = impl.hash_block_tokens(None, A)
    assert impl.hash_block_tokens(parent, B) != impl.hash_block_tokens(None, B), "the parent must change the hash"
    assert impl.hash_block_tokens(None, A, ("tenant-1",)) != parent, "extra keys must change the hash"
    assert impl.hash_block_tokens(None, A, ("tenant-1",)) != impl.hash_block_tokens(None, A, ("tenant-2",)), (
        "extra keys ('tenant-1',) and ('tenant-2',) must give different hashes: encode the keys' content, "
        "not just their presence"
    )


@pytest.mark.task("04.2", "hash_request_blocks hashes full blocks only, as one chain")
def test_request_chain(impl):
    tokens = list(range(50))
    hashes = impl.hash_request_blocks(tokens, 16)
    assert len(hashes) == 3, "50 tokens hold 3 full blocks of 16; the partial 4th gets no hash"
    assert len(set(hashes)) == 3, (
        f"hash_request_blocks(tokens 0..49, 16): the 3 full blocks hold different tokens, "
        f"so their 3 hashes must differ; got {len(set(hashes))} distinct"
    )
    assert impl.hash_request_blocks(tokens[:48], 16) == hashes, (
        "hash_request_blocks(tokens[:48], 16) must equal hash_request_blocks(tokens 0..49, 16): the 2 tokens of the "
        "partial 4th block must not enter any hash"
    )
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
    assert salted == impl.hash_request_blocks(tokens, 16, cache_salt="alice"), (
        "hashing the same 48 tokens with the same cache_salt='alice' twice must give the same hashes"
    )
    hs = impl.hash_request_blocks(list(range(10)), 4, cache_salt="alice")
    first = impl.hash_block_tokens(None, [0, 1, 2, 3], ("alice",))
    second = impl.hash_block_tokens(first, [4, 5, 6, 7])
    assert hs == [first, second], (
        "hash_request_blocks(list(range(10)), 4, cache_salt='alice') must be [hash_block_tokens(None, [0, 1, 2, 3], "
        "('alice',)), hash_block_tokens(that, [4, 5, 6, 7])]: the salt is an extra key of the first block only, and "
        f"the chain carries it on; yours matches {['no', 'the first'][len(hs) > 0 and hs[0] == first]} block"
        + (", not the second (no key on block 1)" if len(hs) > 1 and hs[0] == first else "")
    )
    assert salted[0] != impl.hash_request_blocks(tokens, 16, cache_salt="bob")[0], (
        "cache_salt 'alice' and 'bob' must give different first-block hashes: the salt is an extra key of block 0"
    )


@pytest.mark.task("04.3", "num_cached_tokens stops at the first miss and keeps the last token")
def test_lookup(impl):
    hashes = [b"h0", b"h1", b"h2", b"h3"]
    assert impl.num_cached_tokens(hashes, {b"h0", b"h1", b"h3"}, 70, 16) == 32, "stop at the first miss"
    got = impl.num_cached_tokens(hashes, set(hashes), 70, 16)
    assert got == 64, (
        f"num_cached_tokens(4 hashes all cached, num_tokens=70, block_size=16) must be 64: all 4 "
        f"blocks hit, since (70 - 1) // 16 = 4 leaves the last token (position 69) outside them; "
        f"got {got}"
    )
    assert impl.num_cached_tokens(hashes, set(hashes), 64, 16) == 48, "a block-aligned prompt recomputes its last block"
    got = impl.num_cached_tokens(hashes, set(), 70, 16)
    assert got == 0, f"num_cached_tokens(4 hashes, nothing cached, 70, 16) must be 0: block 0 misses; got {got}"
    got = impl.num_cached_tokens(hashes, set(hashes), 0, 16)
    assert got == 0, (
        f"num_cached_tokens(4 hashes all cached, num_tokens=0, 16) must be 0: the hit is capped at num_tokens - 1 "
        f"tokens and never negative; got {got}"
    )


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
    _blocks, hit = kv.get_computed_blocks(second)
    assert hit == 32, "the second request must hit the two full blocks the first one cached"


# ---- 04.5: random blocks and prompts, against the rule itself ------------------------------------------------

# Ids and keys chosen to meet the encodings that collide: short and long ids ([1, 23] against [12, 3]), ids that
# agree in their low 16 bits (5 and 65541, 4464 and 70000), the largest id, keys that contain the separator
# a join would use, and ids whose bytes spell a key and its length ("abcd" is 4 bytes, id 1684234849).
ABCD = int.from_bytes(b"abcd", "little")
IDS = st.one_of(
    st.integers(0, 30), st.sampled_from([1, 12, 23, 3, 123, 5, 65541, 4464, 70000, 256, 2**32 - 1, 4, ABCD])
)
KEYS = st.one_of(
    st.none(),
    st.just(()),
    st.lists(
        st.sampled_from(["a", "b", "ab", "", "a\x00b", "\x00", "1", "abcd", "tenant-1"]), min_size=1, max_size=3
    ).map(tuple),
)
# A block: its parent (None; the root hash; or an earlier block, by index), its ids, its extra keys.
BLOCKS = st.lists(
    st.tuples(st.one_of(st.none(), st.just("root"), st.integers(0, 30)), st.lists(IDS, max_size=5), KEYS),
    min_size=1,
    max_size=14,
)
PROMPTS = st.lists(
    st.tuples(
        st.lists(st.sampled_from([1, 2, 12, 23, 5, 65541]), max_size=13),
        st.sampled_from([None, "", "alice", "bob", "alice\x00"]),
    ),
    max_size=4,
)


@pytest.mark.task("04.5", "random blocks and prompts: two hashes are equal exactly when parent, ids and keys are")
@settings(max_examples=300)
@given(blocks=BLOCKS, prompts=PROMPTS, block_size=st.integers(1, 4))
# Where encodings are known to meet, tried first: every pair below differs.
@example(
    blocks=[
        (None, [1, 23], None),
        (None, [12, 3], None),
        (None, [5], None),
        (None, [65541], None),
        (None, [4, ABCD], None),
        (None, [], ("abcd",)),
        (None, [], ("a\x00b",)),
        (None, [], ("a", "b")),
        (None, [], ("",)),
        (None, [], None),
    ],
    prompts=[([1, 2, 12, 23], "alice")],
    block_size=2,
)
def test_hashes_name_content_exactly(impl, blocks, prompts, block_size):
    """The rule, checked on every pair: hash_block_tokens gives two blocks the same hash if and only if they have
    the same parent hash (None and ROOT_HASH alike), the same ids in the same order and the same extra keys (None
    and () alike); and hash_request_blocks is exactly the chain of 04.2, with the salt on block 0 only."""
    story = Story(f"block_size {block_size} for the prompts", reference="the rule's")
    names, hashes = [], []  # per block: what it is made of (parents by name), its hash

    def add(what: str, name, block_hash) -> None:
        story.add(what)
        same = [k for k, other in enumerate(names) if other == name]
        collide = [k for k, other in enumerate(hashes) if other == block_hash]
        story.compare(
            {"the earlier blocks with the same hash": collide}, {"the earlier blocks with the same hash": same}
        )
        names.append(name)
        hashes.append(block_hash)

    for parent, ids, keys in blocks:
        if isinstance(parent, int) and parent >= len(names):
            parent = None
        parent_hash = (
            {None: None, "root": impl.ROOT_HASH}.get(parent) if not isinstance(parent, int) else hashes[parent]
        )
        parent_name = "root" if not isinstance(parent, int) else names[parent]
        add(
            f"block {len(names)} = hash_block_tokens({'block ' + str(parent) if isinstance(parent, int) else parent}, "
            f"{ids}, {keys!r})",
            (parent_name, tuple(ids), tuple(keys or ())),
            impl.hash_block_tokens(parent_hash, ids, keys),
        )
    for ids, salt in prompts:
        got = impl.hash_request_blocks(ids, block_size, salt)
        what = f"hash_request_blocks({ids}, {block_size}, cache_salt={salt!r})"
        if len(got) != len(ids) // block_size:
            story.add(what)
            raise story.fail(f"{what} gave {len(got)} hashes: one per full block, {len(ids) // block_size}")
        parent_name, parent_hash = "root", None
        for i, block_hash in enumerate(got):
            tokens, keys = ids[i * block_size : (i + 1) * block_size], (salt,) if salt and i == 0 else ()
            chained = impl.hash_block_tokens(parent_hash, tokens, keys or None)
            line = f"block {len(names)} = hash {i} of {what}"
            if block_hash != chained:
                story.add(line)
                raise story.fail(
                    f"hash {i} of {what} must be hash_block_tokens({'its parent' if i else None}, {tokens}, "
                    f"{keys or None!r}): the chain of 04.2, the salt an extra key of block 0 only"
                )
            parent_name = (parent_name, tuple(tokens), tuple(keys))
            add(line, parent_name, block_hash)
            parent_hash = block_hash
