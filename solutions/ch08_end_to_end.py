"""Chapter 08 solutions: measure what prefix caching buys on whole workloads."""

from __future__ import annotations

from collections.abc import Sequence

from nanoengine.core import get_request_block_hasher
from nanoengine.request import Request


def hit_rate(outputs: Sequence) -> float:
    """Task 08.1: the prefix-cache hit rate of a run, in tokens."""
    queries = sum(len(o.prompt_token_ids) for o in outputs)
    return sum(o.num_cached_tokens for o in outputs) / queries if queries else 0.0


def p50(values: Sequence[float]) -> float:
    """Task 08.2: the median."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def ttft_reduction(cold_ms: Sequence[float], warm_ms: Sequence[float]) -> float:
    """Task 08.2: 1 - p50(warm) / p50(cold)."""
    return 1 - p50(warm_ms) / p50(cold_ms)


def make_multi_turn(system: str, user_turns: Sequence[str], replies: Sequence[str]) -> list[list[dict]]:
    """Task 08.3: the messages each turn of one chat sends."""
    turns = []
    for k, user in enumerate(user_turns):
        messages = [{"role": "system", "content": system}]
        for j in range(k):
            messages += [{"role": "user", "content": user_turns[j]}, {"role": "assistant", "content": replies[j]}]
        turns.append(messages + [{"role": "user", "content": user}])
    return turns


def predict_hit_tokens(prompts_token_ids: Sequence[Sequence[int]], block_size: int = 16) -> list[int]:
    """Task 08.4: the num_cached_tokens of each prompt in a sequential run from an empty cache."""
    hasher = get_request_block_hasher(block_size)
    cached: set[bytes] = set()
    hits = []
    for ids in prompts_token_ids:
        hashes = Request("r", list(ids), block_hasher=hasher).block_hashes
        n = 0
        for h in hashes[: (len(ids) - 1) // block_size]:
            if h not in cached:
                break
            n += 1
        hits.append(n * block_size)
        cached.update(hashes)
    return hits
