"""The scheduler of async scheduling, vLLM 0.33's default (vllm/v1/core/sched/async_scheduler.py).

Under async scheduling the engine schedules step N + 1 while step N runs, and takes step N's output one step
later (LLMEngine's batch queue, vLLM's EngineCore.step_with_batch_queue). So when step N + 1 is planned, step
N's sampled token is not known yet. The AsyncScheduler counts it anyway, as an output placeholder
(Request.num_output_placeholders): a decoding request is scheduled its next token at once, and the runner,
which runs the steps in order, feeds it the token step N sampled. The rest lives in the base Scheduler, as in
vLLM: update_from_output resolves the placeholders, schedule() skips a request whose step in flight already
reaches max_tokens, a preempted request's in-flight output is stale (appended on return, counters untouched)
and holds the request back until it drains, and sliding-window blocks are freed only behind processed tokens.

Invariant: for a request past its prompt, num_computed_tokens == num_tokens - 1 + num_output_placeholders
between steps, and num_in_flight_tokens counts the tokens of its steps not yet processed.
"""

from __future__ import annotations

from nanoengine.core.sched.output import SchedulerOutput
from nanoengine.core.sched.scheduler import Scheduler

__all__ = ["AsyncScheduler"]


class AsyncScheduler(Scheduler):
    """Scheduler plus output placeholders. Speculative decoding is out of its scope: vLLM schedules k -1 drafts
    as placeholders and the worker fills them in on the device, which nanoengine's runner does not do, so
    EngineArgs refuses async_scheduling=True with speculative_config."""

    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        """After advancing the counters, give every scheduled request that will sample a token (not a prompt chunk
        short of its end) one placeholder for it (vLLM's num_sampled_tokens_per_step, 1)."""
        super()._update_after_schedule(scheduler_output)
        for req_id in scheduler_output.num_scheduled_tokens:
            request = self.requests[req_id]
            if not request.is_prefill_chunk:
                request.num_output_placeholders += 1
