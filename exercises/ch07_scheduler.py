"""Chapter 07 exercises: the scheduler. You write vLLM v1's schedule(); once it passes, it runs the engine.

Check your work with:   make grade CH=07
Stuck? In the notebook, `from nanocourse import hint; hint("07")` lists this chapter's hints, from a nudge to
close-to-code; open them one at a time with hint("07", n).

Your Scheduler subclasses the engine's, so the bookkeeping is there to reuse and you write the policy:

| you have | what it does |
|---|---|
| `self.config` | `max_num_batched_tokens` (the budget), `max_num_seqs`, `long_prefill_token_threshold` |
| `self.long_prefill_threshold()` | this step's chunk cap: the threshold, or 0 while one request is alone (vLLM 0.33) |
| `self.running` | the running requests, in admission order (a list) |
| `self.waiting` | a RequestQueue: `peek_request()`, `bool(self.waiting)`; FCFS or priority order already |
| `self.kv_cache_manager` | `get_computed_blocks(...)`, `allocate_slots(..., full_sequence_must_fit=...)` (chapter 06) |
| `self.policy` | `SchedulingPolicy.FCFS` or `SchedulingPolicy.PRIORITY` |
| `request.status` | `RequestStatus.RUNNING`, `PREEMPTED` (after `self.preempt`), ... |
| `self.preempt(r)` | frees r's blocks, resets its progress, puts it back in the waiting queue |
| `self.admit(r, n)` | moves the queue's head r (slots already allocated, n tokens cached) to running |
| `self.finish_length_capped(r)` | ends a lone running request that the whole pool cannot hold |
| `self.make_output(num_scheduled, new_blocks, new_reqs, preempted)` | packages the step |

A request has `request_id`, `num_tokens`, `num_computed_tokens`, `priority` and `arrival_time`.

get_computed_blocks returns (the hit as a KVCacheBlocks, its length in tokens); allocate_slots returns the new
blocks as a KVCacheBlocks, or None. A `KVCacheBlocks` (vLLM's name) holds one list of blocks per KV cache group,
`.blocks[g]`; `get_block_ids()` gives one list of ids per group, a tuple (a one-group model's reads `([3, 4],)`).
Your scheduler passes these along without looking inside, so it serves a model with several groups too: chapter
12's windowed models.
"""

from __future__ import annotations

from nanoengine.core.sched.output import NewRequestData, SchedulerOutput  # noqa: F401  (schedule builds these)
from nanoengine.core.sched.request_queue import SchedulingPolicy  # noqa: F401  (choose_victim needs it)
from nanoengine.core.sched.scheduler import Scheduler as EngineScheduler
from nanoengine.request import Request, RequestStatus  # noqa: F401  (schedule reads a status)


def chunk_size(num_needed: int, budget: int, threshold: int = 0) -> int:
    """Task 07.1: the tokens a request that still needs num_needed tokens may take in this step.

    Contract: the need, capped by `threshold` when it is above 0 and by the budget left; never more than any
    of the three. (vLLM 0.33: the `num_new_tokens` lines of Scheduler.schedule.)
    Example: chunk_size(150, 64) == 64; chunk_size(150, 64, 24) == 24; chunk_size(5, 64, 16) == 5.
    """
    raise NotImplementedError


def chunk_plan(num_tokens: int, budget: int, threshold: int = 0) -> list[int]:
    """Task 07.1: the chunk sizes a prompt of num_tokens gets, one per step, until it is computed, when it has
    each step's whole budget and other requests wait (so the threshold applies).

    Contract: every chunk is chunk_size of what remains; the chunks sum to num_tokens; a budget below 1 can
    never finish a prompt, so it raises ValueError.
    Example: chunk_plan(150, 64) == [64, 64, 22]; chunk_plan(150, 64, 24) == [24] * 6 + [6].
    """
    raise NotImplementedError


class Scheduler(EngineScheduler):
    """Your scheduler. LLM(scheduler_cls=Scheduler) runs it; my_llm() does once chapter 07 passes."""

    def schedule(self) -> SchedulerOutput:
        """Tasks 07.2, 07.3, 07.5, 07.6 and 07.8: plan one step as vLLM 0.33's Scheduler.schedule does
        (vllm/v1/core/sched/scheduler.py; read it beside this), and return
        self.make_output(num_scheduled, new_blocks, new_reqs, preempted).

        What the plan must satisfy:
        - Budget: the planned tokens sum to at most config.max_num_batched_tokens. Each planned request takes
          chunk_size(what it still needs, budget left, self.long_prefill_threshold()), the threshold read once
          at the start of the step (it caps nobody while one request alone runs or waits). What a running
          request still needs is request.num_tokens_with_spec - request.num_computed_tokens: num_tokens until
          chapter 13 gives it draft tokens, which are scheduled too, none at position config.max_model_len - 1
          or past it.
        - Running first: the running requests are planned in self.running's order before any waiting one;
          the step stops planning when the budget is spent.
        - Memory: a running request is planned only with the blocks kv_cache_manager.allocate_slots grants it.
          When the pool is short, choose_victim() and preempt() free room until the allocation succeeds. A
          victim already planned this step leaves the plan and gives its tokens back. A request that
          preempts itself is not planned: under FCFS that ends the running requests' turn, under priority
          the next running request still gets its turn (it ranks higher and may fit in the freed blocks).
          A request running alone that still does not fit is finish_length_capped().
        - Admission: only in a step that preempted nobody, while budget is left and fewer than
          config.max_num_seqs run, the waiting queue's head is admitted (self.admit) if allocate_slots grants
          its first chunk with full_sequence_must_fit=True, that is, only if its whole sequence (num_tokens)
          fits in the free blocks now (vLLM 0.33's waiting loop passes scheduler_reserve_full_isl, True by
          default); its lookup is get_computed_blocks(request, record_stats=False), counted once by admit().
          The first request that does not get in ends admission.
        - Output: num_scheduled maps each planned request id to its tokens (running ones in order, then
          admitted ones); new_blocks maps each planned running request to get_block_ids() of the KVCacheBlocks
          allocate_slots just gave it: a tuple with one list of block ids per KV cache group, in the order
          given (([],) when a one-group request got no new block; vLLM's scheduler sends None then);
          new_reqs lists admit()'s results; preempted lists the victims.

        Example: budget 64, no threshold, a decoding (1 token) and b waiting with a 150-token prompt that
        fits: the step plans {a: 1, b: 63}; the next plans {a: 1, b: 63}; then {a: 1, b: 24}.
        Task 07.8 runs your schedule() beside the engine's over random workloads, a third of them with 2 drafts
        per running request and step, and compares every step's plan, drafts, blocks, queues and prefix-cache
        counts: the rules above, and nothing else, decide them all.
        Stuck? hint("07") lists the hints; hint("07", 2) starts on schedule().
        """
        raise NotImplementedError

    def choose_victim(self) -> Request:
        """Task 07.4: remove the request to preempt from self.running and return it.

        Contract (vLLM 0.33's Scheduler.schedule, the "Preempt the lowest-priority request" lines): under FCFS
        the newest admitted, the running list's tail (not the latest arrival: a readmitted request sits at
        the tail); under PRIORITY the worst, the largest (priority, arrival_time).
        Example: running [old (arrived 1.0), x (5.0), y (3.0, readmitted)]: FCFS takes y, priority takes x.
        """
        raise NotImplementedError
