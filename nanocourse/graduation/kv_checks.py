"""The block-level checks: block hashes (with cache salts), the block pool with its free queue, and the KV cache
manager with its coordinator (full attention, sliding windows, EAGLE), each against vLLM 0.33.0's own classes.

Every check replays one random sequence of operations on both sides and compares, after each operation, what it
returned and everything observable: the free queue head to tail, every block's ref_cnt, which blocks the prefix
cache names (hashes compared by class, see run.ON_PURPOSE), each request's blocks per group and the prefix-cache
stats. A Story tells the operations in words; the first difference ends the run with it.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nanocourse.differential import Story, per_group
from nanocourse.graduation.common import (
    BS,
    Labels,
    Parts,
    Result,
    cached_blocks,
    has_engine_eagle_search,
    hypothesis_settings,
    kv_cache_groups,
    run_property,
)
from nanocourse.graduation.vllm_side import Vllm
from nanoengine.core import KVCacheBlock, get_request_block_hasher
from nanoengine.request import Request
from nanoengine.sampling_params import SamplingParams

SALTS = (None, None, "s1", "s2")
LORAS = (None, None, "adapter-1", "adapter-2")


def _tokens(family: int, length: int) -> list[int]:
    """A prompt of a prefix family: prompts of one family share their leading tokens."""
    return [1000 * family + j for j in range(length)]


class _Side:
    """One side's requests, built from the same description: nanoengine's Request or vLLM's."""

    def __init__(self, vllm: Vllm | None, parts: Parts) -> None:
        self.vllm = vllm
        self.hasher = None if vllm else get_request_block_hasher(BS, hash_block=parts.hash_block_tokens)

    def request(self, name: str, family: int, length: int, salt: str | None, lora: str | None = None) -> Any:
        if self.vllm is not None:
            return self.vllm.request(
                name, _tokens(family, length), max_tokens=64, block_size=BS, cache_salt=salt, lora_name=lora
            )
        params = SamplingParams(max_tokens=64, ignore_eos=True)
        return Request(name, _tokens(family, length), params, block_hasher=self.hasher, cache_salt=salt, lora_name=lora)


def _pool_state(pool: Any, labels: Labels, side: object) -> dict[str, Any]:
    return {
        "the free queue, head to tail": [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
        "each block's ref_cnt (block 1 onwards)": [b.ref_cnt for b in pool.blocks[1:]],
        "the blocks the prefix cache names (block id, hash)": [(i, labels(side, h)) for i, h in cached_blocks(pool)],
        "get_num_free_blocks()": pool.get_num_free_blocks(),
    }


# ---- hashes ------------------------------------------------------------------------------------------------------

_HASH_OPS = st.lists(
    st.tuples(st.integers(0, 2), st.integers(1, 4 * BS), st.sampled_from(SALTS), st.sampled_from(LORAS)),
    min_size=1,
    max_size=12,
)


def check_hashes(vllm: Vllm, parts: Parts, max_examples: int) -> Result:
    """Requests of random prefix families, lengths, cache salts and LoRA adapters (extra keys): each full block's
    hash must fall in the same class on both sides (equal to the same earlier hashes), i.e. equal prefixes with
    equal salts and adapters hash equal, others not."""
    result = Result("block hashes (cache_salt, LoRA)")

    @hypothesis_settings(max_examples)
    @given(ops=_HASH_OPS)
    def property_(ops: list[tuple[int, int, str | None, str | None]]) -> None:
        result.examples, result.example = result.examples + 1, {"ops": ops}
        ours, theirs, labels = _Side(None, parts), _Side(vllm, parts), Labels()
        story = Story(f"blocks of {BS} tokens", "vLLM 0.33.0's", parts.subject)
        for i, (family, length, salt, lora) in enumerate(ops):
            story.add(
                f"request {i}: a {length}-token prompt of prefix family {family}, cache_salt {salt!r}, LoRA {lora!r}"
            )
            mine = story.call(f"request {i}: hashing", ours.request, str(i), family, length, salt, lora)
            with vllm.modules.active(), vllm.operation():
                reference = theirs.request(str(i), family, length, salt, lora)
            result.operations += 1
            story.compare(
                {"the request's block hashes": [labels(ours, h) for h in mine.block_hashes]},
                {"the request's block hashes": [labels(theirs, h) for h in reference.block_hashes]},
            )

    return run_property(result, property_, vllm, parts.subject)


# ---- the free queue ----------------------------------------------------------------------------------------------

_QUEUE_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("popleft")),
        st.tuples(st.just("popleft_n"), st.integers(0, 4)),
        st.tuples(st.just("remove"), st.integers(0, 7)),
        st.tuples(st.just("append"), st.integers(0, 7)),
        st.tuples(st.just("append_n"), st.lists(st.integers(0, 7), max_size=3, unique=True)),
        st.tuples(st.just("prepend_n"), st.lists(st.integers(0, 7), max_size=3, unique=True)),
    ),
    min_size=1,
    max_size=30,
)


