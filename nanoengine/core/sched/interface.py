"""The scheduler's seam (vllm/v1/core/sched/interface.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol, Self, runtime_checkable

from nanoengine.config.scheduler import SchedulerConfig
from nanoengine.core import KVCacheManagerInterface
from nanoengine.core.sched.output import SchedulerOutput
from nanoengine.core.sched.request_queue import RequestQueue
from nanoengine.kv_cache_interface import KVCacheConfig
from nanoengine.request import Request, RequestStatus
from nanoengine.worker.outputs import ModelRunnerOutput

if TYPE_CHECKING:
    from nanoengine.config.engine import EngineConfig


@runtime_checkable
class SchedulerInterface(Protocol):
    """What the engine calls on its scheduler (vLLM's SchedulerInterface): schedule() before each forward pass,
    update_from_output() after it, finish_requests() for a stop string or an abort, update_draft_token_ids()
    with the drafts of speculative decoding. core.sched.scheduler.Scheduler is the engine's; a class given as
    LLM(scheduler_cls=...) is built by from_config (a subclass of Scheduler inherits it) and must have every
    member below.

    The attributes are what the engine reads: the config, the KV cache manager it allocates through, requests
    by id, the running list (admission order), the waiting RequestQueue, and the preemption count.
    """

    config: SchedulerConfig
    kv_cache_manager: KVCacheManagerInterface
    block_size: int
    requests: dict[str, Request]
    running: list[Request]
    waiting: RequestQueue
    num_preemptions: int

    @classmethod
    def from_config(cls, config: EngineConfig, kv_cache_config: KVCacheConfig) -> Self: ...
    def add_request(self, request: Request) -> None: ...
    def has_unfinished_requests(self) -> bool: ...
    def schedule(self) -> SchedulerOutput: ...
    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> list[Request]: ...
    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> None: ...
    def update_draft_token_ids(self, draft_token_ids: dict[str, list[int]]) -> None: ...
