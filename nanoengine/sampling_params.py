"""Sampling parameters, named and defaulted as in vLLM's SamplingParams (top_k aside: -1 here, 0 there;
both disable it).

vLLM 0.33's other fields are refused by name, each with what nanoengine does instead, unless given at vLLM's
default (which asks for what nanoengine does anyway); any other keyword is refused with the closest field's name.
"""

from __future__ import annotations

import inspect
import math
import numbers
import reprlib
from dataclasses import dataclass, field, fields, replace

from nanoengine.errors import InvalidRequestError
from nanoengine.validation import check_bool, check_int, check_names, check_real

_GREEDY_EPS = 1e-5
MAX_N = 16384  # vLLM's VLLM_MAX_N_SEQUENCES default: each sample is a request of its own
LOGIT_BIAS_MAX = 100.0  # OpenAI's bound on a bias, to which vLLM's SamplingParams.from_optional clips

# vLLM 0.33's SamplingParams fields nanoengine lacks: the values that ask for nothing nanoengine does not do
# anyway (vLLM's default, and its equivalents), and what to do instead.
UNSUPPORTED: dict[str, tuple[tuple, str]] = {
    "watermarking": ((None, False), "nanoengine applies no watermark."),
    "prompt_logprob_token_ids": ((None,), "ask for prompt_logprobs=k (the top k a token) instead."),
    "prompt_logprob_start": ((None,), "prompt_logprobs covers the whole prompt."),
    "logprob_token_ids": ((None,), "ask for logprobs=k (the top k), or -1 for the whole vocabulary."),
    "flat_logprobs": ((False,), "logprobs come as vLLM's default list of {token: Logprob} dicts."),
    "detokenize": ((True,), "every output is detokenized."),
    "skip_special_tokens": ((True,), "special tokens are always left out of the text."),
    "spaces_between_special_tokens": ((True,), "special tokens are always left out of the text."),
    "include_stop_str_in_output": ((False,), "the text always ends before the stop string."),
    "output_kind": ((), "LLM returns each request's final output (vLLM's LLM asks for FINAL_ONLY itself)."),
    "stream_interval": ((None,), "LLM.stream() yields the new text after every step."),
    "skip_clone": ((False, True), ""),
    "structured_outputs": ((None,), "nanoengine has no grammar-constrained (JSON, regex, choice) decoding."),
    "allowed_token_ids": ((None,), "give the other tokens a logit_bias of -100 instead."),
    "extra_args": ((None,), "nanoengine has no custom sampler that would read them."),
    "bad_words": ((None, []), "nanoengine does not ban token sequences; a logit_bias of -100 bans single tokens."),
    "skip_reading_prefix_cache": ((None,), "nanoengine skips it exactly when prompt_logprobs is asked for."),
    "thinking_token_budget": ((None, -1), "nanoengine has no reasoning parser."),
    "repetition_detection": ((None,), "use repetition_penalty, frequency_penalty or presence_penalty instead."),
    "routed_experts_prompt_start": ((0,), "nanoengine serves no mixture-of-experts model."),
    "trace_decode_token_ids": ((None,), "nanoengine does not replay token traces."),
    # Gone from vLLM's SamplingParams before 0.33, still in older code.
    "best_of": ((None, 1), "vLLM's V1 engine dropped it too; ask for n samples and rank them yourself."),
    "guided_decoding": ((None,), "vLLM renamed it structured_outputs, which nanoengine does not support."),
    "use_beam_search": ((False,), "vLLM moved beam search to LLM.beam_search; nanoengine has none."),
}


def _asks_nothing(name: str, value) -> bool:
    """Whether an unsupported field's value is one that asks for nothing nanoengine does not do (same type, so
    that 0 does not pass for False)."""
    return any(value is d or (type(value) is type(d) and value == d) for d in UNSUPPORTED[name][0])