def _queue_op_valid(op: tuple, free: list[int]) -> bool:
    """The queue's contract, judged on vLLM's side: take only what is there, remove only a free block, add only
    blocks that are not free."""
    kind = op[0]
    if kind == "popleft":
        return bool(free)
    if kind == "popleft_n":
        return op[1] <= len(free)
    if kind == "remove":
        return op[1] in free
    if kind == "append":
        return op[1] not in free
    return not set(op[1]) & set(free)


def _apply_queue_op(queue: Any, blocks: list[Any], op: tuple) -> Any:
    kind = op[0]
    if kind == "popleft":
        return queue.popleft().block_id
    if kind == "popleft_n":
        return [b.block_id for b in queue.popleft_n(op[1])]
    if kind in ("remove", "append"):
        return getattr(queue, kind)(blocks[op[1]])
    return getattr(queue, kind)([blocks[i] for i in op[1]])


def check_free_queue(vllm: Vllm, parts: Parts, max_examples: int) -> Result:
    """Random operations on parts.free_queue_cls and vLLM's FreeKVCacheBlockQueue over 8 blocks: what each returns,
    the queue head to tail and num_free_blocks after each."""
    result = Result("free queue")

    @hypothesis_settings(max_examples)
    @given(ops=_QUEUE_OPS)
    def property_(ops: list[tuple]) -> None:
        result.examples, result.example = result.examples + 1, {"ops": ops}
        ours_blocks = [KVCacheBlock(i) for i in range(8)]
        theirs_blocks = [vllm.kv_cache_utils.KVCacheBlock(i) for i in range(8)]
        story = Story("a free queue of blocks 0 to 7", "vLLM 0.33.0's", parts.subject)
        ours = story.call("building the queue of blocks 0 to 7", parts.free_queue_cls, ours_blocks)
        with vllm.modules.active():
            theirs = vllm.kv_cache_utils.FreeKVCacheBlockQueue(theirs_blocks)
        for i, op in enumerate(ops):
            free = [b.block_id for b in theirs.get_all_free_blocks()]
            if not _queue_op_valid(op, free):
                continue
            text = f"{op[0]}({', '.join(map(str, op[1:]))})"
            story.add(f"op {i}: {text}")
            with vllm.modules.active(), vllm.operation():
                expected = _apply_queue_op(theirs, theirs_blocks, op)
            got = story.call(f"op {i}: {text}", _apply_queue_op, ours, ours_blocks, op)
            result.operations += 1

            def seen(queue: Any, returned: Any) -> dict[str, Any]:
                return {
                    "what the call returned": returned,
                    "the free queue, head to tail": [b.block_id for b in queue.get_all_free_blocks()],
                    "num_free_blocks": queue.num_free_blocks,
                }

            story.compare(story.call(f"op {i}: reading the queue", seen, ours, got), seen(theirs, expected))

    return run_property(result, property_, vllm, parts.subject)


