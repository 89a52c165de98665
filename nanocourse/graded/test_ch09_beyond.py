"""Chapter 09 graded tasks: radix tree, frequency-aware eviction, cache-aware routing.
Run with `make grade CH=09`."""

from collections import Counter
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanocourse.beyond import GREEDY_ONE, ModelFreeReplica, hash_map_match
from nanocourse.differential import Story
from nanocourse.policies import (
    FrequencyAwareBlockPool,
    RadixTree,
    ReplicaIndex,
    longest_common_prefix,
    route,
    run_requests,
)
from nanoengine.core import AllBlocksCleared, BlockRemoved, BlockStored

CHAPTER = "ch09_beyond"


def _engine_slru_order(freed, protected_cap):
    """The engine's own order: a FrequencyAwareBlockPool whose blocks are cached, hit and freed."""
    n = len(freed)
    pool = FrequencyAwareBlockPool(n + 1, True, reuse_window=1 << 30)
    pool.free_block_queue.protected_cap = protected_cap
    blocks = pool.get_new_blocks(n)
    request = SimpleNamespace(
        request_id="r",
        block_hashes=[i.to_bytes(4, "little") for i in range(n)],
        all_token_ids=list(range(n)),
        lora_name=None,
    )
    pool.cache_full_blocks(request, blocks, 0, n, 1)
    by_id = {block_id: block for (block_id, _), block in zip(freed, blocks)}
    for block_id, reused in freed:
        if reused:  # a second request hits the block, then finishes
            pool.touch([by_id[block_id]])
            pool.free_blocks([by_id[block_id]])
    for block_id, _ in freed:
        pool.free_blocks([by_id[block_id]])
    ids = {block.block_id: block_id for block_id, block in by_id.items()}
    return [ids[b.block_id] for b in pool.free_block_queue.get_all_free_blocks()]


def _engine_apply_events(counts, events):
    index = ReplicaIndex()
    index.counts = Counter(counts)
    index.apply(events)
    counts.clear()
    counts.update(index.counts)


def _count_differences(truth, counts) -> str:
    """Where a rebuilt index disagrees with the pool, without printing 32-byte hashes (for a failure message)."""
    diff = sorted(
        (truth.get(h, 0), counts.get(h, 0)) for h in set(truth) | set(counts) if truth.get(h, 0) != counts.get(h, 0)
    )
    return f"{len(diff)} of {len(truth)} hashes differ, as (copies in the pool, your count): {diff[:8]}"


NANOENGINE = {
    "longest_common_prefix": longest_common_prefix,
    "RadixTree": RadixTree,
    "slru_eviction_order": _engine_slru_order,
    "route": route,
    "apply_events": _engine_apply_events,
}


@pytest.mark.task("09.1", "longest_common_prefix counts the shared leading tokens")
def test_lcp(impl):
    assert impl.longest_common_prefix([1, 2, 3], [1, 2, 4]) == 2, (
        f"[1, 2, 3] and [1, 2, 4] share their 2 leading tokens; longest_common_prefix gave "
        f"{impl.longest_common_prefix([1, 2, 3], [1, 2, 4])!r}"
    )
    assert impl.longest_common_prefix([1, 2], [1, 2, 3]) == 2, "a prefix of the other shares all of itself"
    assert impl.longest_common_prefix([5, 6], [5, 6]) == 2, (
        f"two equal sequences share all their tokens: 2 for [5, 6]; got {impl.longest_common_prefix([5, 6], [5, 6])!r}"
    )
    assert impl.longest_common_prefix([], [1]) == 0 and impl.longest_common_prefix([9], [8]) == 0, (
        f"an empty sequence shares nothing (([], [1]) gives 0), nor does a first-token mismatch (([9], [8]) gives 0); "
        f"got {impl.longest_common_prefix([], [1])!r} and {impl.longest_common_prefix([9], [8])!r}"
    )
    assert impl.longest_common_prefix([1, 2, 3, 4], [1, 9, 3, 4]) == 1, "the first difference ends the prefix"
    assert (got := impl.longest_common_prefix([1, 2, 3], [1, 2])) == 2, (
        f"[1, 2, 3] and [1, 2]: the second is a prefix of the first, so they share 2 tokens whichever comes first; "
        f"got {got!r}"
    )
    assert (got := impl.longest_common_prefix((4, 8, 15), [4, 8, 23])) == 2, (
        f"a tuple and a list compare by their tokens (RadixTree compares its tuple edges with a prompt's tokens): "
        f"(4, 8, 15) and [4, 8, 23] share 2; got {got!r}"
    )
    _lcp_matches_a_plain_walk(impl)


