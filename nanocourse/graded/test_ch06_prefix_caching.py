"""Chapter 06 graded tasks: your BlockPool, FullAttentionManager and KVCacheManager. Run with `make grade CH=06`.

Each task calls one of your methods on a pool or manager that the engine itself brought into a known
state. For that call the object becomes an instance of your class in which every other seam method is
the engine's, so a task fails only for the method it names, while helpers you add to your class (and
super()) still work. The expected values were worked out by hand. The open design, 06.8, comes first, as the
notebook asks the learner to do it first; 06.6 and 06.7 run the whole engine on your three classes.
"""

import collections
import contextlib
import copy
import reprlib
import traceback
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import example, given, settings

from nanocourse.differential import replay_workload, scheduler_config, scheduler_workloads
from nanocourse.lru_view import PlacedFreePool, chatbot_prompts, free_queue_ids, replay_hit_rate
from nanoengine import LLM, SamplingParams
from nanoengine.config import LlamaConfig
from nanoengine.core import (
    BlockPool,
    FullAttentionManager,
    KVCacheBlock,
    KVCacheBlocks,
    KVCacheManager,
    get_request_block_hasher,
)
from nanoengine.core.sched.scheduler import Scheduler, SchedulerConfig
from nanoengine.kv_cache_interface import KVCacheGroupSpec
from nanoengine.model import LlamaForCausalLM
from nanoengine.request import Request, RequestStatus

CHAPTER = "ch06_prefix_caching"
BS = 4
HASHER = get_request_block_hasher(BS)


def _engine_place_freed(queue, freed):
    """Task 06.8 in "nanoengine" mode: where the engine's BlockPool.free_blocks puts the same blocks when a
    request's last references go, freed last block first as its managers free them."""
    for block in freed:
        block.ref_cnt = 1  # the reference free_blocks drops
    BlockPool.free_blocks(SimpleNamespace(free_block_queue=queue), reversed(freed))


NANOENGINE = {
    "BlockPool": BlockPool,
    "FullAttentionManager": FullAttentionManager,
    "KVCacheManager": KVCacheManager,
    "place_freed": _engine_place_freed,
}


POOL_SEAM = ("free_blocks",)
FULL_ATTENTION_SEAM = ("get_num_blocks_to_allocate", "free")
MANAGER_SEAM = ("get_computed_blocks", "allocate_slots")


def mine(impl, obj, name, *args):
    """Your method `name` called on obj (an engine BlockPool, FullAttentionManager or KVCacheManager in a
    known state).

    For the call obj is lent a subclass of your class whose other seam methods are the engine's: the
    task tests this one method of yours, and your helper methods and super() calls still resolve.
    """
    yours, engine, seam = (
        (impl.BlockPool, BlockPool, POOL_SEAM)
        if isinstance(obj, BlockPool)
        else (impl.FullAttentionManager, FullAttentionManager, FULL_ATTENTION_SEAM)
        if isinstance(obj, FullAttentionManager)
        else (impl.KVCacheManager, KVCacheManager, MANAGER_SEAM)
    )
    only_name = type(yours.__name__, (yours,), {n: getattr(engine, n) for n in seam if n != name})
    own_class, obj.__class__ = obj.__class__, only_name
    try:
        return getattr(obj, name)(*args)
    finally:
        obj.__class__ = own_class


def request(req_id, tokens):
    return Request(req_id, list(tokens), block_hasher=HASHER)


def full(manager, group=0):
    """The KV cache manager's single-type manager of one group (the only one, for a one-group model)."""
    return manager.coordinator.single_type_managers[group]


def full_attention(pool):
    """A lone FullAttentionManager of group 0 over pool, as the coordinator builds one."""
    return FullAttentionManager(KVCacheGroupSpec(layer_ids=()), pool, BS, 0)


def running(manager, req_id, tokens):
    """A request admitted by the engine's own scheduler; returns it and its block table."""
    req = request(req_id, tokens)
    scheduler = Scheduler(SchedulerConfig(max_num_batched_tokens=req.num_tokens), manager)
    scheduler.add_request(req)
    scheduler.schedule()
    assert req.status == RequestStatus.RUNNING, (
        f"setup: the engine's own scheduler could not admit request {req_id} ({req.num_tokens} tokens) with "
        f"{manager.block_pool.get_num_free_blocks()} blocks free (status {req.status.name}): a call to your code "
        f"above left the pool in another state than the hand-worked one"
    )
    return req, list(manager.get_blocks(req_id).blocks[0])


def pool_state(pool):
    return (
        free_queue_ids(pool),
        [(b.block_id, b.ref_cnt, b.block_hash) for b in pool.blocks],
        sorted((h, b.block_id) for h, b in pool.cached_block_hash_to_block.items()),
    )


def manager_state(manager):
    """The pool's state, then each group's req_to_blocks (block ids) and num_cached_block."""
    groups = manager.coordinator.single_type_managers
    return (
        pool_state(manager.block_pool),
        [{r: [b.block_id for b in bs] for r, bs in m.req_to_blocks.items()} for m in groups],
        [dict(m.num_cached_block) for m in groups],
    )


_REPR = reprlib.Repr()
_REPR.maxlist = _REPR.maxdict = 12


def short(value) -> str:
    """A list or dict for a failure message, cut after 12 entries."""
    return _REPR.repr(value)


def hex6(block_hash) -> str:
    return "no hash" if block_hash is None else f"hash {block_hash.hex()[:6]}"


def id_text(blocks) -> str:
    """What a method returned, in block ids: 'block 3', 'blocks [3, 4]', or the value itself."""
    if isinstance(blocks, KVCacheBlock):
        return f"block {blocks.block_id}"
    if isinstance(blocks, KVCacheBlocks):
        return f"KVCacheBlocks({', '.join(id_text(list(group)) for group in blocks.blocks)})"
    if isinstance(blocks, tuple) and all(isinstance(g, list) for g in blocks):
        return f"({', '.join(id_text(g) for g in blocks)}{',' if len(blocks) == 1 else ''})"
    if isinstance(blocks, (list, tuple)) and all(isinstance(b, KVCacheBlock) for b in blocks):
        return f"blocks {short([b.block_id for b in blocks])}"
    return short(blocks)


def pool_diff(before, after) -> str:
    """The first part of two pool_state()s that differs, in words: the free queue, then the blocks'
    ref counts, then their hashes, then the pool's hash map."""
    (queue0, blocks0, map0), (queue1, blocks1, map1) = before, after
    if queue0 != queue1:
        return f"the free queue (head to tail) was {short(queue0)}, is now {short(queue1)}"
    for (block_id, ref0, _), (_, ref1, _) in zip(blocks0, blocks1):
        if ref0 != ref1:
            return f"the ref counts differ: block {block_id}'s ref_cnt was {ref0}, is now {ref1}"
    for (block_id, _, hash0), (_, _, hash1) in zip(blocks0, blocks1):
        if hash0 != hash1:
            return f"the hashes differ: block {block_id} had {hex6(hash0)}, now {hex6(hash1)}"
    if map0 != map1:
        lost = sorted(b for _, b in set(map0) - set(map1))
        gained = sorted(b for _, b in set(map1) - set(map0))
        return f"the hash map differs: it lost the entries of blocks {lost} and gained entries for blocks {gained}"
    return "nothing differs"


