"""N-gram (prompt lookup) drafts: guess the next tokens by copying what followed the same n-gram earlier in the
request's own context (vllm/v1/spec_decode/ngram_proposer.py, the V1 model runner's proposer).

vLLM 0.33's default V2 runner uses another n-gram speculator (vllm/v1/worker/gpu/spec_decode/ngram/speculator.py):
on the device it takes the rightmost occurrence of the longest n-gram and always emits k drafts, padding past
the match (or all k, with no match) with the last sampled token. nanoengine follows V1's rule, which proposes
nothing when nothing matches, so a request without a match costs a plain decode step.
"""

from __future__ import annotations

from collections.abc import Sequence

from nanoengine.config import SpeculativeConfig


def find_longest_matched_ngram_and_propose_tokens(
    tokens: Sequence[int], min_ngram: int, max_ngram: int, max_model_len: int, k: int
) -> list[int]:
    """vLLM's _find_longest_matched_ngram_and_propose_tokens, in plain Python.

    The rule: the longest n in [min_ngram, max_ngram] whose last-n-token suffix occurs earlier in `tokens`
    (an occurrence ending before the last token, so never the suffix itself; it may overlap it), and of
    its occurrences the earliest; propose the tokens that follow it, at most k, at most up to the end of
    `tokens`, and none past max_model_len (k is cut to max_model_len - len(tokens)). [] when nothing matches.
    """
    total = len(tokens)
    k = min(k, max_model_len - total)
    if total < min_ngram or k <= 0:
        return []
    tokens = list(tokens)
    for n in range(min(max_ngram, total - 1), min_ngram - 1, -1):
        suffix, first = tokens[total - n :], tokens[total - n]
        for start in range(total - n):  # start + n <= total - 1: the match ends before the last token
            if tokens[start] == first and tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


class NgramProposer:
    """Proposes up to k draft tokens per request from its verified tokens (prompt + output), no model.

    vLLM runs the same rule in numba over numpy rows of the whole batch (batch_propose_numba, a KMP scan);
    here it is plain Python per request, which costs microseconds beside a forward pass.
    """

    def __init__(self, config: SpeculativeConfig, max_model_len: int):
        self.min_n, self.max_n = config.prompt_lookup_min, config.prompt_lookup_max
        self.k = config.num_speculative_tokens
        self.max_model_len = max_model_len

    # The matching rule, a plain function: a subclass that overrides `rule` proposes with another one.
    rule = staticmethod(find_longest_matched_ngram_and_propose_tokens)

    def propose(self, token_ids: Sequence[int], k: int | None = None) -> list[int]:
        """Drafts for a request whose verified tokens are token_ids; at most k (default: the config's)."""
        return self.rule(token_ids, self.min_n, self.max_n, self.max_model_len, self.k if k is None else min(k, self.k))
