"""Chapter 12 graded tasks: a sliding-window layer's blocks. Run with `make grade CH=12`."""

import random

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nanocourse.differential import replay_workload, scheduler_config, scheduler_workloads
from nanocourse.hybrid import cache_blocks_at
from nanoengine import LLM, SamplingParams
from nanoengine.config import LlamaConfig
from nanoengine.core import BlockPool, KVCacheBlock, KVCacheManager
from nanoengine.core import SlidingWindowManager as EngineSlidingWindowManager
from nanoengine.core.kv_cache_utils import make_block_hash_with_group_id
from nanoengine.core.sched.scheduler import Scheduler
from nanoengine.kv_cache_interface import KVCacheGroupSpec, get_kv_cache_groups
from nanoengine.model import LlamaForCausalLM

CHAPTER = "ch12_hybrid"
NANOENGINE = {"SlidingWindowManager": EngineSlidingWindowManager}
BS = 4
HASHES = [bytes([i]) * 16 for i in range(64)]


def manager(impl, window, pool=None, use_eagle=False):
    pool = pool or BlockPool(80, enable_caching=True)
    return impl.SlidingWindowManager(KVCacheGroupSpec((0,), window), pool, BS, 0, use_eagle)


@pytest.mark.task("12.1", "get_num_skipped_tokens: the tokens before the next query's window")
def test_skipped_tokens(impl):
    for window in (4, 7, 8, 24):
        m = manager(impl, window)
        got = [m.get_num_skipped_tokens(n) for n in range(3 * window)]
        # The query at position n sees n - W + 1 .. n, so tokens 0 .. n - W are skipped.
        assert got == [max(0, n - window + 1) for n in range(3 * window)], (
            f"W={window}: the query at position n sees n - W + 1 .. n; got {got[: window + 2]} for n = 0..{window + 1}"
        )


def held(m, request_id="r"):
    assert request_id in m.req_to_blocks, (
        f"req_to_blocks has no entry for request {request_id!r} (it holds {sorted(m.req_to_blocks)}): "
        f"remove_skipped_blocks puts the null block in place of the blocks it frees, it never drops the request"
    )
    return m.req_to_blocks[request_id]


@pytest.mark.task("12.2", "remove_skipped_blocks: free whole blocks out of the window, null in their places")
def test_remove_skipped_blocks(impl):
    for window in (4, 6, 9):
        check_removal(impl, window)


def free_ids(pool):
    return [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]


def at_positions(ids, table):
    """Block ids, each with its position in the request's block table: "3 (pos 8)"."""
    position = {block_id: i for i, block_id in enumerate(table)}
    return "[" + ", ".join(f"{i} (pos {position[i]})" if i in position else str(i) for i in ids) + "]"