def manager_diff(before, after) -> str:
    """The first part of two manager_state()s that differs, in words: the pool's, then each group's
    req_to_blocks, then num_cached_block."""
    if before[0] != after[0]:
        return pool_diff(before[0], after[0])
    for g, (was, now) in enumerate(zip(before[1], after[1])):
        if was != now:
            return f"group {g}'s req_to_blocks (block ids) was {short(was)}, is now {short(now)}"
    for g, (was, now) in enumerate(zip(before[2], after[2])):
        if was != now:
            return f"group {g}'s num_cached_block was {short(was)}, is now {short(now)}"
    return "nothing differs"


@contextlib.contextmanager
def must_raise(exception, rule):
    """pytest.raises(exception), whose failure says which rule the call broke."""
    try:
        yield
    except exception:
        return
    pytest.fail(f"{rule}; it raised nothing")


def lookup(impl, kv, req, record_stats=True):
    """Your get_computed_blocks, its blocks as block ids per group: (ids, tokens), or what it returned."""
    got = mine(impl, kv, "get_computed_blocks", req, record_stats)
    assert isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], KVCacheBlocks), (
        f"get_computed_blocks({req.request_id}) must return (KVCacheBlocks, num_hit_tokens), the blocks one list "
        f"per KV cache group as the coordinator finds them; got {id_text(got)}"
    )
    return got[0].get_block_ids(), got[1]


# ---- 06.8: an open design, graded by its invariants and its hit rate, not by equality with the engine ----------

# 06.8's bar with 27 usable blocks. Measured (chapter 06's notebook, after its reveal): vLLM 0.33's order 0.814, the
# same without the reverse free 0.766, every block to the tail 0.657-0.673. Needs unhashed-first and root-last.
DESIGN_GOAL_27 = 0.80


def _checked(place):
    """place_freed, with every contract rule checked at each call: it may only order the free queue."""

    def checked(queue, freed):
        given = list(freed)  # place_freed may consume or reorder its list
        before = [b.block_id for b in queue.get_all_free_blocks()]
        hashes = [b.block_hash for b in given]
        call = f"place_freed(queue {short(before)}, freed {short([b.block_id for b in given])})"
        place(queue, freed)
        after = queue.get_all_free_blocks()
        ids = [b.block_id for b in after]
        assert sorted(ids) == sorted(before + [b.block_id for b in given]) and len(set(ids)) == len(ids), (
            f"{call} left the queue {short(ids)}: afterwards the queue must hold every block it held and every "
            f"freed block, each once (a block missing is leaked: nobody can ever take it again)"
        )
        assert queue.num_free_blocks == len(ids), (
            f"{call}: the queue's num_free_blocks says {queue.num_free_blocks}, but it lists {len(ids)} blocks"
        )
        in_use = [b.block_id for b in after if b.ref_cnt or b.is_null]
        assert not in_use, f"{call} queued blocks {in_use}, held or null: a block in use must never be evicted"
        changed = [b.block_id for b, h in zip(given, hashes) if b.block_hash != h]
        assert not changed, (
            f"{call} changed the hash of blocks {changed}: a freed block keeps its hash until get_new_blocks hands "
            f"it out (lazy eviction), so only the queue's order may decide what is lost"
        )

    return checked


@pytest.mark.task("06.8", "design: place_freed orders the free queue so the chat workload reaches its hit-rate goal")
def test_place_freed_design(impl):
    place = _checked(impl.place_freed)
    designed = lambda n, caching: PlacedFreePool(n, caching, place)
    # Greedy requests sharing a prefix, on a pool small enough to evict: the model sees the same KV.
    model = LlamaForCausalLM.random(LlamaConfig.tiny(), seed=2, std=0.2)
    system = list(range(100, 112))
    prompts = [system + [7, 8], list(range(200, 222)), system + [5, 6, 7], system, list(range(200, 214))]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    runs = {}
    for name, pool in (("yours", designed), ("engine", None)):
        llm = LLM(model, progress=False, block_size=4, num_gpu_blocks_override=9, block_pool=pool)
        runs[name] = llm, [llm.generate(prompt_token_ids=p, sampling_params=params)[0] for p in prompts]
    (llm, mine_), (_, engine) = runs["yours"], runs["engine"]
    assert [o.token_ids for o in mine_] == [o.token_ids for o in engine], first_token_difference(mine_, engine)
    pool = llm.engine.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1, (
        f"after 5 greedy requests on 8 usable blocks of 4 tokens, every block must be free again: "
        f"{pool.get_num_free_blocks()} of {pool.num_gpu_blocks - 1} are"
    )
    named = {(h, b.block_id) for h, b in pool.cached_block_hash_to_block.items()}
    hashed = {(b.block_hash, b.block_id) for b in pool.blocks if b.block_hash is not None}
    assert named == hashed, "a block has a hash iff the pool's map holds it under that hash: a hit is then a prefix"
    # The measured outcome: the chapter's chat workload on 31 usable blocks of 16 tokens, where the ceiling needs
    # the blocks nobody can hit to go first, and on 27, where memory is short enough that the order within a
    # chain decides too: a freed chain must lose its last blocks before its root.
    chat = chatbot_prompts(300)
    systems = len({tuple(p[:48]) for p in chat})
    ceiling = 48 * (len(chat) - systems) / sum(len(p) for p in chat)
    for usable, goal in ((31, ceiling), (27, DESIGN_GOAL_27)):
        got = replay_hit_rate(chat, designed(usable + 1, True))
        assert got >= goal - 1e-9, (
            f"on the chapter's chat workload (chatbot_prompts(300): 8 system prompts of 48 tokens, Zipf popularity) "
            f"with {usable} usable blocks of 16 tokens your order's hit rate is {got:.3f}; the goal is {goal:.3f} "
            f"(the ceiling, every system prompt's first use missing and no other, is {ceiling:.3f}). "
            + (
                "Which freed blocks did your order let go before the system prompts?"
                if usable == 31
                else "With less memory a system prompt's chain is cut into: which of its blocks should go first?"
            )
        )


