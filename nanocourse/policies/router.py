"""Cache-aware routing over engine replicas that share nothing but their KV events.

Each replica's BlockPool (enable_kv_cache_events=True) queues a BlockStored when it caches blocks
and a BlockRemoved when it evicts one. The router replays those events into one ReplicaIndex per
replica, computes an incoming request's block hashes itself (the engine's hash seed is fixed, so
the router's hashes equal the replicas'), and sends the request where its longest cached prefix
lives. RoundRobinRouter is the cache-blind baseline.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from nanoengine.core import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from nanoengine.request import Request


def prefix_match(block_hashes: Sequence[bytes], cached: Container[bytes]) -> int:
    """How many leading block hashes are cached; the chain makes later ones useless after a miss."""
    n = 0
    for block_hash in block_hashes:
        if block_hash not in cached:
            break
        n += 1
    return n


def route(request_hashes: Sequence[bytes], replica_hashes: Sequence[Container[bytes]], loads: Sequence[int]) -> int:
    """The replica holding the longest cached prefix of the request; ties go to the least loaded,
    then to the lowest index."""
    matches = [prefix_match(request_hashes, cached) for cached in replica_hashes]
    return min(range(len(matches)), key=lambda r: (-matches[r], loads[r], r))


class ReplicaIndex:
    """The block hashes one replica holds, rebuilt from its events.

    A count per hash, not a set: two requests with the same prompt in chunked prefill at the same
    time each cache their own copy of the blocks past their first hit, each with its own
    BlockStored, and evicting one copy sends a BlockRemoved while the other copy still serves hits.
    The hash is gone only when its count reaches 0.
    """

    def __init__(self) -> None:
        self.counts: Counter[bytes] = Counter()

    def apply(self, events: Iterable[KVCacheEvent]) -> None:
        for event in events:
            if isinstance(event, BlockStored):
                self.counts.update(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                self.counts.subtract(event.block_hashes)
                for block_hash in event.block_hashes:
                    if self.counts[block_hash] <= 0:
                        del self.counts[block_hash]
            elif isinstance(event, AllBlocksCleared):
                self.counts.clear()

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self.counts

    def __len__(self) -> int:
        return len(self.counts)


class CacheAwareRouter:
    """Routes to the replica with the longest cached prefix, as its events describe it."""

    name = "cache-aware"

    def __init__(self, num_replicas: int) -> None:
        self.indexes = [ReplicaIndex() for _ in range(num_replicas)]

    def route(self, block_hashes: Sequence[bytes], loads: Sequence[int]) -> int:
        return route(block_hashes, self.indexes, loads)

    def ingest(self, replica: int, events: Iterable[KVCacheEvent]) -> None:
        self.indexes[replica].apply(events)


class RoundRobinRouter:
    """Replica 0, 1, 2, 0, ...: even load, blind to every cache."""

    name = "round-robin"

    def __init__(self, num_replicas: int) -> None:
        self.num_replicas, self.next = num_replicas, 0

    def route(self, block_hashes: Sequence[bytes], loads: Sequence[int]) -> int:
        replica, self.next = self.next, (self.next + 1) % self.num_replicas
        return replica

    def ingest(self, replica: int, events: Iterable[KVCacheEvent]) -> None:
        """Events are drained (so they do not pile up) and ignored."""


class Router(Protocol):
    name: str

    def route(self, block_hashes: Sequence[bytes], loads: Sequence[int]) -> int: ...

    def ingest(self, replica: int, events: Iterable[KVCacheEvent]) -> None: ...


@dataclass(slots=True)
class Routed:
    """Where one request went and what came back (a RequestOutput)."""

    replica: int
    output: Any


class ReplicaCluster:
    """Several engine replicas in one process behind one router.

    A replica is anything with an `.engine` like LLMEngine (an LLM, or a model-free stand-in), whose
    pool has KV events on. Requests come in waves that arrive together: the router places the whole
    wave first (loads = requests placed so far in the wave), then each replica runs its share to
    completion and its events go to the router. Replicas run one after the other here, but each
    request's ttft covers only its own replica's steps, as if the replicas ran side by side.
    """

    def __init__(self, replicas: Sequence[Any], router: Router) -> None:
        self.replicas, self.router = list(replicas), router

    def block_hashes(self, token_ids: Sequence[int], cache_salt: str | None = None) -> list[bytes]:
        """The request's block hashes as the replicas will compute them (same hasher and seed)."""
        hasher = self.replicas[0].engine.block_hasher
        return Request("route", list(token_ids), block_hasher=hasher, cache_salt=cache_salt).block_hashes

    def place(self, prompts: Sequence[Sequence[int]], salts: Sequence[str | None]) -> list[int]:
        """The replica of each request in a wave."""
        loads = [0] * len(self.replicas)
        plan = []
        for tokens, salt in zip(prompts, salts):
            replica = self.router.route(self.block_hashes(tokens, salt), loads)
            loads[replica] += 1
            plan.append(replica)
        return plan

    def serve_wave(
        self, prompts: Sequence[Sequence[int]], params: Any, salts: Sequence[str | None] | None = None
    ) -> list[Routed]:
        """Route and run one wave; results come back in input order."""
        salts = list(salts) if salts is not None else [None] * len(prompts)
        plan = self.place(prompts, salts)
        outputs: dict[int, Any] = {}
        for r, replica in enumerate(self.replicas):
            mine = [i for i in range(len(prompts)) if plan[i] == r]
            done = run_requests(replica.engine, [prompts[i] for i in mine], params, [salts[i] for i in mine])
            outputs.update(zip(mine, done))
            self.router.ingest(r, replica.engine.kv_cache_manager.take_events())
        return [Routed(plan[i], outputs[i]) for i in range(len(prompts))]


def run_requests(
    engine: Any, prompts: Sequence[Sequence[int]], params: Any, salts: Sequence[str | None] | None = None
) -> list[Any]:
    """Add the requests to an LLMEngine together and step it until they finish; outputs in order.

    Unlike LLM.generate this passes each request's cache_salt through.
    """
    salts = list(salts) if salts is not None else [None] * len(prompts)
    manager = engine.kv_cache_manager
    room = (manager.block_pool.num_gpu_blocks - 1) * manager.block_size
    for tokens in prompts:
        # The scheduler would wait forever for room that can never exist.
        if len(tokens) + 1 > room:
            raise ValueError(f"A {len(tokens)}-token prompt cannot fit a KV pool of {room} tokens.")
    ids = [engine.add_request(list(tokens), params, cache_salt=salt) for tokens, salt in zip(prompts, salts)]
    done: dict[str, Any] = {}
    while engine.has_unfinished_requests():
        done.update((o.request_id, o) for o in engine.step())
    return [done[i] for i in ids]