class _RefusesUnknownFields(type):
    """Checks SamplingParams' keywords before the dataclass's __init__ would raise a bare TypeError: vLLM's fields
    that nanoengine lacks are dropped at their default and refused otherwise; other unknown names are refused."""

    def __call__(cls, *args, **kwargs):
        given = {k: v for k, v in kwargs.items() if not (k in UNSUPPORTED and _asks_nothing(k, v))}
        reasons = {name: (reason or "nanoengine ignores it.") for name, (_, reason) in UNSUPPORTED.items()}
        check_names(InvalidRequestError, "SamplingParams", given, FIELD_NAMES, reasons)
        return super().__call__(*args, **given)


@dataclass(slots=True)
class SamplingParams(metaclass=_RefusesUnknownFields):
    """How to pick each next token, and when to stop (vLLM 0.33's fields, defaults, ranges and semantics).

    temperature: 0 means greedy (argmax); higher flattens the distribution; at most 2, as in vLLM.
    top_p: keep the smallest set of tokens whose probability sums to top_p, in (0, 1].
    top_k: keep the k most likely tokens; -1 or 0 keeps all (vLLM's default is 0).
    min_p: drop the tokens less than min_p times as likely as the most likely one, in [0, 1] (0: off). Like
    top-k and top-p it reads the tempered distribution and leaves greedy decoding alone.
    max_tokens: the most tokens to generate, >= 1.
    min_tokens: the fewest, in [0, max_tokens]: until then EOS and stop_token_ids get no probability (EOS even
    with ignore_eos, as in vLLM) and stop strings are not matched.
    seed: makes a sampled request reproducible, independent of what else is in the batch; -1 is no seed.
    stop: strings that end the output (not included in it); finish_reason "stop", stop_reason the string.
    stop_token_ids: token ids that end the output (duplicates dropped; each must be in the vocabulary, checked
    when the request is made). The token stays in token_ids but not in the text; finish_reason is "stop" and
    stop_reason the token id (EOS first: a stop token that is also EOS leaves stop_reason None).
    ignore_eos: keep going past the end-of-sequence token (for benchmarks).
    presence_penalty, frequency_penalty: in [-2, 2]; subtract the penalty once from the logit of every token
    already generated (presence), or once per time it was (frequency). Prompt tokens do not count (OpenAI's
    definition). Positive values discourage repetition.
    repetition_penalty: > 0; every token in the prompt or already generated has its logit divided by it when
    positive and multiplied by it otherwise (Keskar et al., CTRL); 1 is off, above 1 discourages repetition.
    logit_bias: {token id: bias} added to those logits before anything else; a bias is clipped to [-100, 100]
    (OpenAI's range, as vLLM's from_optional clips), and keys may be strings of digits as JSON sends them.
    n: how many completions to sample from the prompt (at most 16384, vLLM's VLLM_MAX_N_SEQUENCES).
    They run as n requests that share the prompt's KV blocks through the prefix cache; with a seed,
    sample i uses seed + i (as vLLM does).
    logprobs: per generated token, return the sampled token's logprob and those of the `logprobs`
    most likely tokens (-1: the whole vocabulary); None returns none. As vLLM's default
    ("raw_logprobs"), they come from the model's logits before any penalty, bias, temperature or filter.
    prompt_logprobs: the same for every prompt token after the first. It needs the logits of every
    prompt position, which a prefix-cache hit skips, so such a request does not read the prefix
    cache (vLLM's skip_reading_prefix_cache); its blocks are still cached for others.

    A row of logits goes through them in vLLM's order (nanoengine/sample/logits_processor.py): logit_bias and
    min_tokens, then the repetition, frequency and presence penalties, then temperature, min_p, top-k, top-p.
    Every field is checked at construction, before anything is queued: a value of the wrong type,
    NaN or an infinity, or out of range raises InvalidRequestError naming the field. logprobs and
    prompt_logprobs are checked against LLM(max_logprobs=...), and token ids against the vocabulary, when the
    request is made; with speculative decoding, min_p and logit_bias are refused then (as vLLM 0.33 refuses
    them). An unknown keyword raises InvalidRequestError too, naming it and the closest field; one of vLLM's
    fields that nanoengine lacks (bad_words, structured_outputs, ...: UNSUPPORTED) says what to do instead.
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
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop_token_ids: list[int] = field(default_factory=list)
    min_tokens: int = 0
    logit_bias: dict[int, float] | None = None

    def __post_init__(self) -> None:
        err = InvalidRequestError
        self.temperature = check_real(
            err, "temperature", self.temperature, low=0.0, high=2.0, hint="Use 0 for greedy decoding (vLLM's bounds)."
        )
        self.top_p = check_real(
            err, "top_p", self.top_p, low=0.0, high=1.0, low_open=True, hint="Use 1.0 to disable it."
        )
        self.top_k = check_int(err, "top_k", self.top_k, low=-1, hint="0 or -1 disables it, as in vLLM.")
        self.min_p = check_real(err, "min_p", self.min_p, low=0.0, high=1.0, hint="Use 0 to disable it.")
        for name in ("presence_penalty", "frequency_penalty"):
            setattr(self, name, check_real(err, name, getattr(self, name), low=-2.0, high=2.0, hint="0 is off."))
        self.repetition_penalty = check_real(
            err, "repetition_penalty", self.repetition_penalty, low=0.0, high=None, low_open=True, hint="1 is off."
        )
        self.max_tokens = check_int(err, "max_tokens", self.max_tokens, low=1)
        self.min_tokens = check_int(
            err,
            "min_tokens",
            self.min_tokens,
            low=0,
            high=self.max_tokens,
            hint="It cannot exceed max_tokens.",
        )
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
        self.stop_token_ids = _token_ids(self.stop_token_ids)
        self.logit_bias = _logit_bias(self.logit_bias)

    def child(self, index: int) -> SamplingParams:
        """The parameters of sample `index` of n: n = 1, and seed + index when seeded (vLLM's
        ParentRequest._get_child_sampling_params)."""
        return replace(self, n=1, seed=None if self.seed is None else self.seed + index)

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    @property
    def has_penalties(self) -> bool:
        """Whether any penalty is on (vLLM's use_penalty): exact defaults are off, however close a value is."""
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0


FIELD_NAMES = frozenset(f.name for f in fields(SamplingParams))
# help() and editors read the fields from the dataclass's __init__, not from the metaclass's (*args, **kwargs).
_init = inspect.signature(SamplingParams.__init__)
SamplingParams.__signature__ = _init.replace(parameters=list(_init.parameters.values())[1:])  # type: ignore[attr-defined]


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _token_ids(value) -> list[int]:
    """stop_token_ids as a list of plain ints without repeats, in order (vLLM: None is [])."""
    if value is None:
        return []
    if not isinstance(value, (list, tuple)) or not all(map(_is_int, value)):
        raise InvalidRequestError(
            f"stop_token_ids must be a list of integer token ids, got {reprlib.repr(value)}.",
            parameter="stop_token_ids",
            value=value,
        )
    return list(dict.fromkeys(int(t) for t in value))


def _logit_bias(value) -> dict[int, float] | None:
    """logit_bias with int keys (JSON's string keys converted) and finite biases clipped to OpenAI's range."""
    if value is None:
        return None

    def token(key):
        if _is_int(key):
            return int(key)
        if isinstance(key, str) and key.strip().lstrip("-").isdigit():
            return int(key)
        return None

    def finite(bias) -> bool:  # an int is finite however large (it is clipped); a float must not be NaN or inf
        if isinstance(bias, bool) or not isinstance(bias, numbers.Real):
            return False
        return isinstance(bias, numbers.Integral) or math.isfinite(bias)

    ok = isinstance(value, dict) and all(token(k) is not None and finite(b) for k, b in value.items())
    if not ok:
        raise InvalidRequestError(
            "logit_bias must be a dict of {token id: bias}, the ids integers (or strings of digits, as JSON "
            f"sends them) and the biases finite numbers, got {reprlib.repr(value)}.",
            parameter="logit_bias",
            value=value,
        )
    return {token(k): float(min(LOGIT_BIAS_MAX, max(-LOGIT_BIAS_MAX, b))) for k, b in value.items()}