@pytest.mark.task(
    "06.1", "find: a request's hit always leaves a token to compute, a lookup is counted once and changes nothing"
)
def test_lookup(impl):
    kv = KVCacheManager(BS, 11)
    a, table = running(kv, "A", range(13))
    kv.free(a)
    pool = kv.block_pool
    before = pool_state(pool)
    table_ids = [b.block_id for b in table]
    got = lookup(impl, kv, request("B", range(13)), record_stats=False)
    assert got == ((table_ids[:3],), 12), (
        f"all 3 full blocks hit: a 13-token B starting with A's 12 cached tokens must get A's blocks "
        f"{table_ids[:3]} (one list: one KV cache group) and 12 tokens (hits count in tokens), got {got}"
    )
    got = lookup(impl, kv, request("C", range(12)), False)
    assert got == ((table_ids[:2],), 8), (
        f"a 12-token prompt, all of it cached, may reuse 8 tokens at most (blocks {table_ids[:2]}): its last token "
        f"must be computed, so the hit stops at (12 - 1) // 4 = 2 blocks; got {got}"
    )
    got = lookup(impl, kv, request("D", [99, *range(1, 13)]), False)
    assert got == (((),), 0) or got == (([],), 0), (
        f"D differs from A in its first token, so its first block misses: expected no block and 0 tokens, got {got}"
    )
    after = pool_state(pool)
    assert after == before, f"a lookup must not change ref_cnt or the free queue: {pool_diff(before, after)}"
    # Counting: once with record_stats, never without, never for a request that looks nothing up.
    kv.make_prefix_cache_stats()
    lookup(impl, kv, request("E", range(13)))
    stats = kv.make_prefix_cache_stats()
    assert (stats.requests, stats.queries, stats.hits) == (1, 13, 12), (
        f"get_computed_blocks(E, record_stats=True), 13 tokens of which 12 hit, must count one lookup of 13 tokens "
        f"with 12 hit (self.record_prefix_cache_stats): the stats say {stats.requests} lookups, {stats.queries} "
        f"tokens, {stats.hits} hit"
    )
    lookup(impl, kv, request("H", [*range(8), *range(80, 90)]))  # 18 tokens: cap 16, but only A's 2 blocks hit
    stats = kv.make_prefix_cache_stats()
    assert (stats.requests, stats.queries, stats.hits) == (1, 18, 8), (
        f"get_computed_blocks(H, record_stats=True), 18 tokens whose first 8 are A's cached blocks 0 and 1: the "
        f"stats count the tokens the hit covers, 8, not the 16 the last-token rule allowed: the stats say "
        f"{stats.requests} lookups, {stats.queries} tokens, {stats.hits} hit"
    )
    lookup(impl, kv, request("F", range(13)), False)
    counted = kv.make_prefix_cache_stats().requests
    assert counted == 0, (
        f"get_computed_blocks(F, record_stats=False) must not count the lookup (the scheduler records it "
        f"at admission), yet the stats counted {counted} request(s)"
    )
    g = Request("G", list(range(13)), SamplingParams(prompt_logprobs=1), block_hasher=HASHER)
    assert g.skip_reading_prefix_cache, "a request that wants prompt logprobs skips reading the cache"
    got = lookup(impl, kv, g)
    assert got[1] == 0 and not any(got[0]), (
        f"G asks for prompt logprobs (request.skip_reading_prefix_cache), which need every prompt position's "
        f"logits: no hit, though its 12 tokens are cached; got {got}"
    )
    assert kv.make_prefix_cache_stats().requests == 0, "a request that skips reading the cache is not counted"
    off = KVCacheManager(BS, 11, enable_caching=False)
    got = lookup(impl, off, request("E", range(13)), False)
    assert got[1] == 0 and not any(got[0]), f"no prefix caching (enable_caching False), no hit: got {got}"


@pytest.mark.task("06.2", "free_blocks: the free queue ranks blocks by how likely they are to be hit again")
def test_free_blocks_order(impl):
    kv = KVCacheManager(BS, 11)
    old, (old_block,) = running(kv, "O", range(50, 54))
    kv.free(old)
    a, table = running(kv, "A", range(14))  # three full blocks and a partial one
    ids = [b.block_id for b in table]
    pool = kv.block_pool
    mine(impl, pool, "free_blocks", reversed(table))
    queue = free_queue_ids(pool)
    assert [b.ref_cnt for b in table] == [0, 0, 0, 0], (
        f"free_blocks drops one reference on each block it is given: A's {id_text(table)} held one each, so "
        f"their ref_cnt must be [0, 0, 0, 0], got {[b.ref_cnt for b in table]}"
    )
    assert len(queue) == 10 and pool.get_num_free_blocks() == 10, (
        f"every block of the request is free again, once: expected 10 free blocks, got a queue of {len(queue)} "
        f"({queue}) and {pool.get_num_free_blocks()} free"
    )
    assert queue[0] == ids[3], (
        f"free_blocks(A's {id_text(table)}, last first), A's partial block {ids[3]} unhashed: vLLM 0.33's rule, which "
        f"06.2 asks for whatever your 06.8 design chose, puts a block without a hash at the head, reused first, since "
        f"nobody can ever hit it and each allocation it serves spares a cached block; got a free queue {queue}"
    )
    assert queue[-3:] == ids[2::-1], (
        f"free_blocks(A's {id_text(table)}, last first): vLLM 0.33's rule appends hashed blocks to the tail in the "
        f"order given, {ids[2::-1]}: the caller lists a chain's last block first, so the root, which every later hit "
        f"on the prefix needs, is evicted last; got a free queue ending {queue[-3:]}"
    )
    assert queue.index(old_block.block_id) < queue.index(ids[2]), (
        f"block {old_block.block_id}, cached and freed earlier, must stay ahead of A's cached blocks: vLLM 0.33 "
        f"evicts cached blocks least recently used first (the tail is the most recent); got a free queue {queue}"
    )
    assert pool.get_cached_block(a.block_hashes[0]) is table[0], "freeing keeps the hashes (lazy eviction)"
    # Unhashed blocks go to the head in the order given, so the first given is reused first.
    pool = BlockPool(8, True)
    taken = pool.get_new_blocks(3)
    given = [taken[1], taken[0], taken[2]]
    mine(impl, pool, "free_blocks", list(given))
    queue = free_queue_ids(pool)
    assert queue[:3] == [b.block_id for b in given], (
        f"free_blocks({id_text(given)}), none of them hashed, on a pool whose free queue was {queue[3:]}: vLLM 0.33 "
        f"puts unhashed blocks at the head as one run in the order given (the caller's ranking: the first given is "
        f"reused first), so the queue must start {[b.block_id for b in given]}; got {queue}"
    )


