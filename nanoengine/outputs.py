"""What generate() returns, shaped as vLLM's `RequestOutput` and `CompletionOutput` (vllm/outputs.py).

`out.outputs[0].text` runs on both engines. A request here has one completion, so RequestOutput also
offers documented aliases for it: `text`, `token_ids` and `finish_reason` read `outputs[0]`, and
`arrival_time`, `first_token_time`, `finish_time` read `metrics`. vLLM's v1 metrics object is
`RequestStateStats` with its own clock fields; ours keeps three times: arrival, first token and finish.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Logprob:
    """One token's log-probability (vllm/logprobs.py): rank 1 is the most likely token of the
    vocabulary; decoded_token is its text, None when the engine has no tokenizer."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# Per generated token: the sampled token's Logprob, then the requested top tokens (vLLM's shapes).
SampleLogprobs = list[dict[int, Logprob]]
# Per prompt token: None for the first (nothing predicts it), then as above for the prompt's token.
PromptLogprobs = list[dict[int, Logprob] | None]


@dataclass(slots=True)
class CompletionOutput:
    """One completion of a request, vLLM's field names.

    finish_reason: "stop" (EOS, a stop token or a stop string) or "length" (max_tokens reached); None while running.
    stop_reason: the stop string or the stop token id (SamplingParams.stop_token_ids) that ended it, None for EOS
    or a length cap (as in vLLM).
    logprobs and cumulative_logprob (the sum of the sampled tokens' logprobs) are set when
    SamplingParams.logprobs asks for them, None otherwise.
    """

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: SampleLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestMetrics:
    """When the request arrived, produced its first token and finished: time.perf_counter() seconds."""

    arrival_time: float
    first_token_time: float
    finish_time: float


@dataclass(slots=True)
class RequestOutput:
    """One finished request, vLLM's field names.

    num_cached_tokens: prompt tokens whose K/V came from the prefix cache instead of prefill.
    prompt_logprobs: set when SamplingParams.prompt_logprobs asks for it, None otherwise.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    num_cached_tokens: int
    metrics: RequestMetrics
    finished: bool = True
    prompt_logprobs: PromptLogprobs | None = field(default=None)

    # ---- aliases for the single completion and the metrics (nanoengine's short forms) ----------
    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def arrival_time(self) -> float:
        return self.metrics.arrival_time

    @property
    def first_token_time(self) -> float:
        return self.metrics.first_token_time

    @property
    def finish_time(self) -> float:
        return self.metrics.finish_time

    @property
    def ttft(self) -> float:
        """Time to first token, from arrival."""
        return self.first_token_time - self.arrival_time

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first, per second of decoding."""
        span = self.finish_time - self.first_token_time
        return (len(self.token_ids) - 1) / span if span > 0 else float("nan")