SHORT = st.lists(st.integers(0, 1), max_size=6)


@settings(max_examples=200)
@given(a=SHORT, b=SHORT, as_tuple=st.booleans())
def _lcp_matches_a_plain_walk(impl, a, b, as_tuple):
    """Random short pairs over two tokens, one of them sometimes a tuple, against a walk that stops at the first
    difference."""
    expected = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
    first = tuple(a) if as_tuple else a
    assert (got := impl.longest_common_prefix(first, b)) == expected, (
        f"longest_common_prefix({first!r}, {b!r}) is {expected}; got {got!r}"
    )


@pytest.mark.task("09.2", "RadixTree.match_prefix matches to the token, where the hash map stops at a block")
def test_radix_match(impl):
    tree = impl.RadixTree()
    stored = list(range(1000, 1100))
    tree.insert(stored)
    for diverge in (0, 8, 20, 40, 64, 99):
        query = stored[:diverge] + [7] * (100 - diverge)
        assert tree.match_prefix(query) == diverge, f"the prompts part ways at token {diverge}"
        assert hash_map_match(stored, query) == diverge // 16 * 16, "the engine's map serves whole blocks only"
    assert tree.match_prefix(stored) == 100 and tree.match_prefix(stored[:30]) == 30, (
        f"after insert(stored), the 100 stored tokens match in full (100) and their first 30 match 30, ending inside "
        f"an edge; got {tree.match_prefix(stored)} and {tree.match_prefix(stored[:30])}"
    )
    assert tree.match_prefix([]) == 0 and impl.RadixTree().match_prefix(stored) == 0, (
        f"an empty query matches 0 tokens, and an empty tree matches 0 of any query; got {tree.match_prefix([])} and "
        f"{impl.RadixTree().match_prefix(stored)}"
    )
    branched = impl.RadixTree()
    branched.insert(stored)
    branched.insert(stored[:40] + [7] * 10)  # an edge of 40 shared tokens, then two children
    assert branched.match_prefix(stored[:20] + stored[40:60]) == 20, (
        "a match that ends inside an edge ends there: it may not jump to the edge's children"
    )
    deeper = stored[:60] + [3] * 5
    assert (got := branched.match_prefix(deeper)) == 60, (
        f"with stored (100 tokens) and stored[:40] + [7] * 10 inserted, stored[:60] + [3] * 5 follows the shared "
        f"40-token edge, then leaves stored's own edge after 20 more tokens: it matches 40 + 20 = 60, counting "
        f"the tokens above the edge where it stops; got {got!r}"
    )


