"""Chapter 15's views of a served engine: the running batch step by step, and the server's /metrics.

The steps come from `nanocourse.timeline.watch(llm.engine)`: the server's engine loop steps the engine in its own
thread, and every step leaves chapter 07's StepRecord, read from the real SchedulerOutput and pool.

    batch_changes(records) -> list[BatchChange]
        Per step, who arrived and waits, who joined the running batch (admitted), who left it and why: finished
        in the step, preempted in it, or gone before the next step without either (aborted between steps: the
        engine removes a request between steps only then). A request still there after the last record has not
        left.
    batch_text(records) -> str
        One line for each step whose batch or waiting queue changed: chapter 07's step line, the waiting queue,
        who was aborted.
    plot_batch(records, max_num_seqs=None) -> Figure
        One row per request (waiting, prefill, decode at each step; where it finished or was aborted) over the
        running and waiting counts per step.
    step_gaps(records) -> list[float]
        Seconds between each step's end and the next one's start: what the loop around the engine costs per step
        while requests keep it busy (an idle engine's wait for work counts too).
    scrape(url) -> dict[str, Metric]
        GET {url}/metrics, parsed by prometheus_client; families by name (a counter's without its _total).
    gauge(families, name) -> float; histogram(families, name) -> Histogram
        A single-sample family's value; a histogram's count, sum, mean and quantiles (interpolated in its buckets
        as Prometheus' histogram_quantile does).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import httpx
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from nanocourse.pool_map import _id_order
from nanocourse.timeline import FIGURE_DPI, KIND_COLORS, StepRecord, step_line

WAITING_COLOR = "#d9d9d9"
ABORT_COLOR = "#d62728"


@dataclass(frozen=True, slots=True)
class BatchChange:
    """What changed in the running batch at one step. queued: arrived since the step before and left waiting by
    this one; joined: admitted in it; finished and preempted: left in it; aborted: ran or waited in it and were
    gone before the next step, neither finished nor preempted."""

    step: int
    queued: tuple[str, ...]
    joined: tuple[str, ...]
    finished: tuple[str, ...]
    preempted: tuple[str, ...]
    aborted: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.queued or self.joined or self.finished or self.preempted or self.aborted)


def _present(r: StepRecord) -> set[str]:
    """The requests the scheduler held once step r was planned: running (scheduled) or waiting."""
    return {s.req_id for s in r.slices} | set(r.running_before) | set(r.waiting_after)


def batch_changes(records: list[StepRecord]) -> list[BatchChange]:
    """One BatchChange per record (see the module's docstring)."""
    changes = []
    for before, r, after in zip([None, *records], records, [*records[1:], None]):
        known = set(r.running_before) if before is None else _present(before)
        queued = tuple(x for x in r.waiting_after if x not in known)
        left = set(r.finished) | set(r.preempted)
        gone = () if after is None else tuple(sorted(_present(r) - left - _present(after), key=_id_order))
        joined = tuple(a.req_id for a in r.admitted)
        changes.append(BatchChange(r.step, queued, joined, r.finished, r.preempted, gone))
    return changes


def batch_text(records: list[StepRecord]) -> str:
    """The steps whose batch changed, one line each: chapter 07's step line, then the waiting queue and who was
    gone before the next step."""
    lines = []
    for r, change in zip(records, batch_changes(records)):
        if change:
            waiting = " ".join(f"r{x}" for x in r.waiting_after) or "-"
            aborted = f" | aborted before the next step: {' '.join(f'r{x}' for x in change.aborted)}"
            lines.append(f"{step_line(r)} | waiting {waiting}" + (aborted if change.aborted else ""))
    return "\n".join(lines)


def plot_batch(records: list[StepRecord], max_num_seqs: int | None = None, title: str | None = None) -> Figure:
    """Each request's row: grey while it waits, blue in a step that prefills it, green in one that decodes it,
    a black bar where it finished and a red cross where it was aborted; below, the running and waiting counts per
    step (dashed: max_num_seqs). The caller shows or closes the figure."""
    changes = batch_changes(records)
    req_ids = sorted({x for r in records for x in _present(r)}, key=_id_order)
    row = {rid: i for i, rid in enumerate(req_ids)}
    fig, (ax, ax_n) = plt.subplots(
        2, 1, figsize=(7, 1.6 + 0.28 * len(req_ids)), dpi=FIGURE_DPI, sharex=True,
        gridspec_kw={"height_ratios": [max(2, len(req_ids)), 2.2]},
    )  # fmt: skip
    for r, change in zip(records, changes):
        cells = [(x, WAITING_COLOR) for x in r.waiting_after]
        cells += [(s.req_id, KIND_COLORS["prefill" if s.prefill or s.recompute else "decode"]) for s in r.slices]
        for rid, color in cells:
            ax.barh(row[rid], 1, left=r.step - 0.5, height=0.7, color=color, edgecolor="white", linewidth=0.3)
        for rid in change.finished:
            ax.plot([r.step + 0.5] * 2, [row[rid] - 0.4, row[rid] + 0.4], color="black", linewidth=1.5)
        for rid in change.aborted:
            ax.plot(r.step + 1, row[rid], "x", color=ABORT_COLOR, markersize=7, markeredgewidth=2)
    ax.set_yticks(range(len(req_ids)), [f"r{x}" for x in req_ids])
    ax.set_ylim(len(req_ids) - 0.5, -0.5)  # the first request on top
    ax.legend(
        handles=[
            Patch(color=WAITING_COLOR, label="waiting"),
            Patch(color=KIND_COLORS["prefill"], label="prefill"),
            Patch(color=KIND_COLORS["decode"], label="decode"),
        ],
        loc="lower right", bbox_to_anchor=(1, 1.0), ncol=3, fontsize=7, frameon=False,
    )  # fmt: skip
    steps = [r.step for r in records]
    ax_n.step(steps, [len(r.slices) for r in records], where="mid", color=KIND_COLORS["decode"], label="running")
    ax_n.step(steps, [len(r.waiting_after) for r in records], where="mid", color="#7f7f7f", label="waiting")
    if max_num_seqs is not None:
        ax_n.axhline(max_num_seqs, color="#555", linestyle="--", linewidth=0.8)
        ax_n.text(steps[0] if steps else 0, max_num_seqs, "max_num_seqs", va="bottom", fontsize=7, color="#555")
    ax_n.set_ylim(0, max([max_num_seqs or 0] + [len(r.slices) for r in records]) + 3)  # room for the legend
    ax_n.set_ylabel("requests", fontsize=8)
    ax_n.set_xlabel("engine step (|: finished, x: aborted before that step)", fontsize=8)
    ax_n.legend(loc="upper right", fontsize=7, ncol=2, frameon=False)
    for a in (ax, ax_n):
        a.tick_params(labelsize=7)
    if title:
        ax.set_title(title, fontsize=9, loc="left")
    fig.tight_layout()
    return fig


def step_gaps(records: list[StepRecord]) -> list[float]:
    """Seconds from each step's end to the next one's start."""
    return [b.started - (a.started + a.seconds) for a, b in itertools.pairwise(records)]


# ---- /metrics ---------------------------------------------------------------------------------
def scrape(url: str) -> dict[str, Metric]:
    """The server's /metrics, parsed: metric families by name (a counter's name without _total)."""
    response = httpx.get(f"{url}/metrics", timeout=10)
    response.raise_for_status()
    return {f.name: f for f in text_string_to_metric_families(response.text)}


def gauge(families: dict[str, Metric], name: str) -> float:
    """The value of a gauge or counter with one labelled series (a counter's _total sample)."""
    samples = [s for s in families[name].samples if not s.name.endswith("_created")]
    if len(samples) != 1:
        raise ValueError(f"{name} has {len(samples)} samples; gauge() reads a family with one")
    return samples[0].value


@dataclass(frozen=True, slots=True)
class Histogram:
    """A Prometheus histogram's state: observations counted, their sum, and cumulative counts per upper bound
    (the last bound is +Inf)."""

    count: float
    sum: float
    buckets: tuple[tuple[float, float], ...]

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count else math.nan

    def quantile(self, q: float) -> float:
        """Prometheus' histogram_quantile: the bucket holding rank q * count, interpolated linearly inside it
        (from 0 in the first); the highest finite bound if it falls in +Inf; NaN when nothing was observed."""
        if not 0 <= q <= 1:
            raise ValueError(f"q={q}: a quantile is between 0 and 1")
        if not self.count:
            return math.nan
        rank, lower, below = q * self.count, 0.0, 0.0
        for upper, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(upper):
                    return lower
                return lower + (upper - lower) * (rank - below) / (cumulative - below) if cumulative > below else lower
            lower, below = upper, cumulative
        return lower


def histogram(families: dict[str, Metric], name: str) -> Histogram:
    """The histogram `name` (one labelled series) out of scrape()'s families."""
    samples = families[name].samples
    value = {s.name: s.value for s in samples if not s.name.endswith("_bucket")}
    buckets = sorted((float(s.labels["le"]), s.value) for s in samples if s.name.endswith("_bucket"))
    return Histogram(value[f"{name}_count"], value[f"{name}_sum"], tuple(buckets))
