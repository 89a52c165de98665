"""Chapter 07 solutions: the scheduler's token budget, admission gate and preemption victim."""

from __future__ import annotations


def _chunk(need: int, budget: int, threshold: int) -> int:
    """What one request may take this step: its need, capped by the threshold (when set) and the budget."""
    if 0 < threshold < need:
        need = threshold
    return min(need, budget)


def chunk_plan(num_tokens: int, budget: int, threshold: int = 0) -> list[int]:
    """Task 07.1: the chunk sizes a lone request's prompt gets, one per step."""
    chunks = []
    while num_tokens > 0:
        chunks.append(_chunk(num_tokens, budget, threshold))
        num_tokens -= chunks[-1]
    return chunks


def schedule_step(running_needs: list[int], waiting_needs: list[int], budget: int, max_num_seqs: int,
                  threshold: int = 0) -> tuple[list[int], list[int]]:
    """Task 07.2: the tokens each running and each waiting request gets in one step (0: none)."""
    running = [0] * len(running_needs)
    for i, need in enumerate(running_needs):
        if budget == 0:
            break
        running[i] = _chunk(need, budget, threshold)
        budget -= running[i]
    waiting = [0] * len(waiting_needs)
    num_running = len(running_needs)
    for i, need in enumerate(waiting_needs):
        if budget == 0 or num_running >= max_num_seqs:
            break
        waiting[i] = _chunk(need, budget, threshold)
        budget -= waiting[i]
        num_running += 1
    return running, waiting


def choose_victim(running: list[tuple[str, int, float]], policy: str) -> str:
    """Task 07.3: the id of the running request to preempt."""
    if policy == "priority":
        return max(running, key=lambda r: (r[1], r[2]))[0]
    return running[-1][0]


def admits(num_prompt_tokens: int, block_size: int, num_free_blocks: int, num_hit_blocks: int,
           num_hit_blocks_free: int) -> bool:
    """Task 07.4: does the admission gate let this prompt in?"""
    new_blocks = -(-num_prompt_tokens // block_size) - num_hit_blocks
    # A hit on a free cached block leaves the free queue too, so it costs a free block like a new one.
    return new_blocks + num_hit_blocks_free <= num_free_blocks
