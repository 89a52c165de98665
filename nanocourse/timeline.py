"""Chapter 07's step timeline: what the scheduler decided at every step of a real engine run.

`watch(engine)` observes the engine through its public step observers, so every `engine.step()` inside the
block leaves a `StepRecord` read from the real SchedulerOutput and the real pool, whoever steps it (`record_run`
below, or a server's engine loop in chapter 15): which requests ran and how many tokens each took (split into
prefill, recompute and decode), who was admitted and how much the prefix cache spared them, who was preempted,
and how many KV blocks the step held. `plot_timeline` draws the records as stacked bars; `StepTimeline` adds a
slider that shows one step in detail.
"""

from __future__ import annotations

import html
import io
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import ipywidgets as widgets
import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from nanocourse.live import show_view
from nanocourse.pool_map import _id_order, request_color
from nanoengine.outputs import RequestOutput

TIMELINE_FIGSIZE = (6, 3.5)
FIGURE_DPI = 80  # the static figures' resolution; the widget draws at twice it for sharp lines

KIND_COLORS = {"prefill": "#4e79a7", "recompute": "#e15759", "decode": "#59a14f"}


@dataclass(frozen=True, slots=True)
class Slice:
    """One request's share of one step: positions [start, start + num_tokens) of its tokens.

    goal is the request's num_tokens when the step was planned: the count its computed tokens are
    catching up with. Invariant: prefill + recompute + decode == num_tokens <= goal - start.
    Recompute covers positions this request had computed before a preemption threw its KV away;
    decode is the newest sampled token (0 or 1).
    """

    req_id: str
    start: int
    num_tokens: int
    goal: int
    prefill: int
    recompute: int
    decode: int