@pytest.mark.task(
    "06.2b",
    "free_blocks keeps shared blocks and the null block out; FullAttentionManager.free releases "
    "a request once, in hit order",
)
def test_free_shared_null_and_double(impl):
    kv = KVCacheManager(BS, 11)
    _a, table_a = running(kv, "A", range(9))
    _b, table_b = running(kv, "B", [*range(8), 99, 98])  # reuses A's first two blocks
    pool = kv.block_pool
    mine(impl, pool, "free_blocks", reversed(table_a))
    assert [x.ref_cnt for x in table_a] == [1, 1, 0], "B still holds the first two blocks"
    queue = free_queue_ids(pool)
    assert not {b.block_id for b in table_a[:2]} & set(queue), (
        f"only a block whose ref_cnt reaches 0 is free: B still holds A's {id_text(table_a[:2])}, so they stay "
        f"out of the queue; yours queued them: the free queue (head to tail) is {short(queue)}"
    )
    assert queue[0] == table_a[2].block_id, (
        f"A's last block {table_a[2].block_id} has no hash, so it goes to the free queue's head (06.2's rule, "
        f"vLLM 0.33's: nobody can hit it, so it is reused first); the free queue (head to tail) is {short(queue)}"
    )
    before = pool_state(pool)
    with must_raise(
        ValueError,
        f"free_blocks([block {table_b[0].block_id}, block {table_a[2].block_id}]) must "
        f"raise ValueError and change nothing: block {table_a[2].block_id} is free already "
        f"(ref_cnt 0), so dropping a reference on it is a double free",
    ):
        mine(impl, pool, "free_blocks", [table_b[0], table_a[2]])  # table_a[2] is free already
    after = pool_state(pool)
    assert after == before, f"a double free changes nothing: {pool_diff(before, after)}"
    mine(impl, pool, "free_blocks", [pool.null_block, *reversed(table_b)])
    assert pool.null_block.ref_cnt == 0 and 0 not in free_queue_ids(pool), "the null block is never freed"
    want = [table_b[1].block_id, table_b[0].block_id]
    assert free_queue_ids(pool)[-2:] == want, (
        f"free_blocks([null, *reversed(B's {id_text(table_b)})]): B's hashed blocks go to the tail in the given "
        f"order, root last, so the queue must end {want}; it is {short(free_queue_ids(pool))}"
    )
    assert pool.get_num_free_blocks() == 10, (
        f"A and B freed: all 10 usable blocks must be free, each once; get_num_free_blocks() is "
        f"{pool.get_num_free_blocks()}"
    )
    # The group's free: every block of the request, last first, once.
    _c, table_c = running(kv, "C", range(300, 313))  # three full blocks and a partial one
    manager = full(kv)
    mine(impl, manager, "free", "C")
    assert free_queue_ids(pool)[0] == table_c[3].block_id, (
        f"free('C') must release every block C holds: its partial last block {table_c[3].block_id} has no hash "
        f"and goes to the head of the free queue, which is {short(free_queue_ids(pool))}"
    )
    want = [x.block_id for x in table_c[2::-1]]
    assert free_queue_ids(pool)[-3:] == want, (
        f"free('C') on C's {id_text(table_c)}: vLLM 0.33's rule, which 06.2b asks for whatever your 06.8 design chose, "
        f"hands a request's blocks to the pool last block first, so its hashed chain joins the tail as {want}, root "
        f"last and evicted last: a later prompt hits block i only through blocks 0 .. i - 1, so every hit on the "
        f"prefix needs the root; got a free queue ending {free_queue_ids(pool)[-3:]}"
    )
    assert "C" not in manager.req_to_blocks and "C" not in manager.num_cached_block, (
        f"after free('C') the manager forgets C: req_to_blocks holds {sorted(manager.req_to_blocks)}, "
        f"num_cached_block {sorted(manager.num_cached_block)}"
    )
    try:
        mine(impl, manager, "free", "C")  # a second free finds nothing to release
    except ValueError as e:
        pytest.fail(
            f"a second free('C') must find nothing to release, but the pool raised ValueError ({e}): the first "
            f"free must drop C's entry from req_to_blocks, so its blocks are not freed twice"
        )
    assert pool.get_num_free_blocks() == 10, (
        f"a second free('C') must find nothing to release: all 10 usable blocks stay free, "
        f"get_num_free_blocks() is {pool.get_num_free_blocks()}"
    )
    # A release the pool refuses changes nothing, the manager's record included: the request can be freed again.
    _d, table_d = running(kv, "D", range(400, 409))
    pool.free_blocks([table_d[-1]])  # the engine's own call: D's last block is free already
    before = pool_state(pool), list(manager.req_to_blocks.get("D", [])), manager.num_cached_block.get("D")
    with must_raise(
        ValueError,
        f"free('D') must pass the pool's refusal on: D's block {table_d[-1].block_id} is free already, so "
        f"releasing D's {id_text(table_d)} is a double free",
    ):
        mine(impl, manager, "free", "D")
    after = pool_state(pool), list(manager.req_to_blocks.get("D", [])), manager.num_cached_block.get("D")
    assert after == before, (
        f"a free('D') the pool refuses changes nothing: D keeps its entries in req_to_blocks and "
        f"num_cached_block (so it can be freed again once the fault is fixed), and the pool is as it was. "
        f"D's blocks before: {id_text(before[1])}, after: {id_text(after[1])}; in the pool: {pool_diff(before[0], after[0])}"
    )
    # A block listed twice loses two references and joins the queue once, at the listing that takes its last.
    kv = KVCacheManager(BS, 8)
    _, table_a = running(kv, "A", range(9))
    running(kv, "B", [*range(8), 99])  # B holds A's first two blocks too
    pool = kv.block_pool
    pool.free_blocks([table_a[1]])  # the engine's own call: A's block 1 keeps one reference, block 0 two
    listed = [table_a[0], table_a[1], table_a[0]]
    engine_pool = copy.deepcopy(pool)
    engine_pool.free_blocks([engine_pool.blocks[x.block_id] for x in listed])
    mine(impl, pool, "free_blocks", listed)
    assert pool_state(pool) == pool_state(engine_pool), (
        f"free_blocks({id_text(listed)}) with block {table_a[0].block_id} at ref_cnt 2 and {table_a[1].block_id} at 1: "
        f"each listing drops one reference, and a block joins the queue once, when its last reference goes (block "
        f"{table_a[1].block_id} at the second listing, block {table_a[0].block_id} at the third): "
        f"{pool_diff(pool_state(engine_pool), pool_state(pool))}"
    )


