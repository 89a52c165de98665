"""Prometheus metrics under vLLM 0.33's names (vllm/v1/metrics/loggers.py's PrometheusStatLogger, the metrics
nanoengine has), labelled as vLLM labels them: model_name and engine ("0": one engine).

Each server has a registry of its own rather than prometheus_client's global one, so that several servers (or
tests) in one process do not collide.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from nanoengine.metrics.stats import IterationStats, SchedulerStats

# vllm/v1/metrics/buckets.py's TIME_TO_FIRST_TOKEN_BUCKETS and INTER_TOKEN_LATENCY_BUCKETS.
TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
)  # fmt: skip
INTER_TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip


class PrometheusStatLogger:
    """Records AsyncLLM's stats into `registry` (exposed by the server's /metrics)."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        labels = {"model_name": model_name, "engine": "0"}

        def make(cls, name: str, documentation: str, **kwargs):
            return cls(name, documentation, labelnames=list(labels), registry=registry, **kwargs).labels(**labels)

        self.gauge_scheduler_running = make(
            Gauge, "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.gauge_scheduler_waiting = make(
            Gauge, "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        self.gauge_kv_cache_usage = make(
            Gauge, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        self.counter_prefix_cache_queries = make(
            Counter, "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        )
        self.counter_prefix_cache_hits = make(
            Counter, "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.histogram_time_to_first_token = make(
            Histogram,
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            buckets=TIME_TO_FIRST_TOKEN_BUCKETS,
        )
        self.histogram_inter_token_latency = make(
            Histogram,
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            buckets=INTER_TOKEN_LATENCY_BUCKETS,
        )
        self.histogram_request_time_per_output_token = make(
            Histogram,
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            buckets=INTER_TOKEN_LATENCY_BUCKETS,
        )

    def record(self, scheduler_stats: SchedulerStats, iteration_stats: IterationStats | None) -> None:
        self.gauge_scheduler_running.set(scheduler_stats.num_running_reqs)
        self.gauge_scheduler_waiting.set(scheduler_stats.num_waiting_reqs)
        self.gauge_kv_cache_usage.set(scheduler_stats.kv_cache_usage)
        self.counter_prefix_cache_queries.inc(scheduler_stats.prefix_cache_queries)
        self.counter_prefix_cache_hits.inc(scheduler_stats.prefix_cache_hits)
        if iteration_stats is None:
            return
        for ttft in iteration_stats.time_to_first_tokens_iter:
            self.histogram_time_to_first_token.observe(ttft)
        for itl in iteration_stats.inter_token_latencies_iter:
            self.histogram_inter_token_latency.observe(itl)
        for tpot in iteration_stats.time_per_output_tokens_iter:
            self.histogram_request_time_per_output_token.observe(tpot)