@dataclass(frozen=True, slots=True)
class Admission:
    req_id: str
    num_tokens: int  # the request's tokens at admission (prompt, plus outputs for a readmission)
    cached_tokens: int  # of those, the ones the prefix cache spared
    readmitted: bool  # the request had been preempted before


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One engine step as the scheduler planned it.

    Invariants (checked by the tests against the engine): sum of slice tokens == total <= budget;
    slices follow the SchedulerOutput's order (running requests first, then admissions); a step
    that preempted admits nobody. Block counts are read right after schedule(), when this step's
    blocks are allocated and before finished requests free theirs.
    """

    step: int
    budget: int
    slices: tuple[Slice, ...]
    admitted: tuple[Admission, ...]
    preempted: tuple[str, ...]
    finished: tuple[str, ...]
    running_before: tuple[str, ...]  # scheduler.running when the step began, oldest first
    waiting_after: tuple[str, ...]  # the waiting queue once the step was planned, head first
    blocks_held: int
    blocks_cached_free: int  # free blocks that still carry a hash (a later request can hit them)
    num_blocks: int  # usable blocks (the null block excluded)
    cache_queries: int  # prefix-cache lookups this step, in tokens (first admissions)
    cache_hits: int
    readmit_queries: int  # the same, for requests readmitted after preemption
    readmit_hits: int
    seconds: float = field(compare=False)
    started: float = field(compare=False)  # time.perf_counter() when the step began

    @property
    def total(self) -> int:
        return sum(s.num_tokens for s in self.slices)

    def tokens(self, kind: str) -> int:
        return sum(getattr(s, kind) for s in self.slices)

    @property
    def kv_usage(self) -> float:
        return self.blocks_held / self.num_blocks


@dataclass(slots=True)
class Run:
    records: list[StepRecord]
    outputs: dict[str, RequestOutput]  # by request id
    req_ids: list[str]  # in arrival order

    def preemptions(self) -> list[tuple[int, str]]:
        return [(r.step, rid) for r in self.records for rid in r.preempted]

    def total(self, kind: str) -> int:
        return sum(r.tokens(kind) for r in self.records)

    def first_token_step(self, req_id: str) -> int:
        """The step whose forward pass sampled the request's first token: the first time its
        computed tokens caught up with its goal."""
        return next(
            r.step for r in self.records for s in r.slices if s.req_id == req_id and s.start + s.num_tokens == s.goal
        )


def split_kinds(start: int, num_tokens: int, high_water: int, num_prompt_tokens: int) -> tuple[int, int, int]:
    """(prefill, recompute, decode) for positions [start, start + num_tokens) of a request that once
    had `high_water` tokens computed and has a `num_prompt_tokens`-token prompt."""
    end = start + num_tokens
    recompute = max(0, min(end, high_water) - start)
    fresh_from = max(start, high_water)
    prefill = max(0, min(end, num_prompt_tokens) - fresh_from)
    return prefill, recompute, num_tokens - recompute - prefill


class _Recorder:
    """A StepObserver: reads each SchedulerOutput and the pool it left, then the step's results, and appends the
    step's StepRecord to `records` (numbered from 0, the first step it saw)."""

    def __init__(self) -> None:
        self.high_water: dict[str, int] = {}
        self.draft: dict | None = None
        self.records: list[StepRecord] = []

    def on_schedule(self, scheduler, so, running_before) -> None:
        slices = []
        for req_id, n in so.num_scheduled_tokens.items():
            request = scheduler.requests[req_id]
            start = request.num_computed_tokens - n  # schedule() has already advanced it
            high = self.high_water.get(req_id, 0)
            kinds = split_kinds(start, n, high, request.num_prompt_tokens)
            slices.append(Slice(req_id, start, n, request.num_tokens, *kinds))
            self.high_water[req_id] = max(high, start + n)
        pool = scheduler.kv_cache_manager.block_pool
        self.draft = {
            "budget": scheduler.config.max_num_batched_tokens,
            "slices": tuple(slices),
            "admitted": tuple(
                Admission(
                    d.req_id,
                    len(d.prefill_token_ids),
                    d.num_computed_tokens,
                    scheduler.requests[d.req_id].num_preemptions > 0,
                )
                for d in so.scheduled_new_reqs
            ),
            "preempted": tuple(sorted(so.preempted_req_ids, key=_id_order)),
            "running_before": running_before,
            "waiting_after": tuple(r.request_id for r in scheduler.waiting),  # in the order they will be admitted
            "blocks_held": pool.num_gpu_blocks - 1 - pool.get_num_free_blocks(),
            "blocks_cached_free": sum(
                b.ref_cnt == 0 and b.block_hash is not None and not b.is_null for b in pool.blocks
            ),
            "num_blocks": pool.num_gpu_blocks - 1,
        }

    def on_step(self, so, finished, stats, seconds) -> None:
        self.draft.update(
            finished=tuple(o.request_id for o in finished),
            seconds=seconds,
            started=time.perf_counter() - seconds,
            cache_queries=stats.queries if stats else 0,
            cache_hits=stats.hits if stats else 0,
            readmit_queries=stats.preempted_queries if stats else 0,
            readmit_hits=stats.preempted_hits if stats else 0,
        )
        self.records.append(StepRecord(step=len(self.records), **self.draft))


Arrival = tuple  # (prompt_token_ids, SamplingParams) or (prompt_token_ids, SamplingParams, priority)


@contextmanager
def watch(engine) -> Iterator[list[StepRecord]]:
    """Record every step `engine` takes inside the block, whoever steps it: the list yielded gets each step's
    StepRecord as the step ends (numbered from 0). The engine calls its observers in the thread that steps it, so
    a server's engine loop fills the list while the caller reads it. The observer leaves with the block."""
    recorder = _Recorder()
    engine.observers.append(recorder)
    try:
        yield recorder.records
    finally:
        engine.observers.remove(recorder)


def record_run(engine, arrivals: dict[int, Iterable[Arrival]], max_steps: int = 1000) -> Run:
    """Run the engine until every request is done and record every step.

    arrivals[k] joins just before step k (counting from 0); if the engine falls idle first, the next
    arrivals join at once. The observer leaves with the run.
    """
    pending = {k: list(v) for k, v in arrivals.items()}
    outputs, req_ids = {}, []
    with watch(engine) as records:
        while (pending or engine.has_unfinished_requests()) and len(records) < max_steps:
            key = len(records) if engine.has_unfinished_requests() else min(pending)
            for token_ids, params, *priority in pending.pop(key, ()):
                req_ids.append(engine.add_request(list(token_ids), params, priority=priority[0] if priority else 0))
            finished = engine.step()
            outputs.update((o.request_id, o) for o in finished)
    return Run(records, outputs, req_ids)