@pytest.mark.task("06.3", "allocate_slots reuses the cached prefix, allocates the rest and caches full blocks")
def test_allocate_slots(impl):
    kv = KVCacheManager(BS, 11)
    manager = full(kv)

    def allocate(req, *args):
        new = req.request_id not in full(kv).num_cached_block
        try:
            got = mine(impl, kv, "allocate_slots", req, *args)
        except ValueError as exc:
            if not (new and "Cannot cache" in str(exc)):
                raise
            raise pytest.fail.Exception(
                f"allocate_slots({req.request_id}, ...) admitting {req.request_id} lost blocks from its list before "
                f"naming them (the pool said: {exc}). Take the hits before any new block: for a request the group "
                f"does not know yet, taking its hits (self.coordinator.allocate_new_computed_blocks) makes its block "
                f"list exactly the hits, so a block appended before is dropped (and leaks), and a new block taken "
                f"first may be a free hit this call is about to take, evicting it",
                pytrace=False,
            ) from exc
        assert got is None or isinstance(got, KVCacheBlocks), (
            f"allocate_slots({req.request_id}, ...) must return the new blocks as KVCacheBlocks (one list per KV "
            f"cache group, what self.coordinator.allocate_new_blocks gives) or None: got {id_text(got)}"
        )
        return got

    def admit(req):
        hits, n = kv.get_computed_blocks(req)
        return None if allocate(req, req.num_tokens - n, n, hits) is None else n

    def held(req_id):
        return list(kv.get_blocks(req_id).blocks[0])

    a = request("A", range(10))
    got = admit(a)
    assert got == 0 and len(held("A")) == 3, (
        f"A (10 tokens, empty cache) hits nothing and needs ceil(10 / 4) = 3 blocks: "
        f"{'allocate_slots returned None' if got is None else f'A was admitted with {got} hit tokens'}, "
        f"and A holds {id_text(held('A'))}"
    )
    assert [x.block_hash for x in held("A")[:2]] == a.block_hashes and manager.num_cached_block["A"] == 2, (
        f"A's two full blocks are named at once (with caching on, the blocks full after this step's tokens), the "
        f"partial third is not: their hashes are {[hex6(x.block_hash) for x in held('A')]}, num_cached_block "
        f"{manager.num_cached_block.get('A')}"
    )
    b = request("B", [*range(8), 50, 51, 52, 53, 54])
    assert admit(b) == 8, (
        f"B (13 tokens, its first 8 in A's 2 cached blocks) needs 2 new blocks, and "
        f"{kv.block_pool.get_num_free_blocks()} are free: allocate_slots must admit it, not return None"
    )
    assert held("B")[:2] == held("A")[:2] and [x.ref_cnt for x in held("B")[:2]] == [2, 2], (
        f"on admission B's list starts with its hits, taken (self.coordinator.allocate_new_computed_blocks): it must "
        f"start with A's {id_text(held('A')[:2])} at ref_cnt [2, 2] (A and B hold them), got "
        f"{id_text(held('B')[:2])} at ref_cnt {[x.ref_cnt for x in held('B')[:2]]}"
    )
    assert len(held("B")) == 4, f"13 tokens need 4 blocks, 2 reused and 2 new: B holds {id_text(held('B'))}"
    b.num_computed_tokens = b.num_tokens
    b.append_output_token_ids([60, 61, 62])  # 16 tokens: B's last block is now full
    got = allocate(b, 3)
    assert got is not None and got.get_block_ids() == ([],), (
        f"allocate_slots(B, 3) with B at 16 tokens in 4 blocks: nothing new, so KVCacheBlocks(([],)); got {id_text(got)}"
    )
    assert manager.num_cached_block["B"] == 4, (
        f"the 3 new tokens fill B's last block, so it is named: num_cached_block['B'] must be 4, is "
        f"{manager.num_cached_block['B']}"
    )
    # A new block never evicts a hit this call takes: B's one hit, A's cached block, is the free queue's head.
    kv = KVCacheManager(BS, 12)  # 11 usable blocks
    a, (a0,) = running(kv, "A", range(4))
    y, (y0,) = running(kv, "Y", range(300, 304))
    running(kv, "X", range(600, 636))  # X holds the other 9 blocks
    kv.free(a)
    kv.free(y)  # the free queue is [A's block, Y's block], both cached
    b = request("B", [*range(4), *range(50, 54)])
    hits, n = kv.get_computed_blocks(b)
    got = allocate(b, b.num_tokens - n, n, hits)
    assert got is not None and held("B") == [a0, y0] and a0.ref_cnt == 1 and a0.block_hash == a.block_hashes[0], (
        f"free queue [block {a0.block_id} (A's, B's hit), block {y0.block_id} (Y's)], both cached: "
        f"allocate_slots(B, 4, 4, hit) must hold [block {a0.block_id}, block {y0.block_id}], the hit still cached at "
        f"ref_cnt 1 and the new block taken from behind it. A new block never evicts a hit this call takes: take the "
        f"hits before any new block. Got {id_text(got)}; B holds {id_text(held('B'))}; block {a0.block_id} is at "
        f"ref_cnt {a0.ref_cnt} with {hex6(a0.block_hash)} (A's {hex6(a.block_hashes[0])})"
    )
    # Lookahead tokens need slots but are not named; tokens past num_tokens (a caller planning ahead) are not named
    # either, since no hash covers them. Each call against the engine's allocate_slots on a copy of the manager.
    for what, tokens, args in (
        ("4 new tokens and 2 lookahead", range(4), (4, 0, None, 2)),
        ("a 4-token chunk and 4 lookahead", range(12), (4, 0, None, 4)),
        ("12 new tokens for an 8-token request", range(8), (12,)),
    ):
        kv = KVCacheManager(BS, 12)
        req = request("L", tokens)
        engine_kv, engine_req = copy.deepcopy(kv), copy.deepcopy(req)
        want = engine_kv.allocate_slots(engine_req, *args)
        try:
            got = mine(impl, kv, "allocate_slots", req, *args)
        except ValueError as exc:
            if "Cannot cache" not in str(exc):
                raise
            pytest.fail(
                f"allocate_slots with {what} ({len(tokens)}-token request, block size {BS}) asked the pool to "
                f"name blocks the request has no hash for: a block is named once the computed, new computed "
                f"and new tokens fill it, never for lookahead slots or past request.num_tokens "
                f"(the pool said: {exc})",
                pytrace=False,
            )
        same = (
            got is not None
            and isinstance(got, KVCacheBlocks)
            and [len(g) for g in got.blocks] == [len(g) for g in want.blocks]
        )
        assert same and manager_state(kv) == manager_state(engine_kv), (
            f"allocate_slots with {what} ({len(tokens)}-token request, block size {BS}): the engine returns "
            f"{len(want.blocks[0])} new blocks and names {full(engine_kv).num_cached_block['L']}; yours returned "
            f"{id_text(got)}: {manager_diff(manager_state(engine_kv), manager_state(kv))}"
        )

    # With prefix caching off nothing is named: a block no lookup will ever read needs no hash.
    kv = KVCacheManager(BS, 5, enable_caching=False)
    r = request("R", range(9))
    got = mine(impl, kv, "allocate_slots", r, 9)
    named = [b.block_id for b in kv.block_pool.blocks if b.block_hash is not None]
    assert got is not None and named == [], (
        f"allocate_slots(R, 9) with prefix caching off (enable_caching False): R gets 3 blocks and none of them "
        f"is named, since no lookup will ever read the cache; yours returned {id_text(got)} and named blocks "
        f"{named}"
    )


def assert_refused(impl, kv, req, args, rule: str) -> None:
    """Your allocate_slots(req, *args) must return None and leave the pool and the managers as they were."""
    before = manager_state(kv)
    got = mine(impl, kv, "allocate_slots", req, *args)
    after = manager_state(kv)
    if got is not None:
        raise AssertionError(f"{rule}; yours granted it, returning {id_text(got)}")
    assert after == before, f"{rule}; yours returned None (right), but the refusal changed something: " + manager_diff(
        before, after
    )