@pytest.mark.task("09.2b", "RadixTree.insert stores a shared prefix once and splits edges")
def test_radix_insert(impl):
    tree = impl.RadixTree()
    a = list(range(100))
    assert (new := tree.insert(a)) == 100, (
        f"inserting 100 tokens into an empty tree: insert returns how many were new, all 100; got {new!r}"
    )
    b = a[:40] + [999] * 60
    assert tree.insert(b) == 60, "only the 60 tokens after the shared 40 are new"
    assert tree.num_tokens == 160, (
        f"after inserting a (100 tokens) and b (its first 40, then 60 others), num_tokens counts each stored token "
        f"once: 100 + 60 = 160; got {tree.num_tokens!r}"
    )
    assert tree.insert(a[:10]) == 0 and tree.num_tokens == 160, "a stored prefix adds nothing"
    assert tree.match_prefix(a) == 100 and tree.match_prefix(b) == 100, (
        f"after a, then b (which splits a's edge after 40 tokens), then a[:10] (which ends inside the shared edge, "
        f"above the branch b made), a and b still match 100 each: a split keeps everything below the edge it cuts; "
        f"got {tree.match_prefix(a)} and {tree.match_prefix(b)}"
    )
    assert tree.match_prefix(a[:40] + [5]) == 40, (
        f"a query that leaves the tree at the split point (after the shared 40 tokens) matches 40; got "
        f"{tree.match_prefix(a[:40] + [5])!r}"
    )
    c = a[:40] + [999, 1]
    assert (new := tree.insert(c)) == 1 and tree.match_prefix(c) == 42 and tree.match_prefix(b) == 100, (
        f"c = a[:40] + [999, 1] shares 41 tokens with b (split b's edge after 999): insert(c) adds 1 new token, then "
        f"c matches 42 and b still 100; got {new!r}, {tree.match_prefix(c)} and {tree.match_prefix(b)}"
    )


class StoredSequences:
    """The RadixTree's contract as a plain model: the inserted sequences themselves, compared one by one."""

    def __init__(self) -> None:
        self.sequences: list[tuple[int, ...]] = []

    def match_prefix(self, tokens) -> int:
        return max((longest_common_prefix(tokens, s) for s in self.sequences), default=0)

    def insert(self, tokens) -> int:
        new = len(tokens) - self.match_prefix(tokens)
        self.sequences.append(tuple(tokens))
        return new

    @property
    def num_tokens(self) -> int:
        return len({s[:i] for s in self.sequences for i in range(1, len(s) + 1)})


# Sequences over three tokens, up to 8 long: inserts split edges at every depth, above and below earlier splits.
TREE_OPS = st.lists(
    st.tuples(
        st.sampled_from(["insert", "insert", "match_prefix"]), st.lists(st.integers(0, 2), max_size=8), st.booleans()
    ),
    max_size=14,
)


@pytest.mark.task("09.2c", "under random inserts and lookups your RadixTree behaves like the set of its sequences")
@settings(max_examples=300)
@given(ops=TREE_OPS)
def test_radix_matches_a_set_model(impl, ops):
    """Your tree and a plain list of the inserted sequences get the same calls, with lists and tuples; after
    each, what it returned and num_tokens must be what the list implies."""
    tree, model = impl.RadixTree(), StoredSequences()
    story = Story("an empty RadixTree", reference="the contract's")
    for op, tokens, as_tuple in ops:
        arg = tuple(tokens) if as_tuple else tokens
        story.add(f"{op}({arg!r})")
        expected = {"what it returned": getattr(model, op)(tokens), "num_tokens": model.num_tokens}
        got = story.call(f"your {op}", getattr(tree, op), arg)
        story.compare({"what it returned": got, "num_tokens": tree.num_tokens}, expected)


@pytest.mark.task("09.3", "slru_eviction_order: one-offs go before reused blocks, protected is capped")
def test_slru_order(impl):
    plain = [(1, False), (2, False), (3, False)]
    assert impl.slru_eviction_order(plain, 4) == [1, 2, 3], "without reuse it is plain LRU"
    mixed = [(1, False), (2, True), (3, False), (4, True)]
    assert impl.slru_eviction_order(mixed, 4) == [1, 3, 2, 4], (
        f"freed 1, 2 (reused), 3, 4 (reused), cap 4: probation (never reused) goes first, oldest first, then "
        f"protected: expected [1, 3, 2, 4], got {impl.slru_eviction_order(mixed, 4)}"
    )
    assert impl.slru_eviction_order([(1, True), (2, True), (3, True), (4, False)], 2) == [1, 4, 2, 3], (
        "past the cap the oldest protected block joins probation's newest end"
    )
    assert impl.slru_eviction_order([(5, True), (6, False), (7, True)], 0) == [5, 6, 7], (
        f"freed 5 (reused), 6, 7 (reused), cap 0: each reused block is demoted at once to probation's newest end, so "
        f"the order stays the freeing order [5, 6, 7]; got "
        f"{impl.slru_eviction_order([(5, True), (6, False), (7, True)], 0)}"
    )
    _slru_matches_the_engine(impl)


