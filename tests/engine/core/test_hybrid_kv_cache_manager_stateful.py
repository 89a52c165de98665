"""KVCacheManager of a hybrid model (its HybridKVCacheCoordinator) under random scheduler-like runs, against a plain-Python model.

Caching is dense (prefix_cache_retention_interval=None: every full block cached, in every group), the rule
this model predicts; vLLM 0.33's default sparse retention is tested in test_sliding_window_retention.py.

A small pool (block size 4; 12 to 40 blocks, drawn per example) serves a model with three sliding
layers of window W and one full-attention layer: four KV cache groups, full attention first. W is
drawn per example from {4, 5, 9}. Each step acts as the Scheduler does: add a request; admit a
waiting one with its prefix hit (or leave it waiting); schedule a chunk of a running one
(preempting the newest running request while allocate_slots says no); complete a scheduled chunk
(and sample a token once the prompt is done); finish a request; reset the prefix cache. Prompts
come from three tokens and mostly extend another request's tokens, so prefix hits, shared blocks
and evictions are common.

The model keeps, per running request, the computed-token count at its last allocate_slots call and
the slots it asked for; from those it predicts each group's table (length, the leading null blocks
of a sliding group, what is cached), the longest hit (by brute force over the map), and how many
free blocks each call takes. The checks:

- pool_matches_tables: a non-null block's ref_cnt is the number of (request, group) table entries
  holding it, it is in the free queue iff that is 0, free + held = num_blocks - 1, no block is held
  by two groups at once (a block id is one page in every group's layer slot), the null block is
  never counted, queued or cached.
- map_is_consistent: a block has a hash iff the map holds it under that hash; every key is
  make_block_hash_with_group_id(hash, group) for one of the groups.
- tables_match_model: every running request has a table in every group and only running ones do;
  each table holds ceil(slots / block_size) entries; in a sliding group exactly the leading
  max(0, c - W + 1) // block_size entries are null (c: computed tokens at the last allocate_slots),
  so at most ceil((W - 1) / block_size) + 1 + the chunk's blocks are real; a full group holds no
  null block; entries below num_cached_block (which must be what is computed or being computed)
  carry this request's hash of that block in that group, later ones no hash.
- in the rules: the hit is the longest every group can serve, with null blocks exactly before the
  window in sliding groups and this prefix's blocks elsewhere; get_num_blocks_to_allocate and the
  free blocks each allocate_slots call takes match the model, a call says no exactly when the
  blocks do not fit, a failed call changes nothing but the window, freeing a request that holds
  nothing (or twice) changes nothing, reset_prefix_cache succeeds exactly when no request runs.
- teardown: once every request is freed, no block is leaked and the cache can be reset.

test_admission_takes_every_groups_hits_before_any_new_block pins the first bug this machine found.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from nanoengine.core import (
    BlockPool,
    KVCacheBlocks,
    KVCacheManager,
    get_request_block_hasher,
    make_block_hash_with_group_id,
)
from nanoengine.kv_cache_interface import get_kv_cache_groups
from nanoengine.request import Request
from nanoengine.sampling_params import SamplingParams

BS = 4
HASH_LEN = len(Request("x", [0] * BS, block_hasher=get_request_block_hasher(BS)).block_hashes[0])
POOL_SIZES = (12, 16, 24, 40)  # blocks, the null block included: small pools make evictions common
WINDOWS = (4, 5, 9)
TOKENS = st.integers(0, 2)
MAX_PROMPT = 40
MAX_TOKENS = 56  # a request this long is finished when its next token is due
MAX_REQUESTS = 6
LOOKAHEAD = st.sampled_from([0, 0, 0, 1, 3])  # speculative slots, now and then
# How often each action comes up: a weight per example, drawn from these ranges.
MIX_RANGES = {
    "add_request": (1, 3),
    "admit": (1, 3),
    "schedule": (2, 4),
    "complete": (2, 4),
    "finish": (0, 2),
    "reset_prefix_cache": (0, 1),
}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(eq=False)
class Req:
    request: Request
    running: bool = False
    pending: int = 0  # tokens allocated at the last schedule and not yet computed
    c_last: int = 0  # computed tokens (hit included) at the last allocate_slots call
    max_slots: int = 0  # the most slots (computed + new + lookahead) any successful call asked for
    cached_upto: int = 0  # computed + new tokens at the last successful call: what is cached

    @property
    def rid(self) -> str:
        return self.request.request_id


class HybridKVCacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.kv: KVCacheManager | None = None
        self.reqs: list[Req] = []
        self.running: list[Req] = []  # admission order: the last is the preemption victim
        self.histories: list[list[int]] = []  # admitted requests' tokens, finished ones' too
        self.num_created = 0
        self.midway = False

    # ---- setup ------------------------------------------------------------------------------
    @initialize(
        window=st.sampled_from(WINDOWS),
        num_blocks=st.sampled_from(POOL_SIZES),
        mix=st.tuples(*(st.integers(lo, hi) for lo, hi in MIX_RANGES.values())),
    )
    def make_manager(self, window, num_blocks, mix):
        """One model and pool per example, and how often each action comes up (swarm testing: an
        example without finishes or resets fills the pool)."""
        self.window, self.num_blocks = window, num_blocks
        self.groups = get_kv_cache_groups([window, window, window, None])
        assert [g.sliding_window for g in self.groups] == [None, window, window, window]
        self.pool = BlockPool(num_blocks, enable_caching=True, hash_block_size=BS)
        self.kv = KVCacheManager(
            BS, self.pool, log_stats=False, kv_cache_groups=self.groups, prefix_cache_retention_interval=None
        )
        self.sliding = [g.sliding_window is not None for g in self.groups]
        self.need = cdiv(window - 1, BS)  # blocks a sliding hit must end with
        self.mix = dict(zip(MIX_RANGES, mix))

    # ---- model helpers ----------------------------------------------------------------------
    def skipped_blocks(self, group_id: int, num_computed: int) -> int:
        if not self.sliding[group_id]:
            return 0
        return max(0, num_computed - self.window + 1) // BS

    def key(self, request: Request, i: int, group_id: int):
        return make_block_hash_with_group_id(request.block_hashes[i], group_id)

    def expected_hit_blocks(self, request: Request) -> int:
        """The longest hit, by brute force over the map: every block for full attention, the blocks
        covering the last W - 1 tokens (or all, for a short hit) in each sliding group."""
        cache = self.pool.cached_block_hash_to_block
        cached = [
            [cache.get_one_block(self.key(request, i, g)) is not None for i in range(len(request.block_hashes))]
            for g in range(len(self.groups))
        ]
        for length in range((request.num_tokens - 1) // BS, -1, -1):
            if all(
                all(cached[g][max(0, length - self.need) if self.sliding[g] else 0 : length])
                for g in range(len(self.groups))
            ):
                return length
        raise AssertionError("unreachable: length 0 is always a hit")

    def predict(self, r: Req, num_computed: int, num_slots: int, hits: KVCacheBlocks | None) -> tuple[int, int]:
        """(blocks the call takes from the free queue, blocks its window moves free first)."""
        hits = hits.blocks if hits is not None else None
        need = 0
        removed: list = []
        for g, manager in enumerate(self.kv.coordinator.single_type_managers):
            held = manager.req_to_blocks.get(r.rid)
            if held is None:  # admission: a hit block that is free leaves the queue
                kept = hits[g][self.skipped_blocks(g, num_computed) :]
                need += max(cdiv(num_slots, BS) - len(hits[g]), 0)
                need += sum(b.ref_cnt == 0 and not b.is_null for b in kept)
            else:
                need += max(cdiv(num_slots, BS) - len(held), 0)
                removed += [b for b in held[: self.skipped_blocks(g, num_computed)] if not b.is_null]
        counts = Counter(removed)
        freed = sum(b.ref_cnt == n for b, n in counts.items())
        return need, freed

    def by_pick(self, items: list, pick: int):
        return items[pick % len(items)]

    def waiting(self) -> list[Req]:
        return [r for r in self.reqs if not r.running]

    def schedulable(self) -> list[Req]:
        return [r for r in self.running if r.pending == 0]

    def in_flight(self) -> list[Req]:
        return [r for r in self.running if r.pending > 0]

    # ---- scheduler-like actions -------------------------------------------------------------
    # One rule draws the action among those that apply, so hypothesis's own swarm testing (which
    # turns whole rules off per example) cannot leave an example that never admits or schedules.
    @rule(data=st.data())
    def step(self, data):
        applicable = {
            "add_request": len(self.reqs) < MAX_REQUESTS,
            "admit": bool(self.waiting()),
            "schedule": bool(self.schedulable()),
            "complete": bool(self.in_flight()),
            "finish": bool(self.reqs),
            "reset_prefix_cache": True,
        }
        choices = [name for name, ok in applicable.items() if ok for _ in range(self.mix[name])]
        if not choices:
            return
        action = data.draw(st.sampled_from(choices), label="action")
        self.midway = True  # left set if the action fails: teardown then checks nothing more
        getattr(self, action)(data)
        self.midway = False

    def add_request(self, data):
        """A new waiting request; most extend (a prefix of) tokens an admitted request computed."""
        prefix: list[int] = []
        if self.histories and data.draw(st.sampled_from([True, True, True, False]), label="extends"):
            base = data.draw(st.sampled_from(self.histories), label="base")
            longest = min(len(base), MAX_PROMPT)
            prefix = base[: data.draw(st.one_of(st.just(longest), st.integers(0, longest)), label="cut")]
        room = MAX_PROMPT - len(prefix)
        suffix = data.draw(st.lists(TOKENS, min_size=0 if prefix else 1, max_size=min(room, 12)), label="suffix")
        tokens = prefix + suffix
        self.num_created += 1
        request = Request(
            f"r{self.num_created}",
            tokens,
            sampling_params=SamplingParams(max_tokens=64),
            block_hasher=get_request_block_hasher(BS),
        )
        self.reqs.append(Req(request))

    def admit(self, data):
        """Admit a waiting request with its prefix hit, as Scheduler.schedule does; if allocate_slots
        says no, it stays waiting."""
        r = self.by_pick(self.waiting(), data.draw(st.integers(0, 100), label="pick"))
        chunk = data.draw(st.integers(1, 48), label="chunk")
        gate = data.draw(st.booleans(), label="gate")
        lookahead = data.draw(LOOKAHEAD, label="lookahead")
        request = r.request
        assert request.num_computed_tokens == 0
        assert all(r.rid not in m.req_to_blocks for m in self.kv.coordinator.single_type_managers)
        hits, num_hit = self.kv.get_computed_blocks(request, record_stats=False)
        self.check_hit(request, hits, num_hit)
        if gate and blocks_needed(self.kv, request, request.num_tokens, hits) > self.pool.get_num_free_blocks():
            return  # the scheduler's gate: the whole prompt must fit
        n = min(chunk, request.num_tokens - num_hit)
        num_slots = num_hit + n + lookahead
        need, freed = self.predict(r, num_hit, num_slots, hits)
        assert freed == 0
        assert blocks_needed(self.kv, request, num_slots, hits) == need
        free_before = self.pool.get_num_free_blocks()
        new = self.kv.allocate_slots(request, n, num_hit, hits, num_lookahead_tokens=lookahead)
        if new is None:
            assert need > free_before, "allocate_slots refused an admission that fits"
            assert all(r.rid not in m.req_to_blocks for m in self.kv.coordinator.single_type_managers)
            assert self.pool.get_num_free_blocks() == free_before
            return
        assert need <= free_before, "allocate_slots admitted a request that does not fit"
        assert self.pool.get_num_free_blocks() == free_before - need, "free blocks taken != blocks needed"
        self.check_new_blocks(r, new, [len(h) for h in hits.blocks], num_slots)
        request.num_computed_tokens = num_hit
        r.running, r.pending, r.c_last = True, n, num_hit
        r.max_slots, r.cached_upto = num_slots, num_hit + n
        self.running.append(r)
        self.histories.append(list(request.all_token_ids))

    def schedule(self, data):
        """Allocate a running request's next chunk; while allocate_slots says no, preempt the newest
        running request, as Scheduler.schedule does (alone, the request is finished)."""
        pick = data.draw(st.integers(0, 100), label="pick")
        chunk = data.draw(st.integers(1, 16), label="chunk")
        lookahead = data.draw(LOOKAHEAD, label="lookahead")
        r = self.by_pick(self.schedulable(), pick)
        request = r.request
        c = request.num_computed_tokens
        n = min(chunk, request.num_tokens - c)
        assert n >= 1, "a running request always has a token to compute"
        while True:
            num_slots = c + n + lookahead
            held_before = [len(m.req_to_blocks[r.rid]) for m in self.kv.coordinator.single_type_managers]
            need, freed = self.predict(r, c, num_slots, None)
            assert blocks_needed(self.kv, request, num_slots, None) == need
            free_before = self.pool.get_num_free_blocks()
            new = self.kv.allocate_slots(request, n, num_lookahead_tokens=lookahead)
            r.c_last = c  # the window moves on even when the call fails
            if new is not None:
                break
            assert need > free_before + freed, "allocate_slots refused a chunk that fits"
            assert self.pool.get_num_free_blocks() == free_before + freed
            # As the Scheduler: preempt the newest running request; alone, the request is capped.
            if len(self.running) == 1:
                self.finish_req(r)
                return
            victim = self.running[-1]
            self.preempt(victim)
            if victim is r:
                return
        assert need <= free_before + freed, "allocate_slots granted a chunk that does not fit"
        assert self.pool.get_num_free_blocks() == free_before + freed - need, (
            "free blocks after the call != before + freed by the window - needed"
        )
        self.check_new_blocks(r, new, held_before, num_slots)
        r.pending = n
        r.max_slots = max(r.max_slots, num_slots)
        r.cached_upto = c + n

    def complete(self, data):
        """The model ran the chunk: the tokens are computed, and past the prompt a token is sampled."""
        r = self.by_pick(self.in_flight(), data.draw(st.integers(0, 100), label="pick"))
        request = r.request
        request.num_computed_tokens += r.pending
        r.pending = 0
        assert request.num_computed_tokens <= request.num_tokens
        if request.num_computed_tokens == request.num_tokens:
            if request.num_tokens >= MAX_TOKENS:
                self.finish_req(r)
                return
            num_hashes = len(request.block_hashes)
            request.append_output_token_ids(data.draw(TOKENS, label="token"))
            assert len(request.block_hashes) == request.num_tokens // BS >= num_hashes
            self.histories.append(list(request.all_token_ids))

    def finish(self, data):
        self.finish_req(self.by_pick(self.reqs, data.draw(st.integers(0, 100), label="pick")))

    def reset_prefix_cache(self, data):
        idle = not self.running
        assert self.kv.reset_prefix_cache() is idle
        if idle:
            assert len(self.pool.cached_block_hash_to_block) == 0
            assert all(b.block_hash is None for b in self.pool.blocks)

    def preempt(self, r: Req) -> None:
        before = self.pool.get_num_free_blocks()
        self.kv.free(r.request)
        self.running.remove(r)
        r.request.num_computed_tokens = 0
        r.request.num_preemptions += 1
        r.running, r.pending = False, 0
        assert before <= self.pool.get_num_free_blocks()

    def finish_req(self, r: Req) -> None:
        if r.running:
            self.preempt(r)
        else:  # never admitted or preempted: it holds nothing, and freeing it changes nothing
            state = self.pool_state()
            self.kv.free(r.request)
            assert self.pool_state() == state
        self.kv.free(r.request)  # freeing twice is a no-op
        self.reqs.remove(r)

    def pool_state(self) -> tuple:
        return (
            [b.block_id for b in self.pool.free_block_queue.get_all_free_blocks()],
            [(b.ref_cnt, b.block_hash) for b in self.pool.blocks],
        )

    # ---- checks inside rules ----------------------------------------------------------------
    def check_hit(self, request: Request, hits: KVCacheBlocks, num_hit: int) -> None:
        assert isinstance(hits, KVCacheBlocks) and len(hits.blocks) == len(self.groups)
        length = self.expected_hit_blocks(request)
        assert num_hit == length * BS, f"hit {num_hit} tokens, the longest every group serves is {length * BS}"
        for g, blocks in enumerate(hits.blocks):
            assert len(blocks) == length
            first = max(0, length - self.need) if self.sliding[g] else 0
            for i, block in enumerate(blocks):
                if i < first:
                    assert block.is_null, f"group {g}: hit block {i} is outside the window yet not null"
                else:
                    assert not block.is_null and block.block_hash == self.key(request, i, g), (
                        f"group {g}: hit block {i} does not hold this prefix in this group"
                    )

    def check_new_blocks(self, r: Req, new: KVCacheBlocks, held_before: list[int], num_slots: int) -> None:
        assert isinstance(new, KVCacheBlocks) and len(new.blocks) == len(self.groups)
        for manager, blocks, before in zip(self.kv.coordinator.single_type_managers, new.blocks, held_before):
            table = manager.req_to_blocks[r.rid]
            assert len(blocks) == max(cdiv(num_slots, BS) - before, 0)
            assert table[len(table) - len(blocks) :] == blocks
            assert all(b.ref_cnt == 1 and not b.is_null for b in blocks)

    # ---- invariants (after every step) -------------------------------------------------------
    @invariant()
    def invariants(self):
        self.midway = True  # left set if a check fails: teardown then checks nothing more
        self.pool_matches_tables()
        self.map_is_consistent()
        self.tables_match_model()
        self.midway = False

    def pool_matches_tables(self):
        """Every non-null block's ref_cnt is the number of table entries holding it; it is free iff
        that is 0; no block serves two groups at once; the null block is never counted or cached."""
        pool = self.pool
        holders: Counter = Counter()
        group_of: dict[int, int] = {}
        for g, manager in enumerate(self.kv.coordinator.single_type_managers):
            for rid, table in manager.req_to_blocks.items():
                real = [b.block_id for b in table if not b.is_null]
                assert len(real) == len(set(real)), f"group {g}, {rid}: a block twice in one table"
                for block_id in real:
                    holders[block_id] += 1
                    assert group_of.setdefault(block_id, g) == g, (
                        f"block {block_id} is held by groups {group_of[block_id]} and {g} at once"
                    )
        in_queue = {b.block_id for b in pool.free_block_queue.get_all_free_blocks()}
        for block in pool.blocks[1:]:
            assert not block.is_null
            assert block.ref_cnt == holders[block.block_id], (
                f"block {block.block_id}: ref_cnt {block.ref_cnt}, held {holders[block.block_id]} times"
            )
            assert (block.block_id in in_queue) == (block.ref_cnt == 0)
        null = pool.null_block
        assert null is pool.blocks[0] and null.is_null and null.ref_cnt == 0 and null.block_hash is None
        assert 0 not in in_queue
        assert pool.get_num_free_blocks() == len(in_queue)
        assert pool.get_num_free_blocks() + len(holders) == self.num_blocks - 1

    def map_is_consistent(self):
        """A block has a hash iff the map holds it under that hash, and every key names its group."""
        entries = list(self.pool.cached_block_hash_to_block.items())
        for block_hash, block in entries:
            assert block.block_hash == block_hash and not block.is_null
            # Group 0 keeps the bare hash; the others append their id (make_block_hash_with_group_id).
            group_id = 0 if len(block_hash) == HASH_LEN else int.from_bytes(block_hash[-4:], "big")
            assert 0 < group_id < len(self.groups) or len(block_hash) == HASH_LEN
            assert block_hash == make_block_hash_with_group_id(block_hash[:HASH_LEN], group_id)
        mapped = [block.block_id for _, block in entries]
        assert len(mapped) == len(set(mapped))
        assert set(mapped) == {b.block_id for b in self.pool.blocks if b.block_hash is not None}

    def tables_match_model(self):
        """Each running request: equally long tables; a sliding group's leading blocks null exactly up
        to its window at the last call and at most ceil((W - 1) / bs) + 1 + the chunk's blocks real;
        a full group never null; blocks cached with this request's hash and group up to what is
        computed or being computed, uncached after."""
        running_ids = {r.rid for r in self.running}
        for manager in self.kv.coordinator.single_type_managers:
            assert set(manager.req_to_blocks) == running_ids
            assert set(manager.num_cached_block) == running_ids
        for r in self.running:
            request = r.request
            num_blocks = cdiv(r.max_slots, BS)
            assert num_blocks >= cdiv(request.num_computed_tokens, BS)
            for g, manager in enumerate(self.kv.coordinator.single_type_managers):
                table = manager.req_to_blocks[r.rid]
                assert len(table) == num_blocks, f"group {g}: {len(table)} blocks, expected {num_blocks}"
                num_null = self.skipped_blocks(g, r.c_last)
                assert all(b.is_null for b in table[:num_null]), f"group {g}: a block out of the window kept"
                assert not any(b.is_null for b in table[num_null:]), (
                    f"group {g}: a null block {'in a full-attention group' if not self.sliding[g] else 'in the window'}"
                )
                if self.sliding[g]:
                    chunk = r.max_slots - r.c_last
                    assert num_blocks - num_null <= cdiv(self.window - 1, BS) + 1 + cdiv(chunk, BS)
                num_cached = r.cached_upto // BS
                assert manager.num_cached_block[r.rid] == num_cached
                for i, block in enumerate(table):
                    if block.is_null:
                        continue
                    if i < num_cached:
                        assert block.block_hash == self.key(request, i, g), (
                            f"group {g}, {r.rid}: block {block.block_id} at {i} holds other tokens"
                        )
                    else:
                        assert block.block_hash is None, f"group {g}, {r.rid}: block {i} cached too early"

    def teardown(self):
        if self.kv is None or self.midway:
            return
        while self.reqs:
            self.finish_req(self.reqs[0])
        self.pool_matches_tables()
        assert self.pool.get_num_free_blocks() == self.num_blocks - 1  # nothing leaked
        assert all(b.ref_cnt == 0 for b in self.pool.blocks)
        assert all(not m.req_to_blocks and not m.num_cached_block for m in self.kv.coordinator.single_type_managers)
        assert self.kv.reset_prefix_cache()


HybridKVCacheMachine.TestCase.settings = settings(
    settings.get_profile("stateful"), max_examples=2000, stateful_step_count=25
)
TestHybridKVCacheManagerStateful = HybridKVCacheMachine.TestCase


def blocks_needed(kv: KVCacheManager, request: Request, num_tokens: int, hits: KVCacheBlocks | None) -> int:
    """The free blocks allocate_slots counts before it takes any: the coordinator's sum over groups."""
    hit_blocks = (hits or kv.empty_kv_cache_blocks).blocks
    num_computed = request.num_computed_tokens + len(hit_blocks[0]) * BS
    return kv.coordinator.get_num_blocks_to_allocate(request.request_id, num_tokens, hit_blocks, num_computed)