@pytest.mark.task(
    "06.3b",
    "allocate_slots is all or nothing, counting hits that leave the free queue, for the whole "
    "sequence when it must fit",
)
def test_allocate_all_or_nothing(impl):
    kv = KVCacheManager(BS, 5)  # four usable blocks
    a, _ = running(kv, "A", range(9))
    kv.free(a)  # four free blocks, two of them cached
    b = request("B", [*range(8), *range(50, 59)])  # 2 hits + 3 new blocks: 5 of 4
    hits, n = kv.get_computed_blocks(b)
    assert_refused(
        impl,
        kv,
        b,
        (b.num_tokens - n, n, hits),
        "allocate_slots(B, 9, 8, 2 hits) on 4 free blocks, 2 of them B's cached hits: B needs 3 new blocks + "
        "the 2 free hits, which leave the free queue too (self.coordinator.get_num_blocks_to_allocate counts "
        "them): 5 > 4, so it must return None and change nothing at all, before touching a hit or taking a "
        "block",
    )
    c = request("C", [*range(8), *range(50, 58)])  # 2 hits + 2 new blocks
    hits, n = kv.get_computed_blocks(c)
    new = mine(impl, kv, "allocate_slots", c, c.num_tokens - n, n, hits)
    assert new is not None and [len(g) for g in new.blocks] == [2], (
        f"C (16 tokens, 2 hit blocks) needs 2 new blocks; 2 new + 2 free hits fit the 4 free blocks, so "
        f"allocate_slots must return the 2 new blocks: got {id_text(new)}"
    )
    assert kv.block_pool.get_num_free_blocks() == 0 and [x.ref_cnt for x in hits.blocks[0]] == [1, 1], (
        f"C's admission takes all 4 free blocks (2 new, 2 hits touched out of the queue): expected 0 free and "
        f"the hits at ref_cnt [1, 1], got {kv.block_pool.get_num_free_blocks()} free and "
        f"{[x.ref_cnt for x in hits.blocks[0]]}"
    )
    # The admission gate: B's first chunk of 4 tokens (1 new block + 2 free hits) fits the 4 free blocks; its whole
    # 17 tokens (3 new + 2 hits) do not.
    kv = KVCacheManager(BS, 5)
    kv.free(running(kv, "A", range(9))[0])
    b = request("B", [*range(8), *range(50, 59)])
    hits, n = kv.get_computed_blocks(b)
    assert_refused(
        impl,
        kv,
        b,
        (4, n, hits, 0, True),
        "allocate_slots(B, 4, 8, hits, full_sequence_must_fit=True) on 4 free blocks: B's whole 17 tokens "
        "need 3 new blocks + 2 free hits = 5, so it must return None and change nothing",
    )
    got = mine(impl, kv, "allocate_slots", b, 4, n, hits)
    assert got is not None and [len(g) for g in got.blocks] == [1], (
        f"allocate_slots(B, 4, 8, hits) without full_sequence_must_fit: the 12 tokens need 1 new block + 2 free hits "
        f"= 3 of the 4 free blocks, so it must return 1 new block; got {id_text(got)}"
    )
    # The gate counts the hits as the coordinator does: hits that A still holds cost nothing and cover 2 of the
    # 3 blocks B's whole 12 tokens need.
    kv = KVCacheManager(BS, 5)
    running(kv, "A", range(9))  # A holds 3 blocks, 2 of them cached; 1 block is free
    b = request("B", [*range(8), 70, 71, 72, 73])
    hits, n = kv.get_computed_blocks(b)
    got = mine(impl, kv, "allocate_slots", b, b.num_tokens - n, n, hits, 0, True)
    assert got is not None and [len(g) for g in got.blocks] == [1], (
        f"allocate_slots(B, 4, 8, A's 2 blocks, full_sequence_must_fit=True) with 1 free block: B's whole 12 tokens "
        f"need 3 blocks, 2 of them hits that A holds (no free block to take), so 1 new block: the gate must count the "
        f"hits as the second check does, and grant 1 new block; got {id_text(got)}"
    )
    # Lookahead slots under the gate: the whole-sequence check counts request.num_tokens alone (the lookahead slots
    # are no part of the sequence), while the grant itself still needs them.
    kv = KVCacheManager(BS, 3)  # two usable blocks
    r = request("R", range(8))
    got = mine(impl, kv, "allocate_slots", r, 4, 0, None, 4, True)
    assert got is not None and [len(g) for g in got.blocks] == [2], (
        f"allocate_slots(R, 4, num_lookahead_tokens=4, full_sequence_must_fit=True) for an 8-token R on 2 free blocks: "
        f"the whole sequence is R's 8 tokens (request.num_tokens; lookahead slots are not counted in it), 2 blocks, "
        f"and the grant's 4 new + 4 lookahead slots need the same 2: it must return 2 new blocks; got {id_text(got)}"
    )
    kv = KVCacheManager(BS, 3)
    r = request("R", range(8))
    assert_refused(
        impl,
        kv,
        r,
        (8, 0, None, 4, True),
        "allocate_slots(R, 8, num_lookahead_tokens=4, full_sequence_must_fit=True) for an 8-token R on 2 free "
        "blocks: R's whole 8 tokens fit, but the grant needs slots for 8 new + 4 lookahead tokens, 3 blocks, so it "
        "must return None and change nothing",
    )

    # A sliding window's blocks are given back before the room is counted: on a full pool, the block that has left
    # the window is the one the next token takes.
    kv = KVCacheManager(BS, 3, kv_cache_groups=(KVCacheGroupSpec((0,), sliding_window=4),))  # two usable blocks
    r = request("R", range(8))
    kv.allocate_slots(r, 8)
    r.num_computed_tokens = 8
    r.append_output_token_ids(99)
    got = mine(impl, kv, "allocate_slots", r, 1)
    assert got is not None and [len(g) for g in got.blocks] == [1], (
        f"a model whose one KV cache group has a 4-token window, on a pool of 2 blocks that R (8 tokens) fills: R's "
        f"9th token needs a third slot block, and its block 0 has left the window (the next query, at position 8, "
        f"sees positions 5 to 8). self.coordinator.remove_skipped_blocks gives it back before the room is counted, "
        f"so allocate_slots(R, 1) must grant 1 new block; got {id_text(got)}"
    )

    # A refusal by the whole-sequence gate changes nothing, the window's blocks included: R (16 tokens, 8
    # computed, both blocks of a 2-block pool) has block 0 out of its 4-token window, but its whole sequence
    # needs 2 more blocks than the pool could ever free now, so the gate refuses before anything is given back.
    kv = KVCacheManager(BS, 3, kv_cache_groups=(KVCacheGroupSpec((0,), sliding_window=4),))
    r = request("R", range(16))
    kv.allocate_slots(r, 8)
    r.num_computed_tokens = 8
    assert_refused(
        impl,
        kv,
        r,
        (4, 0, None, 0, True),
        "allocate_slots(R, 4, full_sequence_must_fit=True) for R (16 tokens, 8 computed, 4-token window) holding "
        "both blocks of a 2-block pool: the whole 16 tokens need 2 blocks more than the free blocks as the call "
        "finds them, so the gate refuses, and a refusal by the gate changes nothing at all, not even the "
        "window's left-behind block",
    )


