"""Chapter 08's six workloads, measured end to end on the real engine.

The workloads and their generators are the engine's benchmark datasets (nanoengine.benchmarks.datasets), and
the measuring is nanoengine.benchmarks.prefix_caching, which bench/workloads.py runs at the "bench" scale;
this module re-exports both under the names the chapter uses, with the chapter's scale "notebook" (the
datasets' "small"). `block_rows` predicts, with the engine's own hasher and KV cache manager but no model,
which blocks of each prompt a sequential run will find cached; `WorkloadExplorer` shows both, block by block.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import ipywidgets as widgets

from nanocourse.live import show_view
from nanoengine.benchmarks import datasets
from nanoengine.benchmarks.datasets import (
    GENERATORS,
    RAG_INSTRUCTIONS,
    SIZES,
    SUMMARY_INSTRUCTION,
    SYSTEM_PROMPT,
    USER_TURNS,
    Workload,
    chatbot,
    code_completion,
    conversations,
    multi_turn,
    prose,
    rag,
    random_prompts,
    summarization,
)
from nanoengine.benchmarks.prefix_caching import (
    BLOG_POST_TABLE,
    SweepPoint,
    WorkloadResult,
    fit_cost_model,
    measure,
    predicted_reduction,
    prefix_sweep,
    results_markdown,
    save_run,
    sweep_cost_model,
    ttft_reduction,
)
from nanoengine.benchmarks.prefix_caching import load_run as _load_run
from nanoengine.core import KVCacheManager, get_request_block_hasher
from nanoengine.request import Request
from nanoengine.sampling_params import SamplingParams

__all__ = [
    "BIKE_SHOP_SYSTEM",
    "BLOG_POST_TABLE",
    "GENERATORS",
    "HIT",
    "NEW",
    "PARTIAL",
    "RAG_INSTRUCTIONS",
    "RECOMPUTED",
    "SCALES",
    "SIZES",
    "STORED_RUN",
    "SUMMARY_INSTRUCTION",
    "SYSTEM_PROMPT",
    "USER_TURNS",
    "RequestBlocks",
    "SamplingParams",
    "SweepPoint",
    "Workload",
    "WorkloadExplorer",
    "WorkloadResult",
    "block_rows",
    "chat_ids",
    "chatbot",
    "code_completion",
    "conversations",
    "fit_cost_model",
    "load_run",
    "longest_shared_prefix",
    "make_workloads",
    "measure",
    "multi_turn",
    "plot_prefix_sweep",
    "plot_workloads",
    "predicted_reduction",
    "prefix_sweep",
    "prose",
    "rag",
    "random_prompts",
    "results_markdown",
    "save_run",
    "sizes",
    "summarization",
    "sweep_cost_model",
    "ttft_reduction",
]

STORED_RUN = Path(__file__).resolve().parents[1] / "bench" / "results" / "workloads_cpu.json"

# The chapter's scales: "notebook" (the datasets' "small") keeps the chapter under a minute on 2 CPU cores;
# "bench" is the one bench/workloads.py runs.
SCALES = ("notebook", "bench")
_DATASET_SCALE = {"notebook": "small", "bench": "bench"}


def sizes(scale: str) -> dict[str, dict]:
    """Each workload's generator arguments at one of the SCALES."""
    return datasets.sizes(_DATASET_SCALE.get(scale, scale))


def make_workloads(tok, scale: str = "notebook", seed: int = 0) -> list[Workload]:
    """The six workloads at one of the SCALES, in the blog post's table order."""
    return datasets.make_workloads(tok, _DATASET_SCALE.get(scale, scale), seed)


def load_run(path: Path = STORED_RUN) -> tuple[list[WorkloadResult], list[SweepPoint], dict]:
    """A run written by save_run (bench/workloads.py): results, sweep, and the rest of the report."""
    return _load_run(path)


BIKE_SHOP_SYSTEM = (
    "You are the help desk of a small bicycle shop in Utrecht. Answer in at most two sentences, "
    "give prices in euros, and suggest a visit to the workshop whenever a repair is needed. "
) * 2


def chat_ids(llm, question: str, system: str = BIKE_SHOP_SYSTEM) -> list[int]:
    """The token ids of one question behind a system prompt, as the model's chat template renders them (chapters
    06 and 13 serve these)."""
    return llm.tokenizer.encode(
        llm.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": question}])
    )


