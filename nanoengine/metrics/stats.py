"""What one engine step reports to the stat loggers (vllm/v1/metrics/stats.py's SchedulerStats and IterationStats,
the fields nanoengine has)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class SchedulerStats:
    """The scheduler's state after a step (or after requests joined or left between steps).

    kv_cache_usage: the share of the pool's blocks in use, null block excluded (1.0 is full).
    prefix_cache_queries, prefix_cache_hits: tokens looked up and found at admission since the last report.
    """

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0


@dataclass(slots=True)
class IterationStats:
    """Latencies observed in one step, in seconds: each request's time to first token (from arrival), the gap since
    its previous token for every later token, and, per request finished, its decode time per output token after
    the first (vLLM's request_time_per_output_token)."""

    time_to_first_tokens_iter: list[float] = field(default_factory=list)
    inter_token_latencies_iter: list[float] = field(default_factory=list)
    time_per_output_tokens_iter: list[float] = field(default_factory=list)
