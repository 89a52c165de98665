"""Chapter 09 solutions: beyond vLLM's defaults."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

from nanoengine.core import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent


def longest_common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Task 09.1: how many leading tokens a and b share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


class RadixTree:
    """Task 09.2: a token-granular prefix index; a node is {first token: (edge, child)}."""

    def __init__(self) -> None:
        self.num_tokens = 0
        self.root: dict = {}

    def insert(self, tokens: Sequence[int]) -> int:
        tokens, node, pos = tuple(tokens), self.root, 0
        while pos < len(tokens):
            if tokens[pos] not in node:
                node[tokens[pos]] = (tokens[pos:], {})
                self.num_tokens += len(tokens) - pos
                return len(tokens) - pos
            edge, child = node[tokens[pos]]
            shared = longest_common_prefix(edge, tokens[pos:])
            if shared < len(edge):  # split: the shared part, then the old rest below it
                child = {edge[shared]: (edge[shared:], child)}
                node[tokens[pos]] = (edge[:shared], child)
            node, pos = child, pos + shared
        return 0

    def match_prefix(self, tokens: Sequence[int]) -> int:
        tokens, node, pos = tuple(tokens), self.root, 0
        while pos < len(tokens) and tokens[pos] in node:
            edge, child = node[tokens[pos]]
            shared = longest_common_prefix(edge, tokens[pos:])
            pos += shared
            if shared < len(edge):
                break
            node = child
        return pos


def slru_eviction_order(freed: Sequence[tuple[int, bool]], protected_cap: int) -> list[int]:
    """Task 09.3: the frequency-aware pool's eviction order."""
    probation: deque[int] = deque()
    protected: deque[int] = deque()
    for block_id, reused in freed:
        (protected if reused else probation).append(block_id)
        while len(protected) > protected_cap:
            probation.append(protected.popleft())
    return [*probation, *protected]


def route(request_hashes: Sequence[bytes], replica_hashes: Sequence[set[bytes]], loads: Sequence[int]) -> int:
    """Task 09.4: longest cached prefix, then least loaded, then lowest index."""
    matches = []
    for held in replica_hashes:
        n = 0
        while n < len(request_hashes) and request_hashes[n] in held:
            n += 1
        matches.append(n)
    return min(range(len(matches)), key=lambda r: (-matches[r], loads[r], r))


def apply_events(counts: dict[bytes, int], events: Iterable[KVCacheEvent]) -> None:
    """Task 09.5: replay KV events into a hash -> copies index."""
    for event in events:
        if isinstance(event, BlockStored):
            for block_hash in event.block_hashes:
                counts[block_hash] = counts.get(block_hash, 0) + 1
        elif isinstance(event, BlockRemoved):
            for block_hash in event.block_hashes:
                counts[block_hash] = counts.get(block_hash, 0) - 1
                if counts[block_hash] <= 0:
                    del counts[block_hash]
        elif isinstance(event, AllBlocksCleared):
            counts.clear()
