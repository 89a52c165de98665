"""The scheduler's settings (vllm/config/scheduler.py's SchedulerConfig, the subset nanoengine has)."""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULING_POLICIES = ("fcfs", "priority")


@dataclass(slots=True, kw_only=True)
class SchedulerConfig:
    """max_num_batched_tokens: the per-step token budget, shared by prefill chunks and decodes.
    max_num_seqs: the most requests running at once.
    long_prefill_token_threshold: the largest chunk one request may take in a step (0: no cap), while
    another request is running or waiting.
    policy: "fcfs" or "priority" (lower priority value first, then earlier arrival).
    max_model_len: the longest a request may grow, prompt and output: ModelConfig's, which EngineArgs copies here so
    that a scheduler needs no other config (vLLM's Scheduler reads model_config.max_model_len, and its
    SchedulerConfig takes max_model_len only as an InitVar that checks the budgets).
    long_prefill_token_threshold_adaptive: never cap below a fair share of the budget,
    max_num_batched_tokens // (requests running and waiting) (vLLM 0.33's option; off by default).
    num_lookahead_tokens: KV slots reserved past each request's scheduled tokens, for a draft model's own KV
    (SpeculativeConfig.num_lookahead_tokens; 0 without one).
    num_spec_tokens: k, the drafts a request verifies per step (SpeculativeConfig.num_speculative_tokens; 0
    without speculative decoding). With k > 0 a step's verified blocks are cached as soon as its output is in
    (vLLM 0.33's Scheduler.num_spec_tokens).
    max_num_new_slots_for_drafting: budget tokens each scheduled request reserves for the drafter's extra input
    (SpeculativeConfig.max_num_new_slots_for_drafting: 1 for a draft model, else 0).
    async_scheduling: schedule step N + 1 while step N runs (the engine's batch queue and the AsyncScheduler),
    resolved by EngineArgs from its argument of this name.
    """

    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 64
    long_prefill_token_threshold: int = 0
    policy: str = "fcfs"
    max_model_len: int = 8192
    long_prefill_token_threshold_adaptive: bool = False
    num_lookahead_tokens: int = 0
    num_spec_tokens: int = 0
    max_num_new_slots_for_drafting: int = 0
    async_scheduling: bool = False

    def __post_init__(self) -> None:
        if self.policy not in SCHEDULING_POLICIES:
            raise ValueError(f"policy must be 'fcfs' or 'priority', got {self.policy!r}")
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be >= 1")