@st.composite
def _freeing_orders(draw):
    """(freed, protected_cap): blocks 0..n-1 freed once each, in a random order, each reused or not."""
    order = draw(st.permutations(range(draw(st.integers(0, 7)))))
    freed = [(block_id, draw(st.booleans())) for block_id in order]
    return freed, draw(st.integers(0, len(freed) + 1))


@settings(max_examples=150)
@given(case=_freeing_orders())
def _slru_matches_the_engine(impl, case):
    """Random freeing orders and caps against the engine's FrequencyAwareBlockPool, whose blocks are cached, hit
    and freed for real."""
    freed, cap = case
    expected = _engine_slru_order(freed, cap)
    assert (got := impl.slru_eviction_order(freed, cap)) == expected, (
        f"freed {freed} (block id, reused), protected_cap={cap}: the engine's FrequencyAwareBlockPool evicts "
        f"{expected}; you gave {got}"
    )


@pytest.mark.task("09.4", "route: longest cached prefix, then least loaded, then lowest index")
def test_route(impl):
    replicas = [{b"a"}, {b"a", b"b"}, {b"b", b"c"}]
    assert impl.route([b"a", b"b", b"c"], replicas, [0, 9, 0]) == 1, "the longest prefix wins over load"
    assert impl.route([b"a"], replicas, [3, 2, 0]) == 1, "equal prefixes: the less loaded"
    assert impl.route([b"x", b"b", b"c"], replicas, [1, 1, 0]) == 2, "no prefix anywhere: least loaded"
    assert impl.route([b"x", b"b", b"c"], replicas, [0, 0, 0]) == 0, "a hash after a miss does not count"
    assert impl.route([], [set(), set()], [0, 0]) == 0, (
        f"an empty request matches 0 everywhere and the loads tie, so the lowest index wins: 0; got "
        f"{impl.route([], [set(), set()], [0, 0])!r}"
    )
    held = [{b"x"}, {b"a"}, {b"a"}]
    assert (got := impl.route([b"a"], held, [1, 2, 1])) == 2, (
        f"replicas holding {{x}}, {{a}}, {{a}} with loads [1, 2, 1], request [a]: replicas 1 and 2 match 1 block, "
        f"and of those two, replica 2 is less loaded; replica 0 has that same load but matches nothing, so it is "
        f"not a candidate: expected 2, got {got!r}"
    )
    _route_matches_the_engine(impl)


HASHES = [b"a", b"b", b"c", b"d"]
# A chain's hashes are distinct, so a request is the chain's first k; a replica holds each hash by a coin flip
# (hypothesis's own sets favour empty ones, where every rule agrees).
CHAIN = st.integers(0, len(HASHES)).map(lambda k: HASHES[:k])
HELD = st.lists(st.booleans(), min_size=len(HASHES), max_size=len(HASHES)).map(
    lambda bits: {h for h, bit in zip(HASHES, bits) if bit}
)


@settings(max_examples=200)
@given(request=CHAIN, replicas=st.lists(st.tuples(HELD, st.integers(0, 2)), min_size=1, max_size=4))
def _route_matches_the_engine(impl, request, replicas):
    """Random requests, replicas and loads (ties on both are frequent) against the engine's route."""
    held, loads = [h for h, _ in replicas], [n for _, n in replicas]
    expected = route(request, held, loads)
    assert (got := impl.route(request, held, loads)) == expected, (
        f"request hashes {request}, replicas holding {held} with loads {loads}: the engine routes to replica "
        f"{expected} (longest leading match, then least load, then lowest index); you chose {got!r}"
    )


