"""The engine's own parts satisfy their Protocols, checked statically: mypy (pyproject.toml's [tool.mypy] files, run by
`make lint`) type-checks this module, so an implementation that loses a member, changes a signature its Protocol
declares, or no longer builds as the engine builds it (nanoengine/parts.py's table) fails the lint gate.
tests/engine/test_protocols.py checks the converse at run time: that the engine calls no member a Protocol lacks.

Nothing here runs (pytest does not collect this module): each part is built as the engine builds it and assigned to
its Protocol's type, which mypy checks member by member (and the constructor's signature through the call).
"""

from collections.abc import Callable, Sequence

import torch

from nanoengine.attention.backend import AttentionBackend, KernelBackend, TorchBackend
from nanoengine.config.engine import EngineConfig
from nanoengine.core import (
    BlockPool,
    BlockPoolInterface,
    BlockTokensHasher,
    FreeBlockQueue,
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    KVCacheManager,
    KVCacheManagerInterface,
    hash_block_tokens,
)
from nanoengine.core.sched.interface import SchedulerInterface
from nanoengine.core.sched.request_queue import FCFSRequestQueue, PriorityRequestQueue, RequestQueue
from nanoengine.core.sched.scheduler import Scheduler
from nanoengine.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
from nanoengine.worker.block_table import BlockTable, BlockTableInterface


def the_engine_parts_as_the_engine_builds_them(
    blocks: list[KVCacheBlock],
    groups: Sequence[KVCacheGroupSpec],
    engine_config: EngineConfig,
    kv_cache_config: KVCacheConfig,
    kernel: Callable[..., torch.Tensor],
) -> tuple[object, ...]:
    queue: FreeBlockQueue = FreeKVCacheBlockQueue(blocks)  # cls(blocks), by the pool
    pool: BlockPoolInterface = BlockPool(len(blocks), True, free_queue_cls=FreeKVCacheBlockQueue)
    manager: KVCacheManagerInterface = KVCacheManager(16, pool, kv_cache_groups=groups)
    scheduler: SchedulerInterface = Scheduler.from_config(engine_config, kv_cache_config)
    fcfs: RequestQueue = FCFSRequestQueue()
    priority: RequestQueue = PriorityRequestQueue()
    table: BlockTableInterface = BlockTable(16)  # cls(block_size), one per KV cache group
    torch_backend: AttentionBackend = TorchBackend()
    kernel_backend: AttentionBackend = KernelBackend("kernels", kernel, kernel, kernel)
    hasher: BlockTokensHasher = hash_block_tokens
    return queue, pool, manager, scheduler, fcfs, priority, table, torch_backend, kernel_backend, hasher
