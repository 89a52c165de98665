"""Measuring the prefix cache: time to first token with the cache on and off, over the workloads of
datasets.py and over a sweep of shared-prefix lengths, a fitted cost model, and the stored report.

`measure` and `prefix_sweep` drive two LLM instances, one with prefix caching and one without, through
generate, get_stats and reset_prefix_cache.
"""

from __future__ import annotations

import itertools
import json
import random
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from nanoengine.benchmarks.datasets import Workload, prose
from nanoengine.sampling_params import SamplingParams

# The table in the blog post "vLLM v1 Prefix Caching: Hash Chains, LRU Eviction, and Hit Rate
# Optimization" (Llama 70B, TP=4, H100): hit-rate range and TTFT-reduction range per workload.
BLOG_POST_TABLE = {
    "chatbot": ((0.92, 0.97), (0.78, 0.78)),
    "multi_turn": ((0.80, 0.95), (0.65, 0.85)),
    "rag": ((0.25, 0.40), (0.10, 0.18)),
    "code": ((0.15, 0.35), (0.08, 0.25)),
    "summarization": ((0.08, 0.15), (0.02, 0.05)),
    "random": ((0.00, 0.02), (0.00, 0.00)),
}


# ---- measurement ---------------------------------------------------------------------------------
def ttft_reduction(cold_ms: Sequence[float], warm_ms: Sequence[float]) -> float:
    """1 - p50(warm) / p50(cold): the share of the median time to first token that caching removes."""
    return 1 - statistics.median(warm_ms) / statistics.median(cold_ms)


@dataclass(slots=True)
class WorkloadResult:
    """One workload's run. hit_rate comes from the engine's own counters (tokens, at admission)."""

    name: str
    prompt_tokens: list[int]
    cached_tokens: list[int]
    hit_rate: float
    ttft_off_ms: list[float]
    ttft_on_ms: list[float]

    @property
    def p50_off_ms(self) -> float:
        return statistics.median(self.ttft_off_ms)

    @property
    def p50_on_ms(self) -> float:
        return statistics.median(self.ttft_on_ms)

    @property
    def reduction(self) -> float:
        return ttft_reduction(self.ttft_off_ms, self.ttft_on_ms)


def _counters(llm) -> tuple[int, int]:
    stats = llm.get_stats()
    return stats.prefix_cache_queries, stats.prefix_cache_hits


def measure(workload: Workload, llm_on, llm_off, max_tokens: int = 1) -> WorkloadResult:
    """Send the prompts one at a time to both engines, alternating, from an empty prefix cache.

    Alternating spreads the machine's load changes evenly over both sides; max_tokens=1 makes each
    request cost its prefill and one sample, which is what TTFT measures.
    """
    if llm_off.engine.kv_cache_manager.enable_caching or not llm_on.engine.kv_cache_manager.enable_caching:
        raise ValueError("measure() needs llm_on with prefix caching and llm_off without.")
    if not llm_on.reset_prefix_cache():
        raise RuntimeError("llm_on has requests in flight; its prefix cache cannot be reset.")
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    queries0, hits0 = _counters(llm_on)
    off, on = [], []
    for ids in workload.prompts:
        off.append(llm_off.generate(prompt_token_ids=list(ids), sampling_params=params)[0])
        on.append(llm_on.generate(prompt_token_ids=list(ids), sampling_params=params)[0])
    queries, hits = (now - before for now, before in zip(_counters(llm_on), (queries0, hits0)))
    return WorkloadResult(
        workload.name,
        [len(ids) for ids in workload.prompts],
        [o.num_cached_tokens for o in on],
        hits / queries,
        [1000 * o.ttft for o in off],
        [1000 * o.ttft for o in on],
    )


@dataclass(frozen=True, slots=True)
class SweepPoint:
    prefix_tokens: int
    prompt_tokens: int
    cached_tokens: int
    cold_ms: float  # cache on but empty: the first request with this prefix computes all of it
    warm_ms: float  # the same prefix, cached by the cold request, with another suffix
    off_ms: float | None = None  # the warm request's prompt on an engine without prefix caching