# ---- the block pool ----------------------------------------------------------------------------------------------

_POOL_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("take"), st.integers(1, 4)),
        st.tuples(st.just("cache"), st.integers(0, 5), st.integers(0, 2), st.sampled_from(SALTS)),
        st.tuples(st.just("hit"), st.integers(0, 2), st.integers(1, 4 * BS), st.sampled_from(SALTS)),
        st.tuples(st.just("free"), st.integers(0, 5)),
        st.tuples(st.just("evict"), st.sets(st.integers(1, 9), max_size=3)),
        st.tuples(st.just("reset")),
    ),
    min_size=1,
    max_size=25,
)


class _PoolDriver:
    """One side's pool and the block lists it hands out ("holders", like requests), driven by pool operations."""

    def __init__(self, pool: Any, side: _Side, vllm_api: bool) -> None:
        self.pool, self.side, self.vllm_api = pool, side, vllm_api
        self.holders: list[tuple[list[Any], bool]] = []  # (blocks, cached yet)

    def lookup(self, block_hash: bytes) -> Any:
        if self.vllm_api:  # vLLM: one block per KV cache group asked for, or None
            found = self.pool.get_cached_block(block_hash, [0])
            return found[0] if found else None
        return self.pool.get_cached_block(block_hash)

    def apply(self, op: tuple, name: str) -> Any:
        kind, pool = op[0], self.pool
        if kind == "take":
            blocks = pool.get_new_blocks(op[1])
            self.holders.append((blocks, False))
            return [b.block_id for b in blocks]
        if kind == "cache":
            blocks, _ = self.holders[op[1] % len(self.holders)]
            request = self.side.request(name, op[2], len(blocks) * BS, op[3])
            pool.cache_full_blocks(request, blocks, 0, len(blocks), BS, 0)
            self.holders[op[1] % len(self.holders)] = (blocks, True)
            return None
        if kind == "hit":
            request = self.side.request(name, op[1], op[2], op[3])
            hits = []
            for block_hash in request.block_hashes:
                block = self.lookup(block_hash)
                if block is None:
                    break
                hits.append(block)
            pool.touch(hits)
            self.holders.append((hits, True))
            return [b.block_id for b in hits]
        if kind == "free":
            blocks, _ = self.holders.pop(op[1] % len(self.holders))
            pool.free_blocks(reversed(blocks))
            return None
        if kind == "evict":
            pool.evict_blocks(set(op[1]))
            return None
        return pool.reset_prefix_cache()


def _pool_op_text(op: tuple, holders: int) -> str:
    kind = op[0]
    if kind == "take":
        return f"get_new_blocks({op[1]})"
    if kind == "cache":
        return f"cache_full_blocks: name the blocks of holder {op[1] % holders} by a prompt of family {op[2]}" + (
            f", cache_salt {op[3]!r}" if op[3] else ""
        )
    if kind == "hit":
        return (
            f"get_cached_block along a {op[2]}-token prompt of family {op[1]}"
            + (f", cache_salt {op[3]!r}" if op[3] else "")
            + ", then touch the hits"
        )
    if kind == "free":
        return f"free_blocks(holder {op[1] % holders}'s blocks, last first)"
    if kind == "evict":
        return f"evict_blocks({sorted(op[1])})"
    return "reset_prefix_cache()"