# ---- text -------------------------------------------------------------------------------------
def slice_text(s: Slice) -> str:
    parts = [f"{k} {getattr(s, k)}" for k in ("prefill", "recompute", "decode") if getattr(s, k)]
    return f"r{s.req_id}:{s.num_tokens} ({', '.join(parts) or 'nothing'})"


def step_line(r: StepRecord) -> str:
    """One line: the step's tokens per request, admissions, preemptions and KV blocks held."""
    ran = " ".join(f"r{s.req_id}:{s.num_tokens}" for s in r.slices) or "-"
    extra = [f"+r{a.req_id}" + (f"(cache {a.cached_tokens})" if a.cached_tokens else "") for a in r.admitted]
    extra += [f"PREEMPT r{p}" for p in r.preempted]
    extra += [f"done r{f}" for f in r.finished]
    return f"step {r.step:3d} | {r.total:4d}/{r.budget} | KV {r.blocks_held:3d}/{r.num_blocks} | {ran}" + (
        " | " + " ".join(extra) if extra else ""
    )


def timeline_text(records: Iterable[StepRecord]) -> str:
    return "\n".join(step_line(r) for r in records)


def step_detail(r: StepRecord) -> list[str]:
    """Everything recorded about one step, as lines of text (what the widget's panel shows)."""
    lines = [
        (
            f"step {r.step}: {r.total} of {r.budget} budget tokens "
            f"(prefill {r.tokens('prefill')}, recompute {r.tokens('recompute')}, decode {r.tokens('decode')})"
        ),
        "running when it began: " + (" ".join(f"r{x}" for x in r.running_before) or "none"),
    ]
    lines += [f"  {slice_text(s)}: positions {s.start}..{s.start + s.num_tokens - 1} of {s.goal}" for s in r.slices]
    for a in r.admitted:
        lines.append(
            f"admitted r{a.req_id}"
            + (" again after preemption" if a.readmitted else "")
            + f": {a.cached_tokens} of its {a.num_tokens} tokens from the prefix cache"
        )
    if r.preempted:
        lines.append(
            "preempted (blocks freed, back to the waiting queue's front): " + " ".join(f"r{p}" for p in r.preempted)
        )
    if r.finished:
        lines.append("finished: " + " ".join(f"r{f}" for f in r.finished))
    lines.append(
        f"KV: {r.blocks_held} of {r.num_blocks} blocks held ({r.kv_usage:.0%}), "
        f"{r.blocks_cached_free} free blocks still cached"
    )
    lines.append("waiting after planning: " + (" ".join(f"r{x}" for x in r.waiting_after) or "none"))
    return lines