def test_admission_takes_every_groups_hits_before_any_new_block():
    """allocate_slots must take every group's hits before any group takes a new block (vLLM calls
    allocate_new_computed_blocks for all groups, then allocate_new_blocks). Here the full group's
    new blocks are popped first, from the head of the free queue, where the sliding groups' hits
    wait (freed early, as the window moved): the full group evicts group 1's hit and group 2 then
    evicts group 3's, which group 3 still takes as its hit. One block is then written by two groups."""
    pool = BlockPool(18, enable_caching=True, hash_block_size=BS)  # the null block + 17
    kv = KVCacheManager(
        BS,
        pool,
        log_stats=False,
        kv_cache_groups=get_kv_cache_groups([4, 4, 4, None]),
        prefix_cache_retention_interval=None,
    )

    def make(request_id, tokens):
        return Request(request_id, list(tokens), block_hasher=get_request_block_hasher(BS))

    a = make("A", range(12))
    assert kv.allocate_slots(a, 12) is not None
    a.num_computed_tokens = 12
    a.append_output_token_ids(99)
    assert kv.allocate_slots(a, 1) is not None  # the window moves: blocks 0 and 1 of groups 1-3 are freed
    kv.free(a)
    b = make("B", list(range(8)) + [50] * 12)  # shares A's first two blocks
    hits, num_hit = kv.get_computed_blocks(b, record_stats=False)
    assert num_hit == 8
    need = blocks_needed(kv, b, 20, hits)
    assert need == pool.get_num_free_blocks() == 17
    assert kv.allocate_slots(b, 12, num_hit, hits) is not None
    assert pool.get_num_free_blocks() == 17 - need
    tables = kv.get_blocks("B").blocks
    ids = [[blk.block_id for blk in table if not blk.is_null] for table in tables]
    assert sum(map(len, ids)) == len(set().union(*map(set, ids))), f"a block in two groups: {ids}"
    for g, table in enumerate(tables):
        for i, block in enumerate(table):
            if not block.is_null:
                assert block.block_hash == make_block_hash_with_group_id(b.block_hashes[i], g)