def check_pool(vllm: Vllm, parts: Parts, max_examples: int) -> Result:
    """Random pool operations on parts.block_pool_cls and vLLM's BlockPool (10 blocks of 4 tokens, caching on)."""
    result = Result("block pool and free queue")
    num_blocks = 10

    @hypothesis_settings(max_examples)
    @given(ops=_POOL_OPS)
    def property_(ops: list[tuple]) -> None:
        result.examples, result.example = result.examples + 1, {"ops": ops}
        labels = Labels()
        ours = _PoolDriver(parts.block_pool_cls(num_blocks, True, BS), _Side(None, parts), vllm_api=False)
        with vllm.modules.active():
            pool_cls = vllm.modules["vllm.v1.core.block_pool"].BlockPool
            theirs = _PoolDriver(pool_cls(num_blocks, True, BS), _Side(vllm, parts), vllm_api=True)
        story = Story(
            f"{num_blocks - 1} usable blocks of {BS} tokens, prefix caching on", "vLLM 0.33.0's", parts.subject
        )
        for i, op in enumerate(ops):
            if not _pool_op_valid(op, theirs):
                continue
            text = _pool_op_text(op, len(theirs.holders))
            story.add(f"op {i}: {text}")
            with vllm.modules.active(), vllm.operation():
                expected = theirs.apply(op, f"r{i}")
            got = story.call(f"op {i}: {text}", ours.apply, op, f"r{i}")
            result.operations += 1
            story.compare(
                {"what the call returned": got, **_pool_state(ours.pool, labels, ours)},
                {"what the call returned": expected, **_pool_state(theirs.pool, labels, theirs)},
            )

    return run_property(result, property_, vllm, parts.subject)


def _pool_op_valid(op: tuple, reference: _PoolDriver) -> bool:
    """Only what the pool's contract allows, judged on vLLM's side: no more blocks than are free, and caching only
    blocks taken fresh (never named yet), at least one."""
    kind = op[0]
    if kind == "take":
        return op[1] <= reference.pool.get_num_free_blocks()
    if kind == "cache":
        if not reference.holders:
            return False
        blocks, cached = reference.holders[op[1] % len(reference.holders)]
        return bool(blocks) and not cached
    if kind == "free":
        return bool(reference.holders)
    return True


# ---- the KV cache manager -----------------------------------------------------------------------------------------


def _windows(first: int, count: int, second: int | None, full: bool) -> list[int | None]:
    return [first] * count + ([second] if second not in (None, first) else []) + ([None] if full else [])


def _manager_config(hybrid: bool) -> st.SearchStrategy:
    """One full-attention group, or (hybrid) one or two sliding-window groups of one window, maybe a group of a
    second window, and mostly a full-attention group: a hybrid layout, or sliding groups alone (one group: the
    unitary coordinator). EAGLE with any windows: its head's one full-attention layer joins, or makes, a
    full-attention group, the one flagged is_eagle_group (common.kv_cache_groups), so no sliding type drops and
    nanoengine's search is vLLM's (they differ only for two sliding types that drop, kv_cache_coordinator.py).
    Sliding blocks cached as vLLM 0.33 does by default (retention 0), densely (None) or once per interval;
    admission's cap on a sliding group's blocks from max_in_flight_tokens."""
    if not hybrid:
        windows = st.just([None])
    else:
        windows = st.builds(
            _windows,
            st.integers(1, 9),
            st.integers(1, 2),
            st.one_of(st.none(), st.integers(1, 9)),
            st.sampled_from([True, True, False]),
        )
    return st.fixed_dictionaries(
        {
            "num_blocks": st.integers(4, 14),
            "caching": st.booleans(),
            "windows": windows,
            "use_eagle": st.sampled_from([False, False, True]),
            "retention": st.sampled_from([0, 0, None, BS, 2 * BS] if hybrid else [0, None]),
            "max_in_flight_tokens": st.integers(1, 8),
        }
    )


MAX_MODEL_LEN = 1024  # above every request here: the admission cap comes from the window and max_in_flight_tokens