@pytest.mark.task("09.5", "apply_events counts cached copies and rebuilds a real pool's map from its events")
def test_apply_events(impl):
    counts = {}
    impl.apply_events(counts, [BlockStored([b"a", b"b"], None, [0] * 8, 4), BlockStored([b"a"], None, [0] * 4, 4)])
    assert counts == {b"a": 2, b"b": 1}, (
        f"BlockStored adds one copy of each of its hashes: a stored twice, b once: expected {{b'a': 2, b'b': 1}}, "
        f"got {counts}"
    )
    impl.apply_events(counts, [BlockRemoved([b"a", b"b"])])
    assert counts == {b"a": 1}, "one copy of a is still cached; b is gone"
    impl.apply_events(counts, [AllBlocksCleared(), BlockStored([b"c"], b"a", [0] * 4, 4)])
    assert counts == {b"c": 1}, (
        f"from {{b'a': 1}}, AllBlocksCleared empties the index, then BlockStored adds c: expected {{b'c': 1}}, "
        f"got {counts}"
    )
    try:
        impl.apply_events(counts, [BlockRemoved([b"z"])])
    except KeyError as error:
        raise AssertionError(
            f"a BlockRemoved for a hash the index does not hold (a router that started listening "
            f"after the block was stored) must change nothing; it raised KeyError: {error}"
        ) from error
    assert counts == {b"c": 1}, (
        f"from {{b'c': 1}}, a BlockRemoved for z, which the index does not hold, changes nothing: expected "
        f"{{b'c': 1}}, got {counts}"
    )
    _events_match_the_engine_index(impl)

    # Two same prompts chunked 4 tokens a step: the second hits block 0, then caches its own copies.
    replica = ModelFreeReplica(9, block_size=4, long_prefill_token_threshold=4)
    engine = replica.engine
    run_requests(engine, [list(range(12)), list(range(12))], GREEDY_ONE)
    run_requests(engine, [list(range(100, 116))], GREEDY_ONE)  # needs room: evicts one copy
    counts = {}
    impl.apply_events(counts, engine.kv_cache_manager.take_events())
    truth = Counter(h for h, _ in engine.kv_cache_manager.block_pool.cached_block_hash_to_block.items())
    assert 2 in truth.values() and 1 in truth.values(), "the pool holds one hash twice, another once"
    assert counts == dict(truth), (
        f"replaying the pool's own events must rebuild its map (hash -> cached copies); "
        f"{_count_differences(truth, counts)}"
    )


EVENT_HASHES = st.lists(st.sampled_from([b"a", b"b", b"c"]), min_size=1, max_size=3)
EVENTS = st.one_of(
    EVENT_HASHES.map(lambda hashes: BlockStored(hashes, None, [0] * 4 * len(hashes), 4)),
    EVENT_HASHES.map(BlockRemoved),
    st.just(AllBlocksCleared()),
)


def _event_words(event) -> str:
    if isinstance(event, AllBlocksCleared):
        return "AllBlocksCleared()"
    return f"{type(event).__name__}({event.block_hashes})"


@settings(max_examples=200)
@given(batches=st.lists(st.lists(EVENTS, max_size=5), max_size=4))
def _events_match_the_engine_index(impl, batches):
    """Random batches of events, removals of hashes the index never held included, each batch handed over as an
    iterator (read once), against the engine's ReplicaIndex."""
    counts, index = {}, ReplicaIndex()
    story = Story("an empty index, {}", reference="the engine's ReplicaIndex")
    for batch in batches:
        story.add(f"apply_events(counts, iter([{', '.join(map(_event_words, batch))}]))")
        story.call("your apply_events", impl.apply_events, counts, iter(batch))
        index.apply(batch)
        story.compare({"counts": counts}, {"counts": dict(index.counts)})
