"""Sampling parameters, named and defaulted as in vLLM's SamplingParams."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from nanoengine.errors import InvalidRequestError

_GREEDY_EPS = 1e-5


@dataclass(slots=True)
class SamplingParams:
    """How to pick each next token, and when to stop.

    temperature: 0 means greedy (argmax); higher flattens the distribution.
    top_p: keep the smallest set of tokens whose probability sums to top_p, in (0, 1].
    top_k: keep the k most likely tokens; -1 keeps all.
    max_tokens: the most tokens to generate, >= 1.
    seed: makes a sampled request reproducible, independent of what else is in the batch.
    stop: strings that end the output (not included in it).
    ignore_eos: keep going past the end-of-sequence token (for benchmarks).
    n: how many completions to sample from the prompt. They run as n requests that share the
    prompt's KV blocks through the prefix cache; with a seed, sample i uses seed + i (as vLLM does).
    logprobs: per generated token, return the sampled token's logprob and those of the `logprobs`
    most likely tokens (-1: the whole vocabulary); None returns none. As vLLM's default
    ("raw_logprobs"), they come from the model's logits before temperature, top-k and top-p.
    prompt_logprobs: the same for every prompt token after the first. It needs the logits of every
    prompt position, which a prefix-cache hit skips, so such a request does not read the prefix
    cache (vLLM's skip_reading_prefix_cache); its blocks are still cached for others.
    Invalid values raise InvalidRequestError at construction, before anything is queued.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 16
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    n: int = 1
    logprobs: int | None = None
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidRequestError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}.")
        if self.temperature < 0:
            raise InvalidRequestError(
                f"temperature must be >= 0, got {self.temperature}. Use 0 for greedy decoding."
            )
        if not 0 < self.top_p <= 1:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}. Use 1.0 to disable it.")
        if not isinstance(self.top_k, int) or self.top_k == 0 or self.top_k < -1:
            raise InvalidRequestError(f"top_k must be -1 (disabled) or >= 1, got {self.top_k!r}.")
        if not isinstance(self.n, int) or self.n < 1:
            raise InvalidRequestError(f"n must be an integer >= 1 (completions per prompt), got {self.n!r}.")
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(self, name)
            if k is not None and (not isinstance(k, int) or k < -1):
                raise InvalidRequestError(
                    f"{name} must be None, -1 (the whole vocabulary) or an integer >= 0, got {k!r}."
                )
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequestError(f"stop must be non-empty strings, got {self.stop!r}.")

    def child(self, index: int) -> SamplingParams:
        """The parameters of sample `index` of n: n = 1, and seed + index when seeded (vLLM's
        ParentRequest._get_child_sampling_params)."""
        return replace(self, n=1, seed=None if self.seed is None else self.seed + index)

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS
