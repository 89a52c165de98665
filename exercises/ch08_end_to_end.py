"""Chapter 08 exercises: measure what prefix caching buys on whole workloads.

Check your work with:   make grade CH=08
Stuck? In the notebook, `from nanocourse import hint; hint("08")` lists this chapter's hints, from a nudge to
close-to-code; open them one at a time with hint("08", n).
"""

from __future__ import annotations

from collections.abc import Sequence

from nanoengine.core import get_request_block_hasher  # noqa: F401  (the engine's block hasher, for task 08.4)
from nanoengine.request import Request  # noqa: F401  (a Request computes its block hashes, for task 08.4)


def hit_rate(outputs: Sequence) -> float:
    """Task 08.1: the prefix-cache hit rate of a run, in tokens.

    Contract: `outputs` are RequestOutputs, each with `prompt_token_ids` and `num_cached_tokens` (the prompt tokens
    whose K and V came from the cache). Return the cached prompt tokens over the prompt tokens, both summed over
    every request, so a long prompt weighs more than a short one; generated tokens are never looked up, so they
    count in neither. No outputs gives 0.0, not an error. On a real run the result must equal the engine's own
    counters, `llm.get_stats()`: prefix_cache_hits / prefix_cache_queries over the same requests (task 08.1b).
    (vLLM 0.33: PrefixCacheStats.record adds each admitted request's prompt tokens to `queries` and its cached
    ones to `hits`, and CachingMetrics.hit_rate is hits / queries, in vllm/v1/metrics/stats.py.)
    Example: prompts of 64 and 16 tokens with 48 and 0 cached give 48 / 80 = 0.6 (the mean of the two requests'
    own rates, 0.375, is another number).
    """
    raise NotImplementedError


def p50(values: Sequence[float]) -> float:
    """Task 08.2: the median of a non-empty sequence.

    Contract: the middle value once sorted; with an even count, the mean of the two middle values. Every value
    counts, equal ones included (two requests that took the same time are two requests). The caller's sequence
    is left as it was: not sorted in place. (vLLM 0.33: the benchmark's median_ttft_ms is np.median of the
    requests' TTFTs, in calculate_metrics, vllm/benchmarks/serve.py.)
    Example: p50([9.0, 2.0, 4.0]) == 4.0; p50([12.0, 3.0, 7.0, 7.0]) == 7.0; p50([5.0, 1.0]) == 3.0.
    """
    raise NotImplementedError


def ttft_reduction(cold_ms: Sequence[float], warm_ms: Sequence[float]) -> float:
    """Task 08.2: the share of the median time to first token that the cache removes.

    Contract: the share of the cold median (p50 of cold_ms) that the warm median no longer takes, for non-empty
    lists with a median cold time above 0: 0.8 means the median TTFT is 80% shorter with the cache; a cached run
    that was slower (noise, or overhead) gives a negative value, not 0.
    Example: ttft_reduction([200.0, 180.0, 220.0], [50.0, 60.0, 40.0]) == 1 - 50 / 200 == 0.75;
    ttft_reduction([100.0], [125.0]) == -0.25.
    """
    raise NotImplementedError


def make_multi_turn(system: str, user_turns: Sequence[str], replies: Sequence[str]) -> list[list[dict]]:
    """Task 08.3: the messages each request of one chat sends, one request per user turn.

    Contract: returns len(user_turns) new lists (none for no turns). Turn k (from 0) sends the system message,
    then for every earlier turn j its user message user_turns[j] followed by the assistant's reply replies[j],
    then user_turns[k]. A message is a dict {"role": ..., "content": ...} with role "system", "user" or
    "assistant". replies holds at least len(user_turns) - 1 replies; turn k sends only replies[:k], so a reply
    to the last turn, if given, is sent by no turn. So each turn's list starts with the whole previous list, and
    once the chat template renders them, each turn's prompt tokens start with the previous turn's prompt
    tokens: the second turn finds every full block of the first cached (task 08.3b, on the engine's tokenizer).
    (vLLM 0.33: the Chat Completions API keeps no conversation; every request carries all of it in
    ChatCompletionRequest.messages, vllm/entrypoints/openai/chat_completion/protocol.py, and only the prefix
    cache remembers the earlier turns' K and V.)
    Example: make_multi_turn("Be terse.", ["Hi", "Why?"], ["Hello."]) ==
        [[{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}],
         [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"},
          {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Why?"}]]
    """
    raise NotImplementedError


def predict_hit_tokens(prompts_token_ids: Sequence[Sequence[int]], block_size: int = 16) -> list[int]:
    """Task 08.4: the num_cached_tokens each prompt gets when the prompts run one at a time, in order, on an
    engine whose prefix cache starts empty and is large enough never to evict.

    Contract: one count per prompt, in tokens (a multiple of block_size), computed from the token ids alone,
    with no engine. The rules are the engine's:
    - A full block is named by its chained hash (chapter 04), which covers the block's tokens and every token
      before it: a block hits only behind the same whole prefix, never because an earlier prompt had the same
      block of tokens somewhere else.
    - The lookup takes the prompt's leading full blocks while their hashes are cached and stops at the first
      miss (vLLM 0.33: FullAttentionManager.find_longest_cache_hit, vllm/v1/core/single_type_kv_cache_manager.py).
    - It never covers the prompt's last token, whose logits must be computed: only whole blocks before that
      token count (vLLM 0.33: KVCacheManager.get_computed_blocks sets max_cache_hit_length = request.num_tokens - 1,
      vllm/v1/core/kv_cache_manager.py). So a block-aligned repeat recomputes its last block.
    - Once a prompt has run, every full block of it is cached, the recomputed last one included, and stays:
      a later prompt can hit any earlier prompt, not only the previous one.
    The counts must equal what the engine reports for the chapter's code-completion workload (task 08.4b) and
    what the engine's KVCacheManager finds for random prompt lists, block sizes 1 to 4.
    Example: with block_size=4, the prompts [0..9] (10 tokens), [0..9] + [50], [0..7] (8 tokens) and
    [0, 1, 2, 3, 9, 9, 9, 9, 9] give [0, 8, 4, 4]: the second hits the first's two full blocks; the third,
    block-aligned, may cover only (8 - 1) // 4 = 1 block; the fourth hits block [0, 1, 2, 3], then misses.
    """
    raise NotImplementedError