def check_removal(impl, window):
    m, ref = (
        manager(impl, window),
        EngineSlidingWindowManager(KVCacheGroupSpec((0,), window), BlockPool(80, True), BS, 0),
    )
    pool = m.block_pool
    for one in (m, ref):
        one.allocate_new_computed_blocks("r", [], 0)
    blocks = list(m.allocate_new_blocks("r", 48))
    ref.allocate_new_blocks("r", 48)
    start, expected = pool.get_num_free_blocks(), 0
    for n in list(range(49)) + [48, 30]:  # then a repeat and a step back: nothing more to free
        m.remove_skipped_blocks("r", n)
        ref.remove_skipped_blocks("r", n)
        assert free_ids(pool) == free_ids(ref.block_pool), (
            f"W={window}, {n} computed tokens: of the blocks one call gives back, the one nearest the window leaves "
            f"the free queue first (as free() orders a finished request's), so the free queue (head to tail) is "
            f"{free_ids(ref.block_pool)[:8]}..., as with the engine's own manager; yours is {free_ids(pool)[:8]}..."
        )
        skipped = max(0, n - window + 1)
        expected = max(expected, skipped // BS)
        num_null = sum(b.is_null for b in held(m))
        why = (
            f"tokens before {skipped} are skipped, so the first {expected} blocks are null"
            if expected == skipped // BS
            else f"an earlier call with more tokens computed nulled the first {expected} blocks: they stay null"
        )
        assert num_null == expected, f"W={window}, {n} computed tokens: {why}; {num_null} are"
        assert all(b.is_null for b in held(m)[:num_null]) and held(m)[num_null:] == blocks[num_null:], (
            "null blocks replace the leading blocks, and the others stay where they were"
        )
        assert pool.get_num_free_blocks() == start + num_null, "each removed block goes back to the pool once"
        assert all(b.ref_cnt == 0 for b in blocks[:num_null]) and all(b.ref_cnt == 1 for b in blocks[num_null:]), (
            f"W={window}, {n} computed tokens: each of the {num_null} removed blocks drops its one reference "
            f"(ref_cnt 0) and every block kept is still held once (ref_cnt 1); the request's blocks have ref_cnt "
            f"{[b.ref_cnt for b in blocks]}"
        )
    # A request whose window jumps ahead frees several blocks in one call (a long chunk): the order shows, at the
    # queue's head for unhashed blocks and at its tail for cached ones (block 0 freed first would misplace either).
    jumped = (40 - window + 1) // BS
    for request_id, hashed in (("jump", False), ("cached", True)):
        tables = []
        for one in (m, ref):
            one.allocate_new_computed_blocks(request_id, [], 0)
            new_blocks = list(one.allocate_new_blocks(request_id, 48))
            tables.append([b.block_id for b in new_blocks])
            if hashed:
                for i, block in enumerate(new_blocks):
                    block.block_hash = make_block_hash_with_group_id(HASHES[i], 0)
            one.remove_skipped_blocks(request_id, 40)
        end, ids = ("tail", slice(-6, None)) if hashed else ("head", slice(None, 6))
        assert free_ids(pool) == free_ids(ref.block_pool), (
            f"W={window}, a window that jumps to 40 computed tokens over a request's {'cached' if hashed else 'unhashed'} "
            f"blocks frees its first {jumped} (table positions 0 .. {jumped - 1}) at once: they join the free queue's "
            f"{end}, the one nearest the window leaving first and position 0 last, so the queue's {end} is block ids "
            f"{at_positions(free_ids(ref.block_pool)[ids], tables[1])}, as with the engine's own manager; yours is "
            f"{at_positions(free_ids(pool)[ids], tables[0])}"
        )
    # A request admitted with a short hit holds fewer blocks than the skipped count covers.
    m.allocate_new_computed_blocks("short", [], 0)
    m.allocate_new_blocks("short", 4)
    m.remove_skipped_blocks("short", 40)
    assert [b.is_null for b in held(m, "short")] == [True], "cap the skipped blocks at the blocks held"
    before = free_ids(pool)
    m.remove_skipped_blocks("never-admitted", 40)
    assert "never-admitted" not in m.req_to_blocks and free_ids(pool) == before, (
        f"W={window}: remove_skipped_blocks('never-admitted', 40) for a request with no entry (allocate_slots calls it "
        f"for a request being admitted) must change nothing and add no entry; req_to_blocks now has "
        f"{sorted(m.req_to_blocks)}"
    )


def cache(pool, group_id, indices):
    """A free cached block under HASHES[i] in group_id, for each i: what a finished request leaves."""
    cache_blocks_at(pool, group_id, indices, HASHES, BS)


def expected_hit(patterns, window, num_blocks, eagle):
    """The longest L whose blocks max(0, L - n) .. L - 1 are cached in every group, n = ceil((W - 1) / 4)
    (+ 1 with EAGLE, which then drops the last block)."""
    n = max(-(-(window - 1) // BS) + eagle, 1)  # at W = 1 the hit's last block must be cached all the same
    for length in range(num_blocks, 0, -1):
        if all(all(p[max(0, length - n) : length]) for p in patterns):
            return length - eagle
    return 0


@pytest.mark.task("12.3", "find_longest_cache_hit: the longest hit that covers its next query's window, EAGLE or not")
def test_find_longest_cache_hit(impl):
    rng = random.Random(12)
    for case in range(600):
        eagle = case % 2 == 1
        window = rng.choice([1, 2, 4, 5, 8, 9, 13, 16])
        num_groups = rng.choice([1, 2])
        size = rng.randrange(0, 14)
        density = rng.choice([0.5, 0.8, 0.95])
        patterns = [[rng.random() < density for _ in range(size)] for _ in range(num_groups)]
        pool = BlockPool(80, enable_caching=True)
        for g, p in enumerate(patterns):
            cache(pool, g, [i for i, c in enumerate(p) if c])
        max_length = rng.randrange(0, size * BS + 3)
        num_blocks = min(max_length // BS, size)
        hits = manager(impl, window, pool, eagle).find_longest_cache_hit(
            HASHES[:size], max_length, list(range(num_groups))
        )
        expected = expected_hit([p[:num_blocks] for p in patterns], window, num_blocks, eagle)
        cached = " and ".join("".join(".X"[c] for c in p) for p in patterns)
        where = (
            f"case {case}: W={window}{', EAGLE' if eagle else ''}, block_size {BS}, blocks cached (X) "
            f"{cached or 'none'}{' in groups 0 and 1' if num_groups == 2 else ''}, max_length={max_length}"
        )
        assert len(hits) == num_groups, f"{where}: one list per group, got {len(hits)}"
        n = max(-(-(window - 1) // BS) + eagle, 1) - eagle  # cached entries the returned hit ends with
        want = ["∅" if i < expected - n else f"c{i}" for i in range(expected)]
        for g, h in enumerate(hits):
            got = [shown(block, pool, g, size) for block in h]
            assert len(h) == expected, (
                f"{where}: group {g}'s hit is {plural(expected)} ({expected * BS} tokens): {listed(want)}; "
                f"yours is {plural(len(h))}: {listed(got)}"
            )
            for i, block in enumerate(h):
                if i < expected - n:
                    assert block.is_null, (
                        f"{where}: group {g}'s hit of {plural(expected)} is {listed(want)}; yours is {listed(got)}: "
                        f"entry {i} holds tokens no query past the hit sees, so it is the null block"
                    )
                else:
                    assert block is pool.get_cached_block(HASHES[i], kv_cache_group_id=g), (
                        f"{where}: group {g}'s hit of {plural(expected)} is {listed(want)}; yours is {listed(got)}: "
                        f"entry {i} is the group's cached block of block_hashes[{i}] (c{i})"
                    )


def shown(block, pool, group_id, size):
    """A hit entry as the messages show it: ∅ for the null block, c<i> for group_id's cached block of HASHES[i],
    else its id."""
    if not isinstance(block, KVCacheBlock):
        return repr(block)
    if block.is_null:
        return "∅"
    i = next((i for i in range(size) if pool.get_cached_block(HASHES[i], kv_cache_group_id=group_id) is block), None)
    return f"c{i}" if i is not None else f"block id {block.block_id} (not group {group_id}'s cached block of any hash)"


def plural(n):
    return f"{n} block{'s' * (n != 1)}"


def listed(entries):
    return "[" + ", ".join(entries) + "]" if entries else "[] (no hit)"


def prompts():
    rng = random.Random(5)
    shared = [rng.randrange(3, 256) for _ in range(40)]
    return [shared + [rng.randrange(3, 256) for _ in range(30 + 9 * i)] for i in range(6)]


def serve(model, manager_cls, **kwargs):
    """Greedy tokens of six prompts, and after every step a check of every sliding group's table."""
    llm = LLM(model, block_size=8, progress=False, sliding_window_manager_cls=manager_cls, **kwargs)
    engine, window = llm.engine, model.config.sliding_window
    for p in prompts():
        engine.add_request(p, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    outputs, last_computed = {}, {}
    while engine.has_unfinished_requests():
        outputs.update((o.request_id, o.outputs[0].token_ids) for o in engine.step())
        # A decode step: the request ran in the step before too and computed one token past its prompt. (A request
        # readmitted after preemption recomputes past its prompt in a chunk, which holds the chunk's blocks too.)
        decoded = {
            r.request_id
            for r in engine.scheduler.running
            if last_computed.get(r.request_id) == r.num_computed_tokens - 1 >= r.num_prompt_tokens
        }
        last_computed = {r.request_id: r.num_computed_tokens for r in engine.scheduler.running}
        for request in engine.scheduler.running:
            c = request.num_computed_tokens
            for g, m in enumerate(engine.kv_cache_manager.coordinator.single_type_managers[1:], 1):
                assert request.request_id in m.req_to_blocks, (
                    f"running request {request.request_id} has no block table in sliding group {g}'s "
                    f"req_to_blocks (it holds {sorted(m.req_to_blocks)}): a running request keeps its entry; "
                    f"remove_skipped_blocks puts the null block in freed slots, it never drops the entry"
                )
                blocks = m.req_to_blocks[request.request_id]
                # The last allocate_slots ran for a query at c - 1 or earlier, which saw from c - W on.
                seen = max(0, c - window) // 8
                assert not any(b.is_null for b in blocks[seen:]), (
                    f"a block the query at {c} still sees (window {window}) was freed"
                )
                if request.request_id in decoded:
                    assert sum(not b.is_null for b in blocks) <= -(-window // 8) + 1, (
                        "while decoding, a sliding group holds at most ceil(W / block_size) + 1 blocks"
                    )
    pool = engine.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1, "every block is back in the pool at the end"
    return [outputs[k] for k in sorted(outputs, key=int)], llm.get_stats()


@pytest.mark.task("12.4", "your manager serves a hybrid model: the engine's tokens, within the window, no leak")
def test_your_manager_serves_a_hybrid_model(impl):
    model = LlamaForCausalLM.random(LlamaConfig.tiny_hybrid(16), seed=3, std=0.2)
    for engine in ({"kv_cache_memory_bytes": 2**20}, {"num_gpu_blocks_override": 64}):  # caching, preempting
        theirs, their_stats = serve(model, EngineSlidingWindowManager, **engine)
        mine, stats = serve(model, impl.SlidingWindowManager, **engine)
        assert mine == theirs, f"with {engine}: greedy tokens differ from the engine's own manager's"
        if "num_gpu_blocks_override" in engine:
            assert stats.num_preemptions > 0, (
                f"with {engine} the six requests must outgrow the pool and be preempted, as they are with the "
                f"engine's own manager ({their_stats.num_preemptions} times); with yours: {stats.num_preemptions}"
            )
        else:
            assert stats.prefix_cache_hits > 0, "the shared 40-token prefix should hit in every group"


# ---- 12.5: your manager beside the engine's, over random workloads --------------------------------------------


@pytest.mark.task("12.5", "under random workloads a hybrid model's blocks, hits and frees are the engine's")
@settings(max_examples=500)
@given(
    workload=scheduler_workloads(
        window=st.one_of(st.integers(1, 4), st.integers(1, 13)),
        sliding_groups=st.integers(1, 2),
        use_eagle=st.sampled_from([False, False, True]),
    )
)
# W = 1: a's three sliding blocks, freed while it decodes, are evicted by b; c then repeats a's prompt, and only the
# full group still has it, so no hit (a search that takes a miss for the end of a run finds 8 tokens of null blocks).
@example(
    workload=(
        {
            "num_blocks": 5,
            "budget": 16,
            "policy": "fcfs",
            "caching": True,
            "threshold": 0,
            "max_num_seqs": 4,
            "window": 1,
            "sliding_groups": 1,
            "use_eagle": False,
        },
        [
            ("add", 12, 0, 0, 2, False),
            ("step", 3),
            ("add", 10, 1, 0, 1, False),
            ("step", 2),
            ("add", 13, 0, 0, 1, False),
            ("step", 2),
        ],
    )
)
def test_matches_the_engine(impl, workload):
    """The engine's scheduler drives two KV cache managers of a hybrid model (a full-attention group and one or two
    sliding groups, blocks of 4 tokens, so a HybridKVCacheCoordinator), one with your SlidingWindowManager, one with
    the engine's; after each step every plan, block id of every group, the free queue's order and the prefix-cache
    counts must agree."""
    cfg, ops = workload
    groups = get_kv_cache_groups([cfg["window"]] * cfg["sliding_groups"] + [None])
    num_blocks = cfg["num_blocks"] * len(groups)

    def build(yours: bool) -> Scheduler:
        manager = KVCacheManager(
            BS,
            BlockPool(num_blocks, cfg["caching"]),
            kv_cache_groups=groups,
            use_eagle=cfg["use_eagle"],
            sliding_window_manager_cls=impl.SlidingWindowManager if yours else EngineSlidingWindowManager,
        )
        return Scheduler(scheduler_config(cfg), manager)

    replay_workload(
        build,
        cfg,
        ops,
        BS,
        f"{num_blocks - 1} usable blocks of {BS} tokens shared by {len(groups)} groups",
        plan_rules=True,
    )
