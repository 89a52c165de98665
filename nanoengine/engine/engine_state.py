"""A snapshot of the engine's state, for a live view of a serving engine (the server's `/engine_state` and `/live`).

`EngineStateRecorder` watches every step as a StepObserver, keeping the plans of the last few (which request got
how many tokens, who was admitted with how many tokens from the prefix cache, who was preempted, who finished), and
`take()` copies the rest: each block's ref count and hash, the free queue head to tail, the running and
waiting requests with their block tables, the prefix cache's totals. vLLM has no such view: it exports counts to
Prometheus only.

Invariant: a snapshot is only ever taken between steps, by whoever owns the engine (AsyncLLM's engine loop while it
serves), so it is one consistent state and never a step half done; it holds copies (and immutable hashes), never a
live object, so it may be read from any thread afterwards. The copy reads every block once (see `take` for its cost).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

from nanoengine.core.kv_cache_utils import BlockHash

if TYPE_CHECKING:
    from nanoengine.core import PrefixCacheStats
    from nanoengine.core.sched.interface import SchedulerInterface
    from nanoengine.core.sched.output import SchedulerOutput
    from nanoengine.engine.llm_engine import LLMEngine
    from nanoengine.outputs import RequestOutput
    from nanoengine.request import Request

NUM_STEP_PLANS = 8  # the plans a snapshot carries: enough to see a request arrive, prefill and decode


@dataclass(frozen=True, slots=True)
class StepPlan:
    """What the scheduler decided for one step (engine step number `step`, counting from 1).

    num_scheduled_tokens follows the SchedulerOutput's order: running requests first, then admissions. admitted
    maps each request admitted this step (first time or after preemption) to the tokens it already had computed,
    the prefix cache's share. A step that preempted admits nobody (the scheduler's rule).
    """

    step: int
    num_scheduled_tokens: dict[str, int]
    admitted: dict[str, int]
    preempted: list[str]
    finished: list[str]
    seconds: float

    @property
    def num_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    def events(self) -> list[str]:
        """Admissions (+r3, with the tokens the prefix cache spared), preemptions and finishes, in that order."""
        news = [f"+r{r}" + (f"(cache {c})" if c else "") for r, c in self.admitted.items()]
        return news + [f"PREEMPT r{r}" for r in self.preempted] + [f"done r{r}" for r in self.finished]

    def headline(self) -> str:
        """'step 9: 28 tokens'."""
        return f"step {self.step}: {self.num_tokens} token{'s' * (self.num_tokens != 1)}"

    def describe(self) -> str:
        """One line: the headline, tokens per request, then the events."""
        ran = " ".join(f"r{r}:{n}" for r, n in self.num_scheduled_tokens.items()) or "-"
        news = self.events()
        return f"{self.headline()} | {ran}" + (" | " + " ".join(news) if news else "")


@dataclass(frozen=True, slots=True)
class RequestState:
    """One unfinished request: status 'running', 'waiting' or 'preempted' (RequestStatus's name); block_ids is its first KV cache group's
    block table (empty while it waits: a waiting request holds no block)."""

    request_id: str
    status: str
    num_prompt_tokens: int
    num_tokens: int
    num_computed_tokens: int
    num_cached_tokens: int  # the prefix cache's share at admission; -1 before it
    block_ids: list[int]


@dataclass(frozen=True, slots=True)
class EngineState:
    """The engine between two steps. Block i's ref count is ref_cnt[i] and its hash block_hashes[i] (None: not in
    the prefix cache); block null_block_id is the null block, never handed out. free_queue lists the free blocks
    head (taken next) to tail. running is in admission order, waiting in the order it will be admitted. The prefix
    cache's totals count tokens looked up and found at admission since the engine started. steps: the last plans,
    oldest first."""

    step: int
    taken_at: float  # time.time()
    null_block_id: int
    ref_cnt: list[int]
    block_hashes: list[BlockHash | None]
    free_queue: list[int]
    running: list[RequestState]
    waiting: list[RequestState]
    prefix_cache_queries: int
    prefix_cache_hits: int
    steps: list[StepPlan]

    @property
    def num_blocks(self) -> int:
        """Usable blocks: the null block excluded."""
        return len(self.ref_cnt) - 1

    @property
    def num_used_blocks(self) -> int:
        """Blocks some running request holds."""
        return sum(n > 0 for i, n in enumerate(self.ref_cnt) if i != self.null_block_id)

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still carry a hash: a request with the same prefix can take them back."""
        return sum(
            n == 0 and h is not None
            for i, (n, h) in enumerate(zip(self.ref_cnt, self.block_hashes, strict=True))
            if i != self.null_block_id
        )

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """Hit tokens over looked-up tokens; None before any lookup."""
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else None

    def block_owners(self) -> dict[int, list[str]]:
        """block id -> the running requests whose block tables hold it, in admission order."""
        owners: dict[int, list[str]] = {}
        for request in self.running:
            for block_id in request.block_ids:
                owners.setdefault(block_id, []).append(request.request_id)
        return owners

    def summary(self) -> str:
        """One line: the step, the requests, the pool and the hit rate."""
        rate = self.prefix_cache_hit_rate
        return (
            f"after step {self.step}: {len(self.running)} running, {len(self.waiting)} waiting | blocks: "
            f"{self.num_used_blocks} in use, {self.num_cached_free_blocks} cached-free, "
            f"{self.num_blocks - self.num_used_blocks - self.num_cached_free_blocks} free of {self.num_blocks} | "
            f"prefix cache hit rate {'-' if rate is None else f'{rate:.1%}'} "
            f"({self.prefix_cache_hits}/{self.prefix_cache_queries} tokens)"
        )

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values: hashes as hex, and the counts above under their property names."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}  # asdict would deep-copy the long lists: 10x slower
        out["running"], out["waiting"] = [asdict(r) for r in self.running], [asdict(r) for r in self.waiting]
        out["steps"] = [asdict(p) for p in self.steps]
        out["block_hashes"] = [h.hex() if h is not None else None for h in self.block_hashes]
        for name in ("num_blocks", "num_used_blocks", "num_cached_free_blocks", "prefix_cache_hit_rate"):
            out[name] = getattr(self, name)
        return out


