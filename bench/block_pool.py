"""Time the BlockPool hot paths against vLLM's figures and a deque baseline.

vLLM's figures are those of bench/results/block_pool_vllm_reference.json (vLLM 0.33, timed side by
side with nanoengine in one run on this machine class; the file says how to reproduce it). Rows that
run did not time have no vLLM figure.

    python bench/block_pool.py [--quick]

Each row is the median of several runs (ns per operation, time.perf_counter_ns
over a loop). The same cycles also run on DequeBlockPool, nano-vllm's layout
(a deque of free block ids, so a hit on a free block is an O(n) remove), and
the table shows how many times faster the linked free queue is. The JSON with
every run goes to bench/results/block_pool_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tqdm import tqdm

from bench.machine import machine_info
from nanoengine.core import (
    NONE_HASH,
    BlockPool,
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    KVCacheManager,
    get_request_block_hasher,
    hash_block_tokens,
    sha256,
    xxhash_128,
)
from nanoengine.request import Request

RESULTS = ROOT / "bench" / "results" / "block_pool_cpu.json"
NUM_BLOCKS = 10_000  # a mid-sized GPU pool; the deque's O(n) remove grows with it
BLOCK_SIZE = 16
CYCLE_BLOCKS = 32
rng = random.Random(0)


class DequeFreeQueue(deque):
    """Free block ids in a deque, with the FreeKVCacheBlockQueue names."""

    def popleft_n(self, n: int) -> list[int]:
        return [self.popleft() for _ in range(n)]

    append_n = deque.extend

    def get_all_free_blocks(self) -> list[int]:
        return list(self)


class DequeBlockPool:
    """nano-vllm's BlockManager structures behind BlockPool's interface."""

    def __init__(self, num_gpu_blocks: int, enable_caching: bool) -> None:
        # enable_caching needs no branch: with it off, no block ever has a hash.
        self.blocks = [KVCacheBlock(block_id=i) for i in range(num_gpu_blocks)]
        self.free_ids = DequeFreeQueue(range(1, num_gpu_blocks))
        self.hash_to_block: dict[bytes, KVCacheBlock] = {}

    def get_cached_block(self, block_hash: bytes) -> KVCacheBlock | None:
        return self.hash_to_block.get(block_hash)

    def get_new_blocks(self, n: int) -> list[KVCacheBlock]:
        ret = [self.blocks[i] for i in self.free_ids.popleft_n(n)]
        for block in ret:
            if block.block_hash is not None:
                # A later copy of the same content may own the entry now.
                if self.hash_to_block.get(block.block_hash) is block:
                    del self.hash_to_block[block.block_hash]
                block.reset_hash()
            block.ref_cnt += 1
        return ret

    def touch(self, blocks: list[KVCacheBlock]) -> None:
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_ids.remove(block.block_id)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks) -> None:
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_ids.append(block.block_id)

    def cache_full_blocks(self, request, blocks, num_cached_blocks, num_full_blocks, block_size):
        new_hashes = request.block_hashes[num_cached_blocks:num_full_blocks]
        for block, block_hash in zip(blocks[num_cached_blocks:num_full_blocks], new_hashes):
            block.block_hash = block_hash
            self.hash_to_block[block_hash] = block


@dataclass
class Backend:
    free_queue: Callable[[int], object]  # num_blocks -> queue holding them
    pool: Callable[[int, bool], object]  # (num_blocks, enable_caching) -> pool


OURS = Backend(
    lambda n: FreeKVCacheBlockQueue([KVCacheBlock(block_id=i) for i in range(n)]),
    BlockPool,
)
DEQUE = Backend(lambda n: DequeFreeQueue(range(n)), DequeBlockPool)


def random_request(request_id: str, num_tokens: int) -> Request:
    tokens = [rng.randrange(50_000) for _ in range(num_tokens)]
    return Request(request_id, tokens, block_hasher=get_request_block_hasher(BLOCK_SIZE))


# Each bench_* function builds its state and returns run(loops); one loop is one
# operation as the row names it.


def bench_remove_append(backend: Backend) -> Callable[[int], None]:
    queue = backend.free_queue(NUM_BLOCKS)
    # Items from the middle half of the queue; each goes back at the tail.
    items = queue.get_all_free_blocks()[NUM_BLOCKS // 4 : 3 * NUM_BLOCKS // 4]

    def run(loops: int) -> None:
        remove, append, n = queue.remove, queue.append, len(items)
        for i in range(loops):
            item = items[i % n]
            remove(item)
            append(item)

    return run


def bench_popleft_append_n(backend: Backend) -> Callable[[int], None]:
    queue = backend.free_queue(NUM_BLOCKS)

    def run(loops: int) -> None:
        popleft_n, append_n = queue.popleft_n, queue.append_n
        for _ in range(loops):
            append_n(popleft_n(16))

    return run


def bench_alloc_free_no_caching(backend: Backend) -> Callable[[int], None]:
    pool = backend.pool(NUM_BLOCKS, False)

    def run(loops: int) -> None:
        for _ in range(loops):
            pool.free_blocks(reversed(pool.get_new_blocks(CYCLE_BLOCKS)))

    return run


def _cache_request(pool, request: Request) -> None:
    blocks = pool.get_new_blocks(CYCLE_BLOCKS)
    pool.cache_full_blocks(request, blocks, 0, CYCLE_BLOCKS, BLOCK_SIZE)
    pool.free_blocks(reversed(blocks))


def bench_hit_cycle(backend: Backend) -> Callable[[int], None]:
    pool = backend.pool(NUM_BLOCKS, True)
    request = random_request("hit", CYCLE_BLOCKS * BLOCK_SIZE)
    _cache_request(pool, request)
    hashes = request.block_hashes

    def run(loops: int) -> None:
        get = pool.get_cached_block
        for _ in range(loops):
            blocks = [get(h) for h in hashes]
            pool.touch(blocks)
            pool.free_blocks(reversed(blocks))

    return run


def bench_miss_cycle(backend: Backend) -> Callable[[int], None]:
    pool = backend.pool(NUM_BLOCKS, True)
    # One request per 32 blocks, all cached, so every later cycle evicts.
    requests = [random_request(f"miss{i}", CYCLE_BLOCKS * BLOCK_SIZE) for i in range((NUM_BLOCKS - 1) // CYCLE_BLOCKS)]
    for request in requests:
        _cache_request(pool, request)

    def run(loops: int) -> None:
        n = len(requests)
        for i in range(loops):
            _cache_request(pool, requests[i % n])

    return run


def bench_hash_block(hash_fn) -> Callable[[Backend], Callable[[int], None]]:
    def make(_: Backend) -> Callable[[int], None]:
        tokens = [rng.randrange(50_000) for _ in range(BLOCK_SIZE)]

        def run(loops: int) -> None:
            for _ in range(loops):
                hash_block_tokens(NONE_HASH, tokens, None, hash_fn)

        return run

    return make


def bench_hash_prompt(_: Backend) -> Callable[[int], None]:
    request = random_request("prompt", 2048)
    hasher = request.block_hasher

    def run(loops: int) -> None:
        for _ in range(loops):
            request.block_hashes = []
            hasher(request)

    return run


def bench_miss_lookup(_: Backend) -> Callable[[int], None]:
    manager = KVCacheManager(BLOCK_SIZE, NUM_BLOCKS)
    cached = random_request("cached", 4096)
    manager.allocate_slots(cached, cached.num_tokens)
    manager.free(cached)
    request = random_request("lookup", 4096)

    def run(loops: int) -> None:
        for _ in range(loops):
            manager.get_computed_blocks(request)

    return run


VLLM_REFERENCE = json.loads((ROOT / "bench" / "results" / "block_pool_vllm_reference.json").read_text())


@dataclass
class Case:
    name: str
    make: Callable[[Backend], Callable[[int], None]]
    loops: int
    ops_per_loop: int = 1  # the row reports ns per loop / ops_per_loop
    bar_ns: float | None = None  # a target of our own, for a row vLLM has no committed figure for
    deque_loops: int = 0  # 0: no deque baseline for this row

    @property
    def vllm_ns(self) -> float | None:
        """vLLM 0.33's figure for this row, from bench/results/block_pool_vllm_reference.json (one
        side-by-side run on this machine class, with how to reproduce it), if that run timed it."""
        return next((r["vllm_ns"] for r in VLLM_REFERENCE["rows"] if self.name.startswith(r["name"])), None)


CASES = [
    Case("free queue remove(middle)+append", bench_remove_append, 200_000, deque_loops=2_000),
    Case("popleft_n(16)+append_n(16), per block", bench_popleft_append_n, 20_000, 16, deque_loops=20_000),
    Case("get_new_blocks(32)+free_blocks, caching off", bench_alloc_free_no_caching, 10_000, deque_loops=10_000),
    Case("hit: 32 lookups + touch + free", bench_hit_cycle, 5_000, deque_loops=20),
    Case("miss: get_new_blocks(32) evicting + cache + free", bench_miss_cycle, 2_000, deque_loops=2_000),
    Case("hash one 16-token block, sha256", bench_hash_block(sha256), 100_000),
    Case("hash one 16-token block, xxhash", bench_hash_block(xxhash_128), 100_000),
    Case("hash a 2048-token prompt (128 blocks)", bench_hash_prompt, 500),
    Case("miss lookup, 4096-token prompt, hashes ready", bench_miss_lookup, 100_000, bar_ns=25_000),
]


def measure(run: Callable[[int], None], loops: int, ops_per_loop: int, repeats: int) -> list[float]:
    run(max(loops // 10, 1))  # warm up
    runs = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        run(loops)
        runs.append((time.perf_counter_ns() - start) / (loops * ops_per_loop))
    return runs


def fmt_ns(ns: float | None) -> str:
    if ns is None:
        return "-"
    return f"{ns / 1000:.2f} µs" if ns >= 10_000 else f"{ns:.0f} ns"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the loops, 5 runs")
    args = parser.parse_args()
    scale, repeats = (0.1, 5) if args.quick else (1.0, 7)

    rows = []
    for case in tqdm(CASES, desc="block pool", unit="row"):
        loops = max(int(case.loops * scale), 1)
        runs = measure(case.make(OURS), loops, case.ops_per_loop, repeats)
        row = {
            "name": case.name,
            "median_ns": statistics.median(runs),
            "runs_ns": runs,
            "loops": loops,
            "vllm_ns": case.vllm_ns,
            "bar_ns": case.bar_ns or case.vllm_ns,
            "deque_median_ns": None,
            "deque_runs_ns": None,
        }
        if case.deque_loops:
            deque_loops = max(int(case.deque_loops * scale), 1)
            deque_runs = measure(case.make(DEQUE), deque_loops, case.ops_per_loop, repeats)
            row["deque_runs_ns"] = deque_runs
            row["deque_median_ns"] = statistics.median(deque_runs)
        rows.append(row)

    header = f"{'operation':50} {'ours':>10} {'vLLM/bar':>10} {'ratio':>6} {'deque':>10} {'speedup':>8}"
    print(header)
    print("-" * len(header))
    for row in rows:
        bar, deque_ns = row["bar_ns"], row["deque_median_ns"]
        row["ratio_vs_vllm"] = row["median_ns"] / bar if bar else None
        row["meets_bar"] = row["median_ns"] <= bar if bar else None
        row["speedup_vs_deque"] = deque_ns / row["median_ns"] if deque_ns else None
        ratio = f"{row['ratio_vs_vllm']:.2f}" if bar else "-"
        speedup = f"{row['speedup_vs_deque']:.1f}x" if deque_ns else "-"
        print(
            f"{row['name']:50} {fmt_ns(row['median_ns']):>10} {fmt_ns(bar):>10} "
            f"{ratio:>6} {fmt_ns(deque_ns):>10} {speedup:>8}"
        )
    print("ratio = ours / vLLM (or the bar); speedup = deque baseline / ours")

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "machine": {**machine_info(), "implementation": platform.python_implementation()},
        "quick": args.quick,
        "repeats": repeats,
        "num_blocks": NUM_BLOCKS,
        "block_size": BLOCK_SIZE,
        "rows": rows,
    }
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