# ---- plot -------------------------------------------------------------------------------------
def plot_timeline(
    records: list[StepRecord], color_by: str = "kind", highlight: int | None = None, title: str | None = None
):
    """Stacked bars of tokens per step (by kind or by request) over KV blocks held; red marks
    preemptions. Returns the figure; the caller shows or closes it."""
    fig, (ax, ax_kv) = plt.subplots(
        2, 1, figsize=TIMELINE_FIGSIZE, dpi=FIGURE_DPI, sharex=True, gridspec_kw={"height_ratios": [3, 1.2]}
    )
    steps = [r.step for r in records]
    if color_by == "kind":
        bottom = [0] * len(records)
        for kind, color in KIND_COLORS.items():
            heights = [r.tokens(kind) for r in records]
            ax.bar(steps, heights, bottom=bottom, color=color, width=0.85, label=kind)
            bottom = [b + h for b, h in zip(bottom, heights)]
        ax.legend(loc="upper right", fontsize=7, ncol=3, frameon=False)
    else:
        for r in records:
            base = 0
            for s in r.slices:
                ax.bar(
                    r.step,
                    s.num_tokens,
                    bottom=base,
                    color=request_color(s.req_id),
                    width=0.85,
                    edgecolor="white",
                    linewidth=0.3,
                )
                base += s.num_tokens
        req_ids = sorted({s.req_id for r in records for s in r.slices}, key=_id_order)
        ax.legend(
            handles=[Patch(color=request_color(rid), label=f"r{rid}") for rid in req_ids],
            loc="upper right",
            fontsize=7,
            ncol=min(len(req_ids), 6) or 1,
            frameon=False,
        )
    budget = records[0].budget if records else 0
    ax.axhline(budget, color="#555", linestyle="--", linewidth=0.8)
    ax.text(steps[0] if steps else 0, budget, "budget", va="bottom", fontsize=7, color="#555")
    for step in [r.step for r in records if r.preempted]:
        ax.plot(step, budget * 1.08, "x", color="#d62728", markersize=6)
    ax.set_ylim(0, budget * 1.45 if budget else 1)  # headroom above the budget for the legend and the crosses
    ax.set_ylabel("tokens", fontsize=8)
    num_blocks = records[0].num_blocks if records else 1
    ax_kv.fill_between(steps, [r.blocks_held for r in records], step="mid", color="#999", alpha=0.6)
    ax_kv.axhline(num_blocks, color="#555", linestyle="--", linewidth=0.8)
    ax_kv.set_ylim(0, num_blocks * 1.15)
    ax_kv.set_ylabel("KV blocks", fontsize=8)
    ax_kv.set_xlabel("engine step (x: a preemption)", fontsize=8)
    for a in (ax, ax_kv):
        a.tick_params(labelsize=7)
        if highlight is not None:
            a.axvspan(highlight - 0.5, highlight + 0.5, color="#ffd54f", alpha=0.5, zorder=0)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def figure_png(fig, scale: int = 2) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=FIGURE_DPI * scale)
    plt.close(fig)
    return buf.getvalue()


class StepTimeline:
    """The recorded run as a chart, a step slider and a details panel.

    Moving the slider (or calling `select(k)`) highlights step k and lists what the scheduler did
    in it; the "color by" buttons switch the bars between token kinds and requests. The chart is a
    PNG in an Image widget, so it renders the same in JupyterLab, nbconvert and tests.
    """

    def __init__(self, run: Run, title: str | None = None):
        self.run, self.title = run, title
        last = max(len(run.records) - 1, 0)
        self.slider = widgets.IntSlider(value=0, min=0, max=last, description="step", continuous_update=False)
        self.color_by = widgets.ToggleButtons(options=["kind", "request"], value="kind", description="color by")
        # Drawn at 2x and shown at the static figure's size, so a high-density screen gets sharp lines.
        self.image = widgets.Image(format="png", width=str(int(TIMELINE_FIGSIZE[0] * FIGURE_DPI)))
        self.details = widgets.HTML()
        self.slider.observe(lambda _: self.refresh(), names="value")
        self.color_by.observe(lambda _: self.refresh(), names="value")
        self.widget = widgets.VBox([widgets.HBox([self.slider, self.color_by]), self.image, self.details])
        self.refresh()

    @property
    def record(self) -> StepRecord:
        return self.run.records[self.slider.value]

    def select(self, step: int) -> None:
        self.slider.value = step

    def refresh(self) -> None:
        fig = plot_timeline(self.run.records, self.color_by.value, self.slider.value, self.title)
        self.image.value = figure_png(fig)
        self.details.value = "<pre style='font-size:11px;margin:0'>" + html.escape(self.text()) + "</pre>"

    def text(self) -> str:
        return "\n".join(step_detail(self.record))

    def _ipython_display_(self) -> None:
        show_view(self)


