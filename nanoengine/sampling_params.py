"""Sampling parameters, named and defaulted as in vLLM's SamplingParams (top_k aside: -1 here, 0 there;
both disable it)."""

from __future__ import annotations

import reprlib
from dataclasses import dataclass, field, replace

from nanoengine.errors import InvalidRequestError
from nanoengine.validation import check_bool, check_int, check_real

_GREEDY_EPS = 1e-5
MAX_N = 16384  # vLLM's VLLM_MAX_N_SEQUENCES default: each sample is a request of its own


@dataclass(slots=True)
class SamplingParams:
    """How to pick each next token, and when to stop.

    temperature: 0 means greedy (argmax); higher flattens the distribution; at most 2, as in vLLM.
    top_p: keep the smallest set of tokens whose probability sums to top_p, in (0, 1].
    top_k: keep the k most likely tokens; -1 or 0 keeps all (vLLM's default is 0).
    max_tokens: the most tokens to generate, >= 1.
    seed: makes a sampled request reproducible, independent of what else is in the batch; -1 is no seed.
    stop: strings that end the output (not included in it).
    ignore_eos: keep going past the end-of-sequence token (for benchmarks).
    n: how many completions to sample from the prompt (at most 16384, vLLM's VLLM_MAX_N_SEQUENCES).
    They run as n requests that share the prompt's KV blocks through the prefix cache; with a seed,
    sample i uses seed + i (as vLLM does).
    logprobs: per generated token, return the sampled token's logprob and those of the `logprobs`
    most likely tokens (-1: the whole vocabulary); None returns none. As vLLM's default
    ("raw_logprobs"), they come from the model's logits before temperature, top-k and top-p.
    prompt_logprobs: the same for every prompt token after the first. It needs the logits of every
    prompt position, which a prefix-cache hit skips, so such a request does not read the prefix
    cache (vLLM's skip_reading_prefix_cache); its blocks are still cached for others.
    Every field is checked at construction, before anything is queued: a value of the wrong type,
    NaN or an infinity, or out of range raises InvalidRequestError naming the field. logprobs and
    prompt_logprobs are checked against LLM(max_logprobs=...) when the request is made.
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
        err = InvalidRequestError
        self.temperature = check_real(
            err, "temperature", self.temperature, low=0.0, high=2.0, hint="Use 0 for greedy decoding (vLLM's bounds)."
        )
        self.top_p = check_real(
            err, "top_p", self.top_p, low=0.0, high=1.0, low_open=True, hint="Use 1.0 to disable it."
        )
        self.top_k = check_int(err, "top_k", self.top_k, low=-1, hint="0 or -1 disables it, as in vLLM.")
        self.max_tokens = check_int(err, "max_tokens", self.max_tokens, low=1)
        self.n = check_int(err, "n", self.n, low=1, high=MAX_N, hint="It is the number of completions per prompt.")
        # vLLM reads seed -1 as no seed; sample i's seed + i must stay a seed inside torch's range.
        self.seed = check_int(
            err,
            "seed",
            self.seed,
            low=-1,
            high=2**63 - self.n,
            none_ok=True,
            hint="Give a non-negative integer, or None (or -1) for no seed.",
        )
        self.seed = None if self.seed == -1 else self.seed
        self.ignore_eos = check_bool(err, "ignore_eos", self.ignore_eos)
        for name in ("logprobs", "prompt_logprobs"):
            setattr(
                self,
                name,
                check_int(
                    err,
                    name,
                    getattr(self, name),
                    low=-1,
                    none_ok=True,
                    hint="-1 asks for the whole vocabulary (if max_logprobs allows it).",
                ),
            )
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        if stop is None:
            stop = []
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
            raise err(
                f"stop must be a string or a list of non-empty strings, got {reprlib.repr(self.stop)}.",
                parameter="stop",
                value=self.stop,
            )
        self.stop = list(stop)

    def child(self, index: int) -> SamplingParams:
        """The parameters of sample `index` of n: n = 1, and seed + index when seeded (vLLM's
        ParentRequest._get_child_sampling_params)."""
        return replace(self, n=1, seed=None if self.seed is None else self.seed + index)

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS
