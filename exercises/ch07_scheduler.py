"""Chapter 07 exercises: the scheduler. You write vLLM v1's schedule(); once it passes, it runs the engine.

Check your work with:   make grade CH=07

Your Scheduler subclasses the engine's, so the bookkeeping is there to reuse and you write the policy:

| you have | what it does |
|---|---|
| `self.config` | `max_num_batched_tokens` (the budget), `max_num_seqs`, `long_prefill_token_threshold` |
| `self.long_prefill_threshold()` | this step's chunk cap: the threshold, or 0 while one request is alone (vLLM 0.33) |
| `self.running` | the running requests, in admission order (a list) |
| `self.waiting` | a RequestQueue: `peek_request()`, `bool(self.waiting)`; FCFS or priority order already |
| `self.kv_cache_manager` | `allocate_slots(...)`, `get_computed_blocks(...)`, `block_pool.get_num_free_blocks()` |
| `self.policy` | `SchedulingPolicy.FCFS` or `SchedulingPolicy.PRIORITY` |
| `request.status` | `RequestStatus.RUNNING`, `PREEMPTED` (after `self.preempt`), ... |
| `self.preempt(r)` | frees r's blocks, resets its progress, puts it back in the waiting queue |
| `self.admit(r, n)` | moves the queue's head r (slots already allocated, n tokens cached) to running |
| `self.finish_length_capped(r)` | ends a lone running request that the whole pool cannot hold |
| `self.make_output(num_scheduled, new_blocks, new_reqs, preempted)` | packages the step |

A request has `request_id`, `num_tokens`, `num_computed_tokens`, `priority` and `arrival_time`.
"""

from __future__ import annotations

from nanoengine.request import Request, RequestStatus  # noqa: F401  (schedule reads a status)
from nanoengine.core.sched.request_queue import SchedulingPolicy  # noqa: F401  (choose_victim needs it)
from nanoengine.core.sched.output import NewRequestData, SchedulerOutput  # noqa: F401  (schedule builds these)
from nanoengine.core.sched.scheduler import Scheduler as EngineScheduler


def chunk_size(num_needed: int, budget: int, threshold: int = 0) -> int:
    """Task 07.1: the tokens a request that still needs num_needed tokens may take in this step.

    Its need, but never more than `threshold` (long_prefill_token_threshold) when threshold > 0, and
    never more than the budget that is left. chunk_size(150, 64) == 64; chunk_size(150, 64, 24) == 24;
    chunk_size(5, 64, 16) == 5.
    """
    raise NotImplementedError


def chunk_plan(num_tokens: int, budget: int, threshold: int = 0) -> list[int]:
    """Task 07.1: the chunk sizes a lone request's prompt gets, one per step, until it is computed.

    Alone, the request may take the whole budget each step. chunk_plan(150, 64) == [64, 64, 22];
    chunk_plan(150, 64, 24) == [24] * 6 + [6].

    Hints: keep a `remaining` count; each chunk is chunk_size(remaining, budget, threshold).
    """
    raise NotImplementedError


class Scheduler(EngineScheduler):
    """Your scheduler. LLM(scheduler_cls=Scheduler) runs it; my_llm() does once chapter 07 passes."""

    def schedule(self) -> SchedulerOutput:
        """Tasks 07.2, 07.3, 07.5 and 07.6: plan one step, vLLM v1's way.

        1. Running requests first, in order, from one budget (config.max_num_batched_tokens): each gets
           chunk_size(what it still needs, budget left, threshold) tokens, with threshold =
           self.long_prefill_threshold() for the whole step; stop when the budget is 0.
           kv_cache_manager.allocate_slots(request, n) returns its new blocks, or None when the pool
           is out of blocks.
        2. On None, preempt: victim = self.choose_victim(); self.preempt(victim). If the victim was
           already scheduled in this step, give its tokens back to the budget and forget its entry
           (and step back one place in the running list, which just lost an earlier entry). Retry
           until the allocation succeeds; if the victim is the request itself, it no longer runs: under
           FCFS that ends the loop, under priority the loop goes on with the next running request (it
           ranks higher and may fit in the freed blocks; vLLM 0.33 does the same).
           If the request is the only one running and still does not fit, finish_length_capped(it).
        3. Then admit waiting requests, but only in a step that preempted nobody, while budget is left
           and fewer than config.max_num_seqs requests run. For the queue's head:
           hits, num_hit_tokens = kv_cache_manager.get_computed_blocks(request, record_stats=False)
           (admit() records the stats once). The gate: admit only if the WHOLE prompt fits now, i.e.
           ceil(num_tokens / block_size) - len(hits) new blocks, plus one for each hit with
           ref_cnt == 0 (it leaves the free queue), fit in block_pool.get_num_free_blocks(). Then
           allocate_slots(request, n, num_hit_tokens, hits) for its first chunk n, and
           self.admit(request, num_hit_tokens). Stop at the first request that does not get in.
        4. return self.make_output(num_scheduled, new_blocks, new_reqs, preempted), where
           num_scheduled maps request ids to tokens (running ones first, in order, then admitted
           ones), new_blocks maps each RUNNING request's id to [b.block_id for b in its new blocks],
           new_reqs lists what admit() returned and preempted lists the victims.

        Hints:
        - Use a while loop with an index over self.running: preemption shrinks the list under you.
        - `-(-a // b)` is ceil(a / b) for ints.
        """
        raise NotImplementedError

    def choose_victim(self) -> Request:
        """Task 07.4: remove the request to preempt from self.running and return it.

        FCFS (self.policy is SchedulingPolicy.FCFS): the newest admitted, i.e. the running list's tail
        (not the latest arrival: a preempted request is readmitted at the tail). PRIORITY: the worst,
        i.e. the largest priority value, ties broken by the latest arrival_time.

        Hints: list.pop(); max with a key of (priority, arrival_time), then list.remove.
        """
        raise NotImplementedError