class EngineStateRecorder:
    """Watches `engine` (a StepObserver on engine.observers from construction to `close()`), keeping the plans of
    its last `num_steps` steps, and takes EngineStates of it.

    Watching costs a few µs a step (it copies the SchedulerOutput's small dicts). Call `take` only between steps,
    from the thread that steps the engine.
    """

    def __init__(self, engine: LLMEngine, num_steps: int = NUM_STEP_PLANS) -> None:
        self.engine = engine
        self.plans: deque[StepPlan] = deque(maxlen=num_steps)
        self._draft: dict[str, Any] = {}
        engine.observers.append(self)

    def close(self) -> None:
        """Stop watching the engine (again: nothing)."""
        if self in self.engine.observers:
            self.engine.observers.remove(self)

    def on_schedule(
        self, scheduler: SchedulerInterface, scheduler_output: SchedulerOutput, running_before: tuple[str, ...]
    ) -> None:
        so = scheduler_output
        self._draft = {
            "num_scheduled_tokens": dict(so.num_scheduled_tokens),
            "admitted": {d.req_id: d.num_computed_tokens for d in so.scheduled_new_reqs},
            "preempted": sorted(so.preempted_req_ids),
        }

    def on_step(
        self,
        scheduler_output: SchedulerOutput,
        finished: list[RequestOutput],
        prefix_cache_stats: PrefixCacheStats | None,
        seconds: float,
    ) -> None:
        # The engine counted this step before it called its observers.
        finished_ids = [o.request_id for o in finished]
        self.plans.append(StepPlan(self.engine.stats.num_steps, finished=finished_ids, seconds=seconds, **self._draft))

    def take(self) -> EngineState:
        """The engine's state now; call between steps only. Cost: one read of every block, plus each running
        request's block table (0.36 ms for SmolLM2's 728 blocks and 8 requests on a busy 2-core CPU, see README)."""
        engine = self.engine
        manager, scheduler, pool = engine.kv_cache_manager, engine.scheduler, engine.kv_cache_manager.block_pool
        blocks = pool.blocks
        return EngineState(
            step=engine.stats.num_steps,
            taken_at=time.time(),
            null_block_id=pool.null_block.block_id,
            ref_cnt=[b.ref_cnt for b in blocks],
            block_hashes=[b.block_hash for b in blocks],
            free_queue=[b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
            running=[_request_state(r, manager.get_block_ids(r.request_id)[0]) for r in scheduler.running],
            waiting=[_request_state(r, []) for r in scheduler.waiting],
            prefix_cache_queries=engine.stats.prefix_cache_queries,
            prefix_cache_hits=engine.stats.prefix_cache_hits,
            steps=list(self.plans),
        )


def _request_state(request: Request, block_ids: list[int]) -> RequestState:
    return RequestState(
        request.request_id,
        request.status.name.lower(),
        request.num_prompt_tokens,
        request.num_tokens,
        request.num_computed_tokens,
        request.num_cached_tokens,
        block_ids,
    )
