"""The step data the scheduler hands the model runner (vllm/v1/core/sched/output.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nanoengine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from nanoengine.request import Request

# A draft that pads a request's verify step to 1 + k tokens (Scheduler.padded_size), as vLLM's scheduler writes
# it: no token id, so no verify step accepts it, and the runner feeds token 0 in its place (vLLM clamps it so).
PLACEHOLDER_TOKEN_ID = -1


@dataclass(slots=True)
class NewRequestData:
    """A request the model runner has not seen (or dropped at preemption): everything it needs, as plain
    values. The scheduler's live Request never crosses to the runner, so nothing the runner does can change
    the scheduler's state.

    prefill_token_ids: every token to compute, the prompt and, for a request resumed after preemption, the
    output tokens it had (vLLM's v2 runner field of that name); prompt_token_ids is its first part.
    eos_token_id: the request's EOS, which min_tokens keeps the sampler from drawing (vLLM carries it in the
    request's SamplingParams, as part of all_stop_token_ids).
    """

    req_id: str
    prompt_token_ids: list[int]
    prefill_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int
    eos_token_id: int | None = None

    @classmethod
    def from_request(cls, request: Request, block_ids: tuple[list[int], ...]) -> NewRequestData:
        return cls(
            req_id=request.request_id,
            prompt_token_ids=list(request.prompt_token_ids),
            prefill_token_ids=list(request.all_token_ids),
            sampling_params=request.sampling_params,
            block_ids=block_ids,
            num_computed_tokens=request.num_computed_tokens,
            eos_token_id=request.eos_token_id,
        )


@dataclass(slots=True)
class CachedRequestData:
    """Requests the runner already holds: only what changed (parallel lists)."""

    req_ids: list[str] = field(default_factory=list)
    new_block_ids: list[tuple[list[int], ...]] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)


@dataclass(slots=True)
class SchedulerOutput:
    """scheduled_spec_decode_tokens: the draft tokens each request verifies this step (speculative decoding;
    requests without drafts are absent). A request's num_scheduled_tokens counts them: its last verified
    token, then these drafts, which the runner feeds at the positions after it. A request padded to a uniform
    decode step has PLACEHOLDER_TOKEN_ID drafts, which the runner never accepts."""

    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    preempted_req_ids: set[str]
    finished_req_ids: set[str]
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