MANAGER_CHECKS = {
    "KV cache manager, full attention": False,
    "KV cache manager, sliding-window groups": True,
}
_ADMIT = st.tuples(
    st.just("admit"),
    st.integers(0, 2),
    st.integers(1, 5 * BS),
    st.sampled_from(SALTS),
    st.integers(1, 12),
    st.booleans(),  # full_sequence_must_fit, the scheduler's admission gate
)
_MANAGER_OPS = st.lists(
    st.one_of(
        _ADMIT,
        _ADMIT,
        st.tuples(st.just("grow"), st.integers(0, 5), st.integers(1, 6)),
        st.tuples(st.just("grow"), st.integers(0, 5), st.integers(1, 6)),
        st.tuples(st.just("free"), st.integers(0, 5)),
        st.tuples(st.just("evict"), st.sets(st.integers(1, 13), max_size=3)),
        st.tuples(st.just("reset")),
    ),
    min_size=1,
    max_size=25,
)


class _ManagerDriver:
    """One side's KV cache manager and its running requests, driven as a scheduler drives it: admission looks the
    prefix cache up and allocates a first chunk; growing appends a sampled token once the request has caught up,
    then allocates the next chunk."""

    def __init__(self, manager: Any, side: _Side, vllm_api: bool) -> None:
        self.manager, self.side, self.vllm_api = manager, side, vllm_api
        self.running: list[Any] = []

    def block_ids(self, request: Any) -> Any:
        return per_group(self.manager.get_block_ids(request.request_id))

    def apply(self, op: tuple, name: str) -> Any:
        kind, manager = op[0], self.manager
        if kind == "admit":
            _, family, length, salt, chunk, must_fit = op
            request = self.side.request(name, family, length, salt)
            if self.vllm_api:  # vLLM's scheduler keeps the lookup's shared_prefix_boundary on the request
                hits, num_hits, request.shared_prefix_boundary = manager.get_computed_blocks(request)
                manager.record_prefix_cache_stats(request, num_hits)
            else:
                hits, num_hits = manager.get_computed_blocks(request)
            num_new = min(chunk, request.num_tokens - num_hits)
            new = manager.allocate_slots(request, num_new, num_hits, hits, full_sequence_must_fit=must_fit)
            if new is None:
                return ("refused", num_hits)
            request.num_computed_tokens = num_hits + num_new
            self.running.append(request)
            return ("admitted", num_hits, per_group(new.get_block_ids()))
        if kind == "grow":
            request = self.running[op[1] % len(self.running)]
            if request.num_computed_tokens == request.num_tokens:
                request.append_output_token_ids(500 + request.num_tokens)
            num_new = min(op[2], request.num_tokens - request.num_computed_tokens)
            new = manager.allocate_slots(request, num_new)
            if new is None:
                return None
            request.num_computed_tokens += num_new
            return per_group(new.get_block_ids())
        if kind == "free":
            manager.free(self.running.pop(op[1] % len(self.running)))
            return None
        if kind == "evict":
            manager.evict_blocks({i for i in op[1] if i < manager.block_pool.num_gpu_blocks})
            return None
        return manager.reset_prefix_cache()

    def state(self, labels: Labels) -> dict[str, Any]:
        stats = self.manager.make_prefix_cache_stats()
        return {
            "each running request's blocks, per KV cache group": {
                r.request_id: self.block_ids(r) for r in self.running
            },
            "each running request's num_computed_tokens": {r.request_id: r.num_computed_tokens for r in self.running},
            **_pool_state(self.manager.block_pool, labels, self),
            "the prefix-cache stats (lookups, tokens queried, tokens hit)": stats
            and (stats.requests, stats.queries, stats.hits),
        }


def _manager_op_text(op: tuple, running: list[Any]) -> str:
    kind = op[0]
    if kind == "admit":
        return (
            f"admit a {op[2]}-token prompt of family {op[1]}"
            + (f", cache_salt {op[3]!r}" if op[3] else "")
            + f": get_computed_blocks, then allocate_slots for a chunk of at most {op[4]}"
            + (" with full_sequence_must_fit" if op[5] else "")
        )
    if kind == "grow":
        request = running[op[1] % len(running)]
        return f"grow {request.request_id}: allocate_slots for at most {op[2]} more tokens (after sampling one if caught up)"
    if kind == "free":
        return f"free({running[op[1] % len(running)].request_id})"
    if kind == "evict":
        return f"evict_blocks({sorted(op[1])}, those in the pool)"
    return "reset_prefix_cache()"