# ---- phases: when each step was planned, run and taken (chapter 08's async scheduling) ------------------------
@dataclass(frozen=True, slots=True)
class StepPhases:
    """When one engine step's parts happened, in time.perf_counter() seconds: `planned` when schedule() returned,
    the forward pass from `forward_start` to `forward_end` (in whichever thread ran it), and `taken` when its
    output had gone through update_from_output and the text. Invariant: planned <= forward_start < forward_end
    <= taken. Steps are numbered from 0 in the order they were planned."""

    step: int
    tokens: int
    planned: float
    forward_start: float
    forward_end: float
    taken: float


class _PhaseRecorder:
    """A StepObserver plus a wrapper of the runner's execute_model, both keyed by the SchedulerOutput's id."""

    def __init__(self, execute_model) -> None:
        self.execute_model = execute_model
        self.times: dict[int, dict[str, float]] = {}  # the steps planned whose output is not taken yet
        self.phases: list[StepPhases] = []
        self.num_planned = 0

    def on_schedule(self, scheduler, so, running_before) -> None:
        self.times[id(so)] = {"step": self.num_planned, "planned": time.perf_counter()}
        self.num_planned += 1

    def timed_execute_model(self, so):
        start = time.perf_counter()
        try:
            return self.execute_model(so)
        finally:
            self.times[id(so)].update(forward_start=start, forward_end=time.perf_counter())

    def on_step(self, so, finished, stats, seconds) -> None:
        t = self.times.pop(id(so))
        self.phases.append(StepPhases(tokens=so.total_num_scheduled_tokens, taken=time.perf_counter(), **t))
        self.phases.sort(key=lambda p: p.step)


@contextmanager
def watch_phases(engine) -> Iterator[list[StepPhases]]:
    """Record when each step `engine` takes inside the block was planned, run and taken: the list yielded gets a
    StepPhases as each step's output is taken. The forward pass is timed by wrapping this engine's
    runner.execute_model (the engine looks it up at every step, in its execute thread too); both leave with
    the block."""
    recorder = _PhaseRecorder(engine.runner.execute_model)
    engine.runner.execute_model = recorder.timed_execute_model
    engine.observers.append(recorder)
    try:
        yield recorder.phases
    finally:
        engine.observers.remove(recorder)
        del engine.runner.execute_model  # the instance attribute goes; the class's method shows again


def phases_text(phases: Iterable[StepPhases]) -> str:
    """One line per step, times in ms from the first step's planning."""
    phases = list(phases)
    t0 = phases[0].planned if phases else 0.0
    ms = lambda t: f"{(t - t0) * 1000:7.1f}"
    return "\n".join(
        f"step {p.step:2d} ({p.tokens:3d} tokens) | planned {ms(p.planned)} | forward {ms(p.forward_start)} .."
        f" {ms(p.forward_end)} | output taken {ms(p.taken)}"
        for p in phases
    )


def plot_phases(runs: dict[str, list[StepPhases]]):
    """One row of steps per run (a title each), on a shared time axis in ms: a bar for each forward pass, a dot
    where the step was planned and a cross where its output was taken. Returns the figure."""
    fig, axes = plt.subplots(len(runs), 1, figsize=(7, 1.2 + 1.3 * len(runs)), dpi=FIGURE_DPI, sharex=True)
    for ax, (title, phases) in zip(axes if len(runs) > 1 else [axes], runs.items()):
        t0 = phases[0].planned
        for p in phases:
            y = -p.step
            ax.barh(
                y,
                (p.forward_end - p.forward_start) * 1000,
                left=(p.forward_start - t0) * 1000,
                height=0.6,
                color=KIND_COLORS["decode" if p.step else "prefill"],
            )
            ax.plot((p.planned - t0) * 1000, y, "o", color="#333", markersize=4)
            ax.plot((p.taken - t0) * 1000, y, "x", color="#d62728", markersize=6)
        ax.set_yticks([-p.step for p in phases], [f"step {p.step}" for p in phases], fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=7)
    (axes[-1] if len(runs) > 1 else axes).set_xlabel(
        "ms (dot: planned, bar: forward pass, x: output taken)", fontsize=8
    )
    fig.tight_layout()
    return fig