# ---- prediction: the engine's prefix cache without the model -----------------------------------
HIT, RECOMPUTED, NEW, PARTIAL = "hit", "recomputed", "new", "partial"


@dataclass(frozen=True, slots=True)
class RequestBlocks:
    """What a sequential run does with each block of one prompt: HIT (K/V reused), RECOMPUTED (cached,
    but the last-token rule makes the engine compute it again), NEW (computed, then cached) or PARTIAL
    (the unfilled last block: computed, not cached while it is partial)."""

    num_tokens: int
    blocks: tuple[str, ...]
    block_size: int

    @property
    def hit_tokens(self) -> int:
        return self.blocks.count(HIT) * self.block_size


def block_rows(prompts: Sequence[Sequence[int]], block_size: int = 16) -> list[RequestBlocks]:
    """Run the prompts one at a time through a real KVCacheManager large enough never to evict:
    the hits it reports are the num_cached_tokens the engine will report."""
    hasher = get_request_block_hasher(block_size)
    kv = KVCacheManager(block_size, sum(len(p) // block_size + 1 for p in prompts) + 1)
    rows = []
    for i, ids in enumerate(prompts):
        req = Request(str(i), list(ids), block_hasher=hasher)
        hit_blocks, hit = kv.get_computed_blocks(req)
        num_hit, num_full = len(hit_blocks.blocks[0]), len(req.block_hashes)
        statuses = [HIT] * num_hit + [NEW] * (num_full - num_hit) + [PARTIAL] * (len(ids) % block_size > 0)
        # A cached block right after the hit means the num_tokens - 1 cap, not a miss, ended the walk.
        if num_hit < num_full and kv.block_pool.get_cached_block(req.block_hashes[num_hit]):
            statuses[num_hit] = RECOMPUTED
        kv.allocate_slots(req, len(ids) - hit, hit, hit_blocks)
        kv.free(req)
        rows.append(RequestBlocks(len(ids), tuple(statuses), block_size))
    return rows


def longest_shared_prefix(prompts: Sequence[Sequence[int]]) -> list[int]:
    """For each prompt, the most leading tokens it has in common with any earlier prompt: what a cache
    that stored single tokens, with no last-token rule, could skip."""
    return [max((len(os.path.commonprefix([p, q])) for q in prompts[:i]), default=0) for i, p in enumerate(prompts)]


# ---- plots ---------------------------------------------------------------------------------------
def plot_prefix_sweep(points: Sequence[SweepPoint], model: tuple[float, float] | None = None):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=80)
    xs = [p.prefix_tokens for p in points]
    if all(p.off_ms is not None for p in points):
        ax.plot(xs, [p.off_ms for p in points], "s-", color="#c44", label="cache off")
    ax.plot(xs, [p.cold_ms for p in points], "x--", color="#e90", label="cache on, first request (cold)")
    ax.plot(xs, [p.warm_ms for p in points], "o-", color="#4a4", label="cache on, prefix cached")
    if model:
        fixed, per_token = model
        ax.plot(xs, [fixed + per_token * p.prompt_tokens for p in points], ":", color="#888", label="cost model")
    ax.set_xlabel(f"shared prefix (tokens), + {points[0].prompt_tokens - points[0].prefix_tokens}-token suffix")
    ax.set_ylabel("TTFT (ms)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_workloads(results: Sequence[WorkloadResult]):
    """Our hit rate and TTFT reduction per workload, with the blog post's ranges as vertical bars."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=80)
    xs = range(len(results))
    ax.bar([x - 0.2 for x in xs], [100 * r.hit_rate for r in results], 0.4, color="#58a", label="hit rate (ours)")
    ax.bar([x + 0.2 for x in xs], [100 * r.reduction for r in results], 0.4, color="#4a4", label="TTFT p50 cut (ours)")
    for x, r in zip(xs, results):
        (hlo, hhi), (rlo, rhi) = BLOG_POST_TABLE[r.name]
        ax.plot([x - 0.2] * 2, [100 * hlo, 100 * hhi + 0.8], color="k", lw=3)
        ax.plot([x + 0.2] * 2, [100 * rlo, 100 * rhi + 0.8], color="k", lw=3)
    ax.plot([], [], color="k", lw=3, label="the blog post's range")
    ax.set_xticks(list(xs), [r.name for r in results], rotation=20, fontsize=8)
    ax.set_ylabel("%")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# ---- the workload explorer -----------------------------------------------------------------------
_COLORS = {HIT: "#9be39b", RECOMPUTED: "#f2d675", NEW: "#f5b7a8", PARTIAL: "#ddd"}


def _rows_html(tok, workload: Workload, rows: Sequence[RequestBlocks], live: dict[int, int]) -> str:
    out = []
    for i, (ids, row) in enumerate(zip(workload.prompts, rows)):
        size = row.block_size
        cells = "".join(
            f'<td title="{html.escape(tok.decode(ids[b * size : (b + 1) * size]))}" '
            f'style="background:{_COLORS[s]};width:9px;height:14px;border:1px solid #888"></td>'
            for b, s in enumerate(row.blocks)
        )
        seen = f", engine: {live[i]}" if i in live else ""
        out.append(
            f"<tr><th style='text-align:left;padding-right:8px;font-weight:normal;white-space:nowrap'>"
            f"#{i}: {row.num_tokens} tok, {row.hit_tokens} cached{seen}</th>{cells}</tr>"
        )
    legend = " ".join(
        f'<span style="background:{c};padding:0 6px;border:1px solid #888">{s}</span>' for s, c in _COLORS.items()
    )
    return f"<table style='border-collapse:collapse'>{''.join(out)}</table><div>{legend}</div>"


class WorkloadExplorer:
    """Pick a workload; see every request's blocks as a row: green blocks come from the prefix cache,
    red ones are prefilled, amber ones are cached but recomputed (the last-token rule), grey is the
    partial last block. The rows are predicted by the engine's own KV cache manager; the summary shows
    the measurements passed in (no recomputing), and the button re-runs the first requests on the engine."""

    def __init__(
        self,
        tok,
        workloads: Sequence[Workload],
        results: Sequence[WorkloadResult] = (),
        llm=None,
        block_size: int = 16,
        live_requests: int = 3,
    ):
        self.tok, self.block_size, self.llm, self.live_requests = tok, block_size, llm, live_requests
        self.workloads = {w.name: w for w in workloads}
        self.results = {r.name: r for r in results}
        self.choice = widgets.Dropdown(options=[(w.title, w.name) for w in workloads], description="Workload")
        self.button = widgets.Button(
            description=f"Re-run first {live_requests} on the engine", disabled=llm is None, layout={"width": "auto"}
        )
        self.view, self.summary = widgets.HTML(), widgets.HTML()
        self.choice.observe(lambda _: self.refresh(), names="value")
        self.button.on_click(lambda _: self.remeasure())
        self.widget = widgets.VBox([widgets.HBox([self.choice, self.button]), self.view, self.summary])
        self.refresh()

    @property
    def workload(self) -> Workload:
        return self.workloads[self.choice.value]

    def refresh(self, live: dict[int, int] | None = None, live_ttft: Sequence[float] = ()) -> None:
        self.live = live or {}
        self.rows = block_rows(self.workload.prompts, self.block_size)
        self.predicted_hit_rate = sum(r.hit_tokens for r in self.rows) / sum(r.num_tokens for r in self.rows)
        self.view.value = _rows_html(self.tok, self.workload, self.rows, self.live)
        text = (
            f"<b>{html.escape(self.workload.title)}</b>: shares {html.escape(self.workload.shares)}. "
            f"Predicted hit rate {100 * self.predicted_hit_rate:.1f}%."
        )
        if (r := self.results.get(self.workload.name)) is not None:
            text += (
                f" Measured: hit rate {100 * r.hit_rate:.1f}%, TTFT p50 {r.p50_off_ms:.0f} ms off → "
                f"{r.p50_on_ms:.0f} ms on ({100 * r.reduction:.0f}% less)."
            )
        if live_ttft:
            text += " Re-run TTFTs: " + ", ".join(f"{t:.0f} ms" for t in live_ttft) + "."
        self.summary.value = text

    def remeasure(self) -> None:
        """Run the first requests on the engine from an empty cache; show its num_cached_tokens."""
        self.llm.reset_prefix_cache()
        params = SamplingParams(temperature=0, max_tokens=1)
        outs = [
            self.llm.generate(prompt_token_ids=list(p), sampling_params=params)[0]
            for p in self.workload.prompts[: self.live_requests]
        ]
        self.refresh({i: o.num_cached_tokens for i, o in enumerate(outs)}, [1000 * o.ttft for o in outs])

    def _ipython_display_(self) -> None:
        show_view(self)