def check_manager(vllm: Vllm, parts: Parts, name: str, max_examples: int) -> Result:
    """Random admissions, growth, frees, evictions and resets on parts.kv_cache_manager_cls (on parts' pool) and
    vLLM's KVCacheManager (and so its coordinator and single-type managers), with one full-attention group or a
    hybrid of sliding-window groups (MANAGER_CHECKS[name]), EAGLE on or off."""
    result = Result(name)

    @hypothesis_settings(max_examples)
    @given(cfg=_manager_config(MANAGER_CHECKS[name]), ops=_MANAGER_OPS)
    def property_(cfg: dict, ops: list[tuple]) -> None:
        if cfg["use_eagle"] and not has_engine_eagle_search(parts):
            result.count_known("EAGLE needs the engine's full-attention search", cfg)
            cfg = {**cfg, "use_eagle": False}
        result.examples, result.example = result.examples + 1, {"cfg": cfg, "ops": ops}
        labels, windows = Labels(), cfg["windows"]
        groups, eagle_group_ids = kv_cache_groups(windows, cfg["use_eagle"])
        num_blocks = cfg["num_blocks"] * len(groups)
        pool = parts.block_pool_cls(num_blocks, cfg["caching"], BS)
        ours = _ManagerDriver(
            parts.kv_cache_manager_cls(
                BS,
                pool,
                kv_cache_groups=groups,
                use_eagle=cfg["use_eagle"],
                prefix_cache_retention_interval=cfg["retention"],
                max_model_len=MAX_MODEL_LEN,
                max_in_flight_tokens=cfg["max_in_flight_tokens"],
                **parts.manager_kwargs,
            ),
            _Side(None, parts),
            vllm_api=False,
        )
        with vllm.modules.active():
            manager_cls = vllm.modules["vllm.v1.core.kv_cache_manager"].KVCacheManager
            theirs = _ManagerDriver(
                manager_cls(
                    vllm.kv_cache_config(
                        num_blocks, BS, [g.sliding_window for g in groups], cfg["retention"], eagle_group_ids
                    ),
                    max_model_len=MAX_MODEL_LEN,
                    max_in_flight_tokens=cfg["max_in_flight_tokens"],
                    scheduler_block_size=BS,
                    hash_block_size=BS,
                    enable_caching=cfg["caching"],
                    use_eagle=cfg["use_eagle"],
                    log_stats=True,
                ),
                _Side(vllm, parts),
                vllm_api=True,
            )
        story = Story(
            f"{num_blocks - 1} usable blocks of {BS} tokens, groups {[g.sliding_window or 'full' for g in groups]}, "
            f"prefix caching {'on' if cfg['caching'] else 'off'}, use_eagle {cfg['use_eagle']}, "
            f"prefix_cache_retention_interval {cfg['retention']}, max_in_flight_tokens {cfg['max_in_flight_tokens']}",
            "vLLM 0.33.0's",
            parts.subject,
        )
        for i, op in enumerate(ops):
            if op[0] in ("grow", "free") and not theirs.running:
                continue
            text = _manager_op_text(op, theirs.running)
            story.add(f"op {i}: {text}")
            with vllm.modules.active(), vllm.operation():
                expected = theirs.apply(op, f"r{i}")
            with vllm.modules.active():
                expected_state = theirs.state(labels)
            got = story.call(f"op {i}: {text}", ours.apply, op, f"r{i}")
            result.operations += 1
            story.compare(
                {"what the call returned": got, **ours.state(labels)},
                {"what the call returned": expected, **expected_state},
            )

    return run_property(result, property_, vllm, parts.subject)
