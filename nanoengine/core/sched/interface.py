"""The scheduler's seam (vllm/v1/core/sched/interface.py)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from nanoengine.core import KVCacheManagerInterface
from nanoengine.core.sched.output import SchedulerOutput
from nanoengine.core.sched.request_queue import RequestQueue
from nanoengine.core.sched.scheduler import SchedulerConfig
from nanoengine.outputs import ModelRunnerOutput
from nanoengine.request import Request, RequestStatus


@runtime_checkable
class SchedulerInterface(Protocol):
    """The seam of chapter 07 (vLLM's SchedulerInterface): the engine calls schedule() before each
    forward pass and update_from_output() after it. Scheduler below is the engine's;
    LLM(scheduler_cls=...) takes another class with its constructor.

    The attributes are what the engine and the course's observers read: requests by id, the running
    list (admission order), the waiting RequestQueue, and the preemption count.
    """

    config: SchedulerConfig
    kv_cache_manager: KVCacheManagerInterface
    block_size: int
    requests: dict[str, Request]
    running: list[Request]
    waiting: RequestQueue
    num_preemptions: int

    def add_request(self, request: Request) -> None: ...
    def has_unfinished_requests(self) -> bool: ...
    def schedule(self) -> SchedulerOutput: ...
    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> list[Request]: ...
    def finish_requests(self, request_ids, status: RequestStatus) -> None: ...