@pytest.mark.task(
    "06.3c",
    "get_num_blocks_to_allocate counts exactly the blocks the free queue would lose",
)
def test_num_blocks_to_allocate(impl):
    kv = KVCacheManager(BS, 9)  # eight usable blocks
    a, table = running(kv, "A", range(12))  # three full blocks, all named
    kv.free(a)
    running(kv, "X", [*range(4), *range(70, 76)])  # X (10 tokens) hits A's block 0 and holds 3 blocks
    held_hit = table[0]
    manager = full(kv)
    before = manager_state(kv)
    setup = (
        f"A's blocks {[x.block_id for x in table]} cached, the first held by the running X (ref_cnt "
        f"{held_hit.ref_cnt}), the other two free (ref_cnt 0)"
    )

    def count(*args):
        return mine(impl, manager, "get_num_blocks_to_allocate", *args)

    got = count("R", 13, table, 12)
    assert got == 3, (
        f"{setup}: get_num_blocks_to_allocate('R', 13, those 3 hits, 12) for a new 13-token R: 4 blocks needed, 3 "
        f"are hits, so 1 new block, plus the 2 free hits, which leave the free queue when R takes them: 3; got {got}"
    )
    got = count("R", 13, [held_hit], 4)
    assert got == 3, (
        f"{setup}: get_num_blocks_to_allocate('R', 13, [block {held_hit.block_id}], 4): 4 blocks needed, 1 is a hit "
        f"X holds (it costs nothing), so 3 new: 3; got {got}"
    )
    got = count("R", 8, [], 0)
    assert got == 2, f"get_num_blocks_to_allocate('R', 8, [], 0), no hit: ceil(8 / 4) = 2 new blocks; got {got}"
    got = count("X", 17, [], 10)
    assert got == 2, (
        f"X runs and holds 3 blocks (10 tokens): get_num_blocks_to_allocate('X', 17, [], 10) needs ceil(17 / 4) = 5 "
        f"blocks, 3 held, so 2; got {got}"
    )
    got = count("X", 12, [], 10)
    assert got == 0, (
        f"X holds 3 blocks, enough for 12 tokens: get_num_blocks_to_allocate('X', 12, [], 10) is 0; got {got}"
    )
    got = count("X", 17, [held_hit], 10)
    assert got == 2, (
        f"X runs (it is in num_cached_block): a running request takes no new hits, so "
        f"get_num_blocks_to_allocate('X', 17, [block {held_hit.block_id}], 10) counts only its new blocks, 5 - 3 "
        f"held = 2; got {got}"
    )
    after = manager_state(kv)
    assert after == before, f"counting must change nothing: {manager_diff(before, after)}"


# What the engine needs back from each of your methods (06.6): a check of (self, args, returned value) that
# gives the broken rule in words, or "" when the value is one the engine can use.
_RETURNS = {
    ("FullAttentionManager", "get_num_blocks_to_allocate"): lambda self, args, got: (
        ""
        if isinstance(got, int) and not isinstance(got, bool) and got >= 0
        else "it must return a count of free blocks, an int of at least 0"
    ),
    ("KVCacheManager", "get_computed_blocks"): lambda self, args, got: (
        ""
        if isinstance(got, tuple)
        and len(got) == 2
        and isinstance(got[0], KVCacheBlocks)
        and len(got[0].blocks) == len(self.kv_cache_groups)
        and isinstance(got[1], int)
        and got[1] % self.block_size == 0
        and all(len(group) == got[1] // self.block_size for group in got[0].blocks)
        else f"it must return (KVCacheBlocks with one list per KV cache group, here {len(self.kv_cache_groups)}, "
        f"the hit's length in tokens: whole blocks of {self.block_size}, as many as each group's list holds)"
    ),
    ("KVCacheManager", "allocate_slots"): lambda self, args, got: (
        ""
        if got is None or (isinstance(got, KVCacheBlocks) and len(got.blocks) == len(self.kv_cache_groups))
        else f"it must return None or the new blocks as KVCacheBlocks, one list per KV cache group (here "
        f"{len(self.kv_cache_groups)}), even when no group got a new block"
    ),
}


def _watched(impl):
    """Your three classes, each subclassed so that a value the engine could not use fails where your method
    returns it, naming the method and the rule, and so that your methods' last few returns are known when the
    engine fails later in its own code. Returns the three classes and the deque of those returns, oldest first."""
    last: collections.deque[str] = collections.deque(maxlen=4)

    def watch(cls):
        def wrapped(name, method):
            def call(self, *args, **kwargs):
                got = method(self, *args, **kwargs)
                problem = _RETURNS[(kind, name)](self, args, got)
                if problem:
                    pytest.fail(f"your {kind}.{name} returned {id_text(got)} to the engine: {problem}", pytrace=False)
                last.append(f"{kind}.{name} (returned {id_text(got)})")
                return got

            # The engine names the method an error came from by its code's name: yours, not this wrapper's.
            call.__code__ = call.__code__.replace(co_name=name, co_qualname=f"{kind}.{name}")
            return call

        kind = next(k for k in ("BlockPool", "FullAttentionManager", "KVCacheManager") if cls is getattr(impl, k))
        methods = {name: wrapped(name, getattr(cls, name)) for (k, name) in _RETURNS if k == kind}
        return type(cls.__name__, (cls,), methods)

    return (watch(impl.BlockPool), watch(impl.FullAttentionManager), watch(impl.KVCacheManager)), last


@contextlib.contextmanager
def engine_errors_named(last, impl):
    """An exception the engine raises in its own code while it serves from your classes fails the task with your
    methods' last returns and the state their contracts keep; one raised in your code keeps its place (the
    scorecard names your method)."""
    # the engine graded as its own learner (a namespace of its classes) has no file of yours
    yours = Path(impl.__file__).resolve() if hasattr(impl, "__file__") else None
    try:
        yield
    except (NotImplementedError, pytest.fail.Exception, AssertionError):
        raise
    except Exception as exc:
        if "NotImplementedError" in repr(exc.__cause__) + repr(exc.__context__):
            raise
        if any(Path(frame.f_code.co_filename).resolve() == yours for frame, _ in traceback.walk_tb(exc.__traceback__)):
            raise
        raise pytest.fail.Exception(
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else repr(exc)}, raised in the engine's own "
            f"code while it served from your classes. Your methods' last returns before it, oldest first: "
            f"{'; '.join(last) or 'none'}. The fault may lie in any of them, or in a call before them: a value "
            f"or a state that breaks a contract (ref counts, the free queue and its order, the hash map, "
            f"req_to_blocks and num_cached_block) often fails only later, in the engine. Make grade runs 06.1 to "
            f"06.3c on each method alone: pass those first",
            pytrace=False,
        ) from exc


