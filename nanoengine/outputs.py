"""What generate() returns, named as in vLLM's RequestOutput."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class RequestOutput:
    """One finished request. Times are time.perf_counter() seconds.

    finish_reason: "stop" (EOS or a stop string) or "length" (max_tokens reached).
    num_cached_tokens: prompt tokens whose K/V came from the prefix cache instead of prefill.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str
    num_cached_tokens: int
    arrival_time: float
    first_token_time: float
    finish_time: float

    @property
    def ttft(self) -> float:
        """Time to first token, from arrival."""
        return self.first_token_time - self.arrival_time

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first, per second of decoding."""
        span = self.finish_time - self.first_token_time
        return (len(self.token_ids) - 1) / span if span > 0 else float("nan")