def prefix_sweep(
    tok, llm_on, llm_off=None, prefixes: Sequence[int] = (0, 64, 128, 256, 512), suffix_tokens: int = 32, seed: int = 0
) -> list[SweepPoint]:
    """TTFT of prompts made of a shared prefix and their own suffix, for each prefix length: the first
    request (cold), a second one with another suffix (warm) and, given llm_off, the second with caching off."""
    rng = random.Random(seed)
    params = SamplingParams(temperature=0, max_tokens=1)
    body = tok.encode(prose(tok, rng, max(prefixes)))
    points = []
    for n in prefixes:
        first, second = (tok.encode(prose(tok, rng, suffix_tokens))[:suffix_tokens] for _ in range(2))
        llm_on.reset_prefix_cache()
        (cold,) = llm_on.generate(prompt_token_ids=body[:n] + first, sampling_params=params)
        (warm,) = llm_on.generate(prompt_token_ids=body[:n] + second, sampling_params=params)
        off_ms = None
        if llm_off is not None:
            (off,) = llm_off.generate(prompt_token_ids=body[:n] + second, sampling_params=params)
            off_ms = 1000 * off.ttft
        points.append(
            SweepPoint(
                n, len(warm.prompt_token_ids), warm.num_cached_tokens, 1000 * cold.ttft, 1000 * warm.ttft, off_ms
            )
        )
    return points


def fit_cost_model(computed_tokens: Sequence[int], ttft_ms: Sequence[float]) -> tuple[float, float]:
    """TTFT ≈ fixed_ms + per_token_ms × (tokens actually prefilled), fitted by Theil-Sen: the slope is the
    median of the slopes between all pairs of points, the intercept the median residual. Unlike least
    squares, one request slowed down by another process on the machine cannot tilt the line."""
    points = list(zip(computed_tokens, ttft_ms))
    per_token = statistics.median(
        (y2 - y1) / (x2 - x1) for (x1, y1), (x2, y2) in itertools.combinations(points, 2) if x1 != x2
    )
    return statistics.median(y - per_token * x for x, y in points), per_token


def sweep_cost_model(points: Sequence[SweepPoint]) -> tuple[float, float]:
    """The cost model fitted to every request of a sweep: cold and warm (and off, when measured)."""
    measured = [(p.prompt_tokens, p.cold_ms) for p in points] + [
        (p.prompt_tokens, p.off_ms) for p in points if p.off_ms is not None
    ]
    measured += [(p.prompt_tokens - p.cached_tokens, p.warm_ms) for p in points]
    return fit_cost_model(*zip(*measured))


def predicted_reduction(result: WorkloadResult, fixed_ms: float, per_token_ms: float) -> float:
    """The TTFT reduction the cost model expects from the measured hits alone."""
    off = [fixed_ms + per_token_ms * n for n in result.prompt_tokens]
    on = [fixed_ms + per_token_ms * (n - c) for n, c in zip(result.prompt_tokens, result.cached_tokens)]
    return ttft_reduction(off, on)


# ---- stored runs and tables ----------------------------------------------------------------------
def save_run(path: Path, results: Sequence[WorkloadResult], points: Sequence[SweepPoint], extra: dict) -> None:
    model = sweep_cost_model(points)
    path.write_text(
        json.dumps(
            {
                **extra,
                "cost_model_ms": {"fixed": model[0], "per_token": model[1]},
                "results": [asdict(r) for r in results],
                "prefix_sweep": [asdict(p) for p in points],
            },
            indent=2,
        )
    )


def load_run(path: Path) -> tuple[list[WorkloadResult], list[SweepPoint], dict]:
    """A run written by save_run (bench/workloads.py): results, sweep, and the rest of the report."""
    report = json.loads(Path(path).read_text())
    results = [WorkloadResult(**r) for r in report.pop("results")]
    return results, [SweepPoint(**p) for p in report.pop("prefix_sweep")], report


def _pct_range(lo: float, hi: float) -> str:
    return f"{100 * lo:.0f}%" if lo == hi else f"{100 * lo:.0f}-{100 * hi:.0f}%"


def results_markdown(results: Sequence[WorkloadResult], model: tuple[float, float] | None = None) -> str:
    """The measured table beside the blog post's; with a cost model, also the reduction it predicts."""
    head = "| workload | hit rate | TTFT p50 off | on | reduction |" + (" predicted |" if model else "")
    head += " blog post: hit rate | reduction |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        post_hit, post_red = BLOG_POST_TABLE[r.name]
        row = f"| {r.name} | {100 * r.hit_rate:.0f}% | {r.p50_off_ms:.0f} ms | {r.p50_on_ms:.0f} ms | {100 * r.reduction:.0f}% |"
        if model:
            row += f" {100 * predicted_reduction(r, *model):.0f}% |"
        lines.append(row + f" {_pct_range(*post_hit)} | {_pct_range(*post_red)} |")
    return "\n".join(lines)