def first_token_difference(yours, engine) -> str:
    """The first request whose greedy tokens differ between two runs, for a failure message."""
    i = next((i for i, (y, e) in enumerate(zip(yours, engine)) if y.token_ids != e.token_ids), 0)
    return (
        f"with your classes the model generates other greedy tokens: request {i} gave "
        f"{short(list(yours[i].token_ids))}, the engine's classes {short(list(engine[i].token_ids))}"
    )


@pytest.mark.task(
    "06.6",
    "your BlockPool, FullAttentionManager and KVCacheManager serve the engine: same tokens, same "
    "hits, no leak, for a hybrid model too",
)
def test_serves_the_engine(impl):
    model = LlamaForCausalLM.random(LlamaConfig.tiny(), seed=2, std=0.2)  # outputs that depend on the context
    system = list(range(100, 112))  # three full blocks every request shares
    prompts = [system + [7, 8], system, list(range(200, 222)), system + [5, 6, 7]]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    (pool_cls, full_cls, manager_cls), last = _watched(impl)
    yours = {"block_pool": pool_cls, "full_attention_manager_cls": full_cls, "kv_cache_manager_cls": manager_cls}

    def serve(model, prompts, **parts):
        llm = LLM(model, progress=False, **parts)
        outs = [llm.generate(prompt_token_ids=p, sampling_params=params)[0] for p in prompts]
        return llm, outs

    # 8 usable blocks of 4 tokens: request 2 (22 + 6 tokens) takes 7 of them and evicts all cached
    # blocks but the one at the free queue's tail, the system prompt's root
    with engine_errors_named(last, impl):
        llm, mine_ = serve(model, prompts, block_size=4, num_gpu_blocks_override=9, **yours)
    _, engine = serve(model, prompts, block_size=4, num_gpu_blocks_override=9)
    kv = llm.engine.kv_cache_manager
    assert (
        isinstance(kv.block_pool, impl.BlockPool)
        and isinstance(kv, impl.KVCacheManager)
        and isinstance(full(kv), impl.FullAttentionManager)
    ), (
        f"LLM(block_pool=..., full_attention_manager_cls=..., kv_cache_manager_cls=...) must serve from your classes, "
        f"but it built a {type(kv.block_pool).__name__}, a {type(full(kv)).__name__} and a {type(kv).__name__}"
    )
    got = [o.num_cached_tokens for o in mine_]
    assert got == [0, 8, 0, 4], (
        f"tokens served from the cache per request must be [0, 8, 0, 4] (the engine's "
        f"{[o.num_cached_tokens for o in engine]}): request 1 is the system prompt alone, so it reuses 2 of its 3 "
        f"blocks (the last token is computed); after request 2's evictions only the root is left; got {got}"
    )
    assert [o.token_ids for o in mine_] == [o.token_ids for o in engine], first_token_difference(mine_, engine)
    pool = kv.block_pool
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1, (
        f"every block is free again after the run, none leaked: {pool.get_num_free_blocks()} of "
        f"{pool.num_gpu_blocks - 1} are free"
    )
    # A hybrid model (three sliding layers of window 16, one full): four KV cache groups share your pool, the
    # full group's blocks are your FullAttentionManager's, the sliding groups' the engine's SlidingWindowManager's.
    hybrid = LlamaForCausalLM.random(LlamaConfig.tiny_hybrid(16), seed=3, std=0.2)
    shared = list(range(40, 80))
    prompts = [shared + list(range(100, 120)), shared + list(range(150, 181)), shared + [9, 8, 7]]

    def serve_steps(**parts):
        """Every request's tokens, its cached tokens and the free blocks after every step."""
        llm = LLM(hybrid, progress=False, block_size=8, kv_cache_memory_bytes=2**20, **parts)
        engine, pool = llm.engine, llm.engine.kv_cache_manager.block_pool
        outputs, free = {}, []
        for p in prompts:
            engine.add_request(p, params)
            while engine.has_unfinished_requests():
                outputs.update((o.request_id, o) for o in engine.step())
                free.append(pool.get_num_free_blocks())
        done = [outputs[k] for k in sorted(outputs, key=int)]
        return [o.outputs[0].token_ids for o in done], [o.num_cached_tokens for o in done], free, pool

    with engine_errors_named(last, impl):
        tokens, cached, free, pool = serve_steps(**yours)
    want_tokens, want_cached, want_free, _ = serve_steps()
    assert cached == want_cached, (
        f"a hybrid model (4 KV cache groups in one pool, each naming its blocks by hash and group id) served from "
        f"your classes must reuse the engine's cached tokens per request, {want_cached}: got {cached}"
    )
    step = next((i for i, (a, b) in enumerate(zip(free, want_free)) if a != b), None)
    assert step is None, (
        f"a hybrid model served from your classes must hold the blocks the engine's classes hold: after step {step} "
        f"{free[step]} blocks are free, with the engine's classes {want_free[step]} (a sliding group gives back the "
        f"blocks its window has left, self.coordinator.remove_skipped_blocks, before allocate_slots counts the room)"
    )
    assert tokens == want_tokens, "hybrid model: with your classes the model generates other greedy tokens"
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1, (
        f"hybrid model: every block is free again after the run: {pool.get_num_free_blocks()} of "
        f"{pool.num_gpu_blocks - 1} are free"
    )


# ---- 06.7: your pool and managers beside the engine's, over random workloads ----------------------------------


# A request asking for prompt logprobs after its prefix is cached: it must not read the cache (no hit).
_SKIP_READING_EXAMPLE = (
    {"num_blocks": 12, "budget": 16, "policy": "fcfs", "caching": True, "threshold": 0, "max_num_seqs": 4},
    [("add", 9, 0, 0, 2, False), ("step", 3), ("add", 9, 0, 0, 2, True)],
)


@pytest.mark.task("06.7", "under random workloads your pool and managers hold, hit, free and evict as the engine's")
@settings(max_examples=600)
@given(workload=scheduler_workloads())
@example(workload=_SKIP_READING_EXAMPLE)
def test_matches_the_engine(impl, workload):
    """The engine's scheduler drives your BlockPool, FullAttentionManager and KVCacheManager and, beside them, the
    engine's own; after each step every plan, block id, the free queue's order and the prefix-cache counts must
    agree."""
    cfg, ops = workload

    def build(yours: bool) -> Scheduler:
        pool_cls, full_cls, manager_cls = (
            (impl.BlockPool, impl.FullAttentionManager, impl.KVCacheManager)
            if yours
            else (BlockPool, FullAttentionManager, KVCacheManager)
        )
        manager = manager_cls(BS, pool_cls(cfg["num_blocks"], cfg["caching"]), full_attention_manager_cls=full_cls)
        return Scheduler(scheduler_config(cfg), manager)

    # With caching off no block is ever hashed, so vLLM 0.33's free_blocks sends every freed block to the head.
    unhashed = "" if cfg["caching"] else " (no block has a hash: all go to the head in the order free hands them over)"
    replay_workload(build, cfg, ops, BS, f"{cfg['num_blocks'] - 1} usable blocks of {BS} tokens{unhashed}")
