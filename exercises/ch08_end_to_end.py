"""Chapter 08 exercises: measure what prefix caching buys on whole workloads.

Check your work with:   make grade CH=08
"""

from __future__ import annotations

from collections.abc import Sequence

from nanoengine.core import get_request_block_hasher  # noqa: F401  (task 08.4's hint uses it)
from nanoengine.request import Request  # noqa: F401


def hit_rate(outputs: Sequence) -> float:
    """Task 08.1: the prefix-cache hit rate of a run, in tokens.

    `outputs` are RequestOutputs: each has `prompt_token_ids` and `num_cached_tokens` (prompt tokens whose
    K/V came from the cache). Return cached tokens over prompt tokens, summed over all requests, so that
    long prompts weigh more than short ones, as the engine's own counters do. No outputs: 0.0.

    Hints:
    - Sum first, divide once: the mean of per-request ratios is a different (and wrong) number.
    """
    raise NotImplementedError


def p50(values: Sequence[float]) -> float:
    """Task 08.2: the median. With an even count, the mean of the two middle values.

    Do not reorder the caller's list. Hint: sorted() returns a new list.
    """
    raise NotImplementedError


def ttft_reduction(cold_ms: Sequence[float], warm_ms: Sequence[float]) -> float:
    """Task 08.2: how much of the median TTFT the cache removes: 1 - p50(warm) / p50(cold).

    0.8 means the median time to first token is 80% shorter with the cache; a negative value means
    the cached run was slower (noise, or overhead).
    """
    raise NotImplementedError


def make_multi_turn(system: str, user_turns: Sequence[str], replies: Sequence[str]) -> list[list[dict]]:
    """Task 08.3: the messages each turn of one chat sends.

    Turn k (0-based) sends: the system message, then for every earlier turn j its user message and the
    assistant's reply replies[j], then user turn k. Messages are {"role": ..., "content": ...} with
    roles "system", "user" and "assistant". Return one message list per user turn.

    Hints:
    - Turn k's list is turn k-1's list plus two messages; build new lists, do not share one list.
    - The chat template then makes each turn's prompt start with the previous turn's prompt, which is
      exactly what lets the prefix cache reuse the whole history.
    """
    raise NotImplementedError


def predict_hit_tokens(prompts_token_ids: Sequence[Sequence[int]], block_size: int = 16) -> list[int]:
    """Task 08.4: the num_cached_tokens each prompt gets when the prompts run one at a time, in order,
    on an engine whose prefix cache starts empty and is large enough never to evict.

    A prompt hits the leading full blocks whose hashes an earlier prompt already cached; the walk stops
    at the first miss and never covers the prompt's last token (at most (len - 1) // block_size blocks).
    After it runs, every full block of the prompt is cached.

    Hints:
    - Reuse the engine's block hasher rather than writing your own:
        from nanoengine.core import get_request_block_hasher
        from nanoengine.request import Request
        Request("r", list(ids), block_hasher=get_request_block_hasher(block_size)).block_hashes
    - A set of the hashes seen so far is the whole cache.
    """
    raise NotImplementedError
