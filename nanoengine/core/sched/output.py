"""The step data the scheduler hands the model runner (vllm/v1/core/sched/output.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from nanoengine.core import BlockIds
from nanoengine.request import Request


@dataclass(slots=True)
class NewRequestData:
    """A request the model runner has not seen (or dropped at preemption): everything it needs."""

    req_id: str
    token_ids: list[int]
    block_ids: BlockIds
    num_computed_tokens: int
    request: Request


@dataclass(slots=True)
class CachedRequestData:
    """Requests the runner already holds: only what changed (parallel lists)."""

    req_ids: list[str] = field(default_factory=list)
    new_block_ids: list[BlockIds] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)


@dataclass(slots=True)
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    preempted_req_ids: set[str]
    finished_req_ids: set[str]
