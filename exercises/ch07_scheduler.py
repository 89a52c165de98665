"""Chapter 07 exercises: the scheduler's token budget, admission gate and preemption victim.

Check your work with:   make grade CH=07
"""

from __future__ import annotations


def chunk_plan(num_tokens: int, budget: int, threshold: int = 0) -> list[int]:
    """Task 07.1: the chunk sizes a lone request's prompt gets, one per step.

    The request is alone, so each step it may take the whole budget (max_num_batched_tokens), but
    never more than it still needs, and never more than `threshold` (long_prefill_token_threshold)
    when threshold > 0. Return the chunk sizes until the prompt is computed; they sum to num_tokens.

    Example: chunk_plan(150, 64) == [64, 64, 22]; chunk_plan(150, 64, 24) == [24] * 6 + [6].

    Hints: keep a `remaining` count; each chunk is min(remaining, cap, budget).
    """
    raise NotImplementedError


def schedule_step(running_needs: list[int], waiting_needs: list[int], budget: int, max_num_seqs: int,
                  threshold: int = 0) -> tuple[list[int], list[int]]:
    """Task 07.2: one step of the scheduler, with plenty of KV blocks.

    running_needs[i] is how many tokens running request i still needs (1 for a decode, more for a
    prompt being chunked), in the running list's order; waiting_needs[j] likewise for the waiting
    queue, head first. Return (running_alloc, waiting_alloc): the tokens each one gets this step, 0
    for "not scheduled" (waiting: not admitted). The rules:
    - running requests first, in order; each gets its need capped by threshold (when > 0) and by
      the budget that is left; stop once the budget is 0;
    - then admit waiting requests in order, the same way, while budget is left and fewer than
      max_num_seqs requests are running (the ones admitted count too).

    Example: schedule_step([1, 1, 40], [30, 5], 64, 8) == ([1, 1, 40], [22, 0]).

    Hints: write a small helper for "capped need" and use it in both loops.
    """
    raise NotImplementedError


def choose_victim(running: list[tuple[str, int, float]], policy: str) -> str:
    """Task 07.3: the id of the running request to preempt when the pool runs dry.

    running lists (request_id, priority, arrival_time) in the running list's order (the order the
    requests were admitted). policy "fcfs": the last one admitted (the tail of the list, not
    necessarily the latest arrival: a preempted request is readmitted at the tail). policy
    "priority": the worst, i.e. the largest priority value, ties broken by the latest arrival.

    Hints: list[-1]; max with a key of (priority, arrival_time).
    """
    raise NotImplementedError


def admits(num_prompt_tokens: int, block_size: int, num_free_blocks: int, num_hit_blocks: int,
           num_hit_blocks_free: int) -> bool:
    """Task 07.4: the admission gate. Does the scheduler let this waiting request in?

    The scheduler admits a request only if the pool can hold its WHOLE prompt now, not just its
    first chunk. The prompt needs ceil(num_prompt_tokens / block_size) blocks; num_hit_blocks of them
    are prefix-cache hits it will share instead of allocating. Of those hits, num_hit_blocks_free sit
    in the free queue (ref_cnt 0, cached but unused): taking them removes them from the free queue,
    so they cost a free block each, just like a new block. Hits held by running requests cost
    nothing. Admit if the blocks the request takes out of the free queue fit in num_free_blocks.

    Hints: -(-a // b) is ceil(a / b) for ints.
    """
    raise NotImplementedError
