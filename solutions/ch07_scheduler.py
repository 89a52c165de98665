"""Chapter 07 solutions: the scheduler's token budget, and schedule() itself."""

from __future__ import annotations

from nanoengine.core.sched.output import PLACEHOLDER_TOKEN_ID, NewRequestData, SchedulerOutput
from nanoengine.core.sched.request_queue import SchedulingPolicy
from nanoengine.core.sched.scheduler import Scheduler as EngineScheduler
from nanoengine.request import Request, RequestStatus


def chunk_size(num_needed: int, budget: int, threshold: int = 0) -> int:
    """Task 07.1: the tokens a request may take in this step."""
    if 0 < threshold < num_needed:
        num_needed = threshold
    return min(num_needed, budget)


def chunk_plan(num_tokens: int, budget: int, threshold: int = 0) -> list[int]:
    """Task 07.1: the chunk sizes a prompt gets, one per step, with the whole budget and others waiting."""
    if budget < 1:
        raise ValueError(f"budget={budget} can never finish a prompt: give at least 1 token per step")
    chunks = []
    while num_tokens > 0:
        chunks.append(chunk_size(num_tokens, budget, threshold))
        num_tokens -= chunks[-1]
    return chunks


class Scheduler(EngineScheduler):
    """Tasks 07.2-07.6: vLLM v1's schedule(), on the engine's queues, pool and bookkeeping."""

    def schedule(self) -> SchedulerOutput:
        # A draft model's extra input per planned request (chapter 13; 0 otherwise): budget is what the next
        # request may take, the budget left less its own drafting slots.
        slots = self.config.max_num_new_slots_for_drafting
        budget = self.config.max_num_batched_tokens - slots
        threshold = self.long_prefill_threshold()  # 0 while one request is alone: nobody to starve
        kv = self.kv_cache_manager
        num_scheduled: dict[str, int] = {}
        new_blocks: dict[str, tuple[list[int], ...]] = {}
        preempted: list[Request] = []

        # Running requests first: they hold blocks already, and stalling them wastes those blocks.
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            # Its drafts too (chapter 13), with no position at max_model_len - 1 or past it.
            n = min(
                chunk_size(request.num_tokens_with_spec - request.num_computed_tokens, budget, threshold),
                self.config.max_model_len - request.num_computed_tokens - 1,
            )
            # Slots past them for a draft model's own KV (num_lookahead_tokens), none at max_model_len or past it.
            lookahead = self.lookahead(request, n)
            blocks = kv.allocate_slots(request, n, num_lookahead_tokens=lookahead)
            while blocks is None:
                if len(self.running) == 1 and not request.spec_token_ids:
                    self.finish_length_capped(request)  # it alone has outgrown the whole pool
                    break
                # Else, with drafts (chapter 13), alone it preempts itself, which drops them.
                victim = self.choose_victim()
                if victim.request_id in num_scheduled:  # it ran earlier in this step: refund its tokens
                    budget += slots
                    budget += num_scheduled.pop(victim.request_id)
                    new_blocks.pop(victim.request_id)
                    i -= 1
                self.preempt(victim)
                preempted.append(victim)
                if victim is request:
                    break
                blocks = kv.allocate_slots(request, n, num_lookahead_tokens=lookahead)
            if blocks is None:
                if self.policy is SchedulingPolicy.PRIORITY and request.status is RequestStatus.PREEMPTED:
                    continue  # it preempted itself: the higher-ranked requests after it may still fit
                break
            num_scheduled[request.request_id] = n
            new_blocks[request.request_id] = blocks.get_block_ids()  # one list of ids per KV cache group
            budget -= n + slots
            i += 1

        # A step that preempted admits nobody: the pool just proved too small for what runs.
        new_reqs: list[NewRequestData] = []
        running_scheduled = list(num_scheduled)
        while not preempted and self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting.peek_request()
            hits, num_hit_tokens = kv.get_computed_blocks(request, record_stats=False)
            n = chunk_size(request.num_tokens - num_hit_tokens, budget, threshold)
            # With drafts, a one-token newcomer beside running decodes: 1 + k tokens or none (chapter 13).
            padded = self.padded_size(request, num_hit_tokens, threshold, running_scheduled)
            if padded > budget:
                break
            n = padded or n
            # The gate: the first chunk only if the whole sequence fits now, or it would thrash mid-prefill.
            reserve = self.lookahead(request, n, num_hit_tokens)
            granted = kv.allocate_slots(
                request, n, num_hit_tokens, hits, num_lookahead_tokens=reserve, full_sequence_must_fit=True
            )
            if granted is None:
                if not self.running:  # the whole pool was there for it: it never fits
                    self.finish_length_capped(request)
                    continue
                break
            new_reqs.append(self.admit(request, num_hit_tokens))
            if padded:
                request.spec_token_ids = [PLACEHOLDER_TOKEN_ID] * (padded - 1)
            num_scheduled[request.request_id] = n
            budget -= n + slots
        return self.make_output(num_scheduled, new_blocks, new_reqs, preempted)

    def choose_victim(self) -> Request:
        """Task 07.4: take the request to preempt out of the running list."""
        if self.policy is SchedulingPolicy.PRIORITY:
            victim = max(self.running, key=lambda r: (r.priority, r.arrival_time))
            self.running.remove(victim)
            return victim
        return self.running.pop()  # FCFS: the newest admitted


class VictimDesign(EngineScheduler):
    """Task 07.10: one design among many, a victim's cost against its gain. Preempting a request costs the tokens
    it has computed (it redoes them); it gains the room the request would have claimed over the next HORIZON
    steps had it stayed: its unread prompt at most one chunk cap a step, then one decode token a step up to its
    max_tokens (an upper bound: a request that stops early on EOS would have claimed less). The victim is the
    running request whose gain exceeds its cost the most, the newest on a tie."""

    HORIZON = 16  # steps ahead that a freed block counts: about how long a victim waits before it is readmitted

    def choose_victim(self) -> Request:
        cap = self.config.long_prefill_token_threshold or self.config.max_num_batched_tokens

        def claim(r: Request) -> int:
            prompt = min(max(0, r.num_prompt_tokens - r.num_computed_tokens), cap * self.HORIZON)
            decode = r.sampling_params.max_tokens - (r.num_tokens - r.num_prompt_tokens)
            return prompt + min(decode, self.HORIZON - -(-prompt // cap))

        victim = max(reversed(self.running), key=lambda r: claim(r) - r.num_computed_tokens)
        self.running.remove(victim)
        return victim
