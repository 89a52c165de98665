"""Chapter 13's views of speculative decoding, read from the engine's live objects.

`record_spec_step(engine, req_id)` runs one real `engine.step()` and keeps, for one request, what the step did:
the drafts the scheduler handed the runner (`SchedulerOutput.scheduled_spec_decode_tokens`), the tokens the
request gained (accepted drafts, then the bonus or recovered token), `num_computed_tokens` as the step began,
after scheduling and after `update_from_output`'s rollback, and the request's block table with its hashed
blocks. `spec_step_html` / `spec_step_text` render one such `SpecStep`; `SpecStepView` is the stepper.
`time_verify_steps` measures a step's time against the tokens it verifies (the speed-up itself is
bench/spec_decode.py's own measure, which chapter 13 runs live through gpu_live.bench_script).
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import ipywidgets as widgets

from nanocourse.live import show_view
from nanoengine.entrypoints.llm import LLM
from nanoengine.request import RequestStatus
from nanoengine.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class SpecStep:
    """One request's share of one engine step, as the engine's own objects held it.

    context: the request's verified tokens as the step began (request.all_token_ids); its last one is the
    step's first input. drafts: the drafts verified (scheduled_spec_decode_tokens), () for a plain step.
    emitted: the tokens appended by update_from_output. block_ids: the request's group-0 block table after
    scheduling (so with the drafts' slots); hashed: how many of its leading blocks had a block hash then.
    """

    step: int
    context: tuple[int, ...]
    drafts: tuple[int, ...]
    emitted: tuple[int, ...]
    scheduled: int
    computed_before: int
    computed_scheduled: int
    computed_after: int
    block_ids: tuple[int, ...]
    hashed: int
    block_size: int
    finished: bool
    seconds: float = 0.0

    @property
    def num_verified(self) -> int:
        """request.num_tokens as the step began: positions below it hold verified tokens."""
        return len(self.context)

    @property
    def accepted(self) -> int:
        """Drafts accepted: the leading drafts the step emitted unchanged (all emitted tokens but the last)."""
        n = 0
        for d, t in zip(self.drafts, self.emitted[:-1]):
            if d != t:
                break
            n += 1
        return n

    @property
    def rejected(self) -> int:
        return len(self.drafts) - self.accepted if self.emitted else 0

    @property
    def extra(self) -> str:
        """What the step's last emitted token is: 'sampled' (no drafts), 'bonus' (every draft accepted, the
        row after the last draft) or 'recovered' (drawn at the first rejection, in the rejected draft's place)."""
        if not self.drafts:
            return "sampled"
        if len(self.emitted) == len(self.drafts) + 1:
            return "bonus"
        return "recovered" if len(self.emitted) == self.accepted + 1 else "cut by a stop"

    @property
    def draft_slots(self) -> range:
        """Positions whose KV slots the step wrote for drafts: past the verified tokens."""
        return range(self.num_verified, self.computed_scheduled)


class _Watch:
    """An engine StepObserver that keeps one request's scheduling facts of the step."""

    def __init__(self, engine, req_id: str):
        self.engine, self.req_id = engine, req_id
        self.drafts, self.scheduled, self.computed, self.blocks, self.hashed = (), 0, None, (), 0

    def on_schedule(self, scheduler, so, running_before) -> None:
        self.scheduled = so.num_scheduled_tokens.get(self.req_id, 0)
        self.drafts = tuple(so.scheduled_spec_decode_tokens.get(self.req_id, ()))
        request = scheduler.requests.get(self.req_id)
        self.computed = request.num_computed_tokens if request is not None else None
        blocks = self.engine.kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks.get(self.req_id, [])
        self.blocks = tuple(b.block_id for b in blocks)
        self.hashed = next((i for i, b in enumerate(blocks) if b.block_hash is None), len(blocks))

    def on_step(self, so, outputs, cache_stats, seconds) -> None:
        pass


def record_spec_step(engine, req_id: str, step: int = 0) -> SpecStep:
    """Run one engine step and return what it did to request req_id (which must not have finished)."""
    request = engine.scheduler.requests[req_id]
    context, before = tuple(request.all_token_ids), request.num_computed_tokens
    watch = _Watch(engine, req_id)
    engine.observers.append(watch)
    start = time.perf_counter()
    try:
        engine.step()
    finally:
        engine.observers.remove(watch)
    seconds = time.perf_counter() - start
    emitted = tuple(request.all_token_ids[len(context) :])
    return SpecStep(
        step,
        context,
        watch.drafts,
        emitted,
        watch.scheduled,
        before,
        before if watch.computed is None else watch.computed,
        request.num_computed_tokens,
        watch.blocks,
        watch.hashed,
        engine.scheduler.block_size,
        RequestStatus.is_finished(request.status),
        seconds,
    )


# ---- rendering -----------------------------------------------------------------------------------
_CELL = (
    "display:inline-block;min-width:26px;margin:1px;padding:3px 3px;text-align:center;font:11px monospace;"
    "border-radius:3px;"
)
_STYLE = {
    "verified": "background:#deebf7",
    "input": "background:#9ecae1;outline:2px solid #3182bd",
    "accepted": "background:#74c476",
    "rejected": "background:#fc9272;text-decoration:line-through",
    "bonus": "background:#bcbddc",
    "recovered": "background:#fdae6b",
    "sampled": "background:#bcbddc",
}
_SLOT = "display:inline-block;width:7px;height:12px;margin:0 1px 0 0;vertical-align:middle;"
_SLOT_STYLE = {
    "verified": "background:#6baed6",
    "accepted": "background:#74c476",
    "stale": "background:#fc9272",
    "empty": "background:#f0f0f0",
}


def _label(token: int, decode: Callable[[int], str] | None) -> str:
    if decode is None:
        return str(token)
    return decode(token).replace(" ", "␣").replace("\n", "⏎") or "∅"


def _tokens_html(s: SpecStep, decode, tail: int) -> str:
    cells = []
    shown = s.context[-tail:]
    for i, t in enumerate(shown):
        kind = "input" if i == len(shown) - 1 else "verified"
        cells.append((kind, t))
    cells += [("accepted" if i < s.accepted else "rejected", d) for i, d in enumerate(s.drafts)]
    span = lambda k, t: f"<span style='{_CELL}{_STYLE[k]}' title='{k}'>{html.escape(_label(t, decode))}</span>"
    row = "".join(span(k, t) for k, t in cells)
    if s.emitted:
        row += (
            " → "
            + "".join(span("accepted", t) for t in s.emitted[:-1])
            + span(s.extra if s.extra in _STYLE else "recovered", s.emitted[-1])
        )
    return f"<div style='margin:4px 0'>{row}</div>"


def _slot_kind(s: SpecStep, pos: int) -> str:
    if pos < min(s.computed_after, s.num_verified):
        return "verified"
    if pos < s.computed_after:
        return "accepted"
    if pos < s.computed_scheduled:
        return "stale" if pos >= s.num_verified else "verified"
    return "empty"


def _blocks_html(s: SpecStep) -> str:
    parts = []
    for i, block_id in enumerate(s.block_ids):
        slots = "".join(
            f"<span style='{_SLOT}{_SLOT_STYLE[_slot_kind(s, p)]}'></span>"
            for p in range(i * s.block_size, (i + 1) * s.block_size)
        )
        holds_draft = any(i * s.block_size <= p < (i + 1) * s.block_size for p in s.draft_slots)
        border = "2px dashed #e6550d" if holds_draft else "1px solid #bbb"
        mark = "#" if i < s.hashed else "&nbsp;"
        parts.append(
            f"<span style='display:inline-block;margin:2px;padding:2px;border:{border};border-radius:3px'>"
            f"<span style='font:10px monospace'>{block_id}{mark}</span><br>{slots}</span>"
        )
    return "<div>" + "".join(parts) + "</div>"


def spec_step_lines(s: SpecStep, decode: Callable[[int], str] | None = None) -> list[str]:
    """The step in words: what was verified, what came out, the three num_computed_tokens and the blocks."""
    lab = lambda ts: " ".join(_label(t, decode) for t in ts) or "-"
    if s.drafts:
        head = (
            f"step {s.step}: verify {len(s.drafts)} drafts [{lab(s.drafts)}] after [{lab(s.context[-1:])}]: "
            f"{s.accepted} accepted, {s.rejected} rejected, then the {s.extra} token [{lab(s.emitted[-1:])}]"
        )
    elif s.computed_before < s.num_verified - 1:
        hit = s.computed_scheduled - s.scheduled - s.computed_before
        cached = f", {hit} more from the prefix cache" if hit else ""
        head = f"step {s.step}: prefill, {s.scheduled} tokens computed{cached}; sampled [{lab(s.emitted)}]"
    else:
        head = f"step {s.step}: plain decode (no drafts), sampled [{lab(s.emitted)}]"
    rollback = s.computed_scheduled - s.computed_after
    slots = s.draft_slots
    lines = [
        head,
        (
            f"  num_computed_tokens: {s.computed_before} before, {s.computed_scheduled} after scheduling "
            f"(+{s.scheduled}), {s.computed_after} after update_from_output (-{rollback}); num_tokens now "
            f"{s.num_verified + len(s.emitted)}"
        ),
        f"  block table {list(s.block_ids)}: draft slots at positions "
        + (
            f"{slots.start}..{slots.stop - 1} in block(s) "
            f"{list(dict.fromkeys(s.block_ids[p // s.block_size] for p in slots))}"
            if slots
            else "none"
        )
        + f"; hashed blocks {s.hashed} (cover {s.hashed * s.block_size} tokens <= {s.num_verified} verified)",
    ]
    if s.finished:
        lines.append("  the request finished at this step")
    return lines


def spec_step_text(s: SpecStep, decode: Callable[[int], str] | None = None) -> str:
    return "\n".join(spec_step_lines(s, decode))


_LEGEND = (
    "<div style='font:11px sans-serif;margin-top:4px'>"
    + " ".join(
        f"<span style='{_CELL}{_STYLE[k]}'>t</span> {text}"
        for k, text in (
            ("input", "last verified token, the step's first input"),
            ("accepted", "draft accepted"),
            ("rejected", "draft rejected"),
            ("bonus", "bonus token (all accepted)"),
            ("recovered", "recovered token (at the rejection)"),
        )
    )
    + "<br>slots: "
    + " ".join(
        f"<span style='{_SLOT}{_SLOT_STYLE[k]}'></span> {text}"
        for k, text in (
            ("verified", "computed, verified"),
            ("accepted", "written as a draft, now verified"),
            ("stale", "written for a rejected draft or the bonus: overwritten next step"),
            ("empty", "free slot"),
        )
    )
    + "; <span style='border:2px dashed #e6550d;padding:0 3px'>dashed</span> a block holding draft slots, "
    "# a hashed (cached) block</div>"
)


def spec_step_html(s: SpecStep, decode: Callable[[int], str] | None = None, tail: int = 6) -> str:
    """One step as HTML, for the widget and for tests: the tokens, the three counts, the block table."""
    lines = spec_step_lines(s, decode)
    body = "".join(
        f"<div style='font:12px monospace;white-space:pre-wrap'>{html.escape(line)}</div>" for line in lines[1:]
    )
    return (
        f"<div style='font:12px sans-serif'><b>{html.escape(lines[0])}</b></div>"
        + _tokens_html(s, decode, tail)
        + body
        + _blocks_html(s)
    )


class SpecStepView:
    """One request under n-gram speculative decoding, step by step: its drafts, which were accepted, and its
    KV slots and num_computed_tokens before, during and after each real engine step.

    `step()`, `reset()`, the buttons and the slider drive it (the slider revisits recorded steps); `text()` is
    the shown step in plain text. Every number is read off the engine (`record_spec_step`)."""

    def __init__(self, llm: LLM, prompt: Sequence[int], max_tokens: int = 40, decode: bool = True):
        self.llm, self.prompt, self.max_tokens = llm, list(prompt), max_tokens
        tokenizer = llm.engine.tokenizer if decode else None
        self.decode = (lambda t: tokenizer.decode([t], skip_special_tokens=False)) if tokenizer else None
        self.step_button = widgets.Button(description="Step", button_style="primary", tooltip="one engine step")
        self.reset_button = widgets.Button(description="Reset", tooltip="start the request again")
        self.slider = widgets.IntSlider(description="show step", min=0, max=0, disabled=True)
        self.step_button.on_click(lambda _: self.step())
        self.reset_button.on_click(lambda _: self.reset())
        self.slider.observe(lambda change: self.refresh(), names="value")
        self.pane = widgets.HTML()
        self.widget = widgets.VBox(
            [widgets.HBox([self.step_button, self.reset_button, self.slider]), self.pane, widgets.HTML(_LEGEND)]
        )
        self.reset()

    def reset(self) -> None:
        if getattr(self, "req_id", None) is not None:  # only this view's request: others may share the engine
            self.llm.engine.abort_request([self.req_id])
        self.req_id = self.llm.engine.add_request(
            self.prompt, SamplingParams(temperature=0, max_tokens=self.max_tokens, ignore_eos=True)
        )
        self.steps: list[SpecStep] = []
        self.refresh()

    @property
    def done(self) -> bool:
        return bool(self.steps) and self.steps[-1].finished

    def step(self, n: int = 1, drafts: list[int] | None = None) -> None:
        """n engine steps; `drafts` replaces the proposer's drafts for the first of them (handed to the scheduler
        through update_draft_token_ids, as the engine hands the proposer's)."""
        for _ in range(n):
            if self.done:
                break
            if drafts is not None:
                self.llm.engine.scheduler.update_draft_token_ids({self.req_id: list(drafts)})
                drafts = None
            self.steps.append(record_spec_step(self.llm.engine, self.req_id, len(self.steps) + 1))
        if self.steps:
            self.slider.max, self.slider.disabled = len(self.steps), False
            self.slider.min = 1
            self.slider.value = len(self.steps)
        self.refresh()

    def run_until(self, predicate: Callable[[SpecStep], bool], max_steps: int = 100) -> SpecStep | None:
        """Step until a step satisfies predicate (returned), or the request ends (None)."""
        for _ in range(max_steps):
            if self.done:
                return None
            self.step()
            if predicate(self.steps[-1]):
                return self.steps[-1]
        return None

    def shown(self) -> SpecStep | None:
        if not self.steps:
            return None
        return self.steps[max(1, min(self.slider.value, len(self.steps))) - 1]

    def refresh(self) -> None:
        s = self.shown()
        self.pane.value = (
            "<div style='font:12px sans-serif'><b>step 0: the request waits; the first Step runs its prompt</b></div>"
            if s is None
            else spec_step_html(s, self.decode)
        )
        self.step_button.disabled = self.done

    def text(self) -> str:
        s = self.shown()
        return "step 0: the request waits" if s is None else spec_step_text(s, self.decode)

    def _ipython_display_(self) -> None:
        show_view(self)


# ---- measurements --------------------------------------------------------------------------------
def time_verify_steps(
    llm: LLM, prompt: Sequence[int], sizes: Sequence[int] = (1, 2, 3, 5, 9, 17), repeats: int = 5
) -> dict[int, float]:
    """The fastest of `repeats` decode steps that feed n tokens of one request (its last token and n - 1 drafts).

    The drafts are handed over through Scheduler.update_draft_token_ids, the seam the proposer uses, and are
    deliberately wrong (so each step rolls back and the context stays put): the time of verifying n tokens does
    not depend on whether they are accepted. The sizes take turns, so a slow spell hits all alike, and the
    fastest run is the step's cost without another process's interference."""
    engine = llm.engine
    req_id = engine.add_request(list(prompt), SamplingParams(temperature=0, max_tokens=10**6, ignore_eos=True))
    record_spec_step(engine, req_id)  # the prefill
    record_spec_step(engine, req_id)  # a first decode step, out of the timings
    times: dict[int, list[float]] = {n: [] for n in sizes}
    try:
        for _ in range(repeats):
            for n in sizes:
                last = engine.scheduler.requests[req_id].all_token_ids[-1]
                engine.scheduler.update_draft_token_ids({req_id: [last] * (n - 1)})
                times[n].append(record_spec_step(engine, req_id).seconds)
    finally:
        engine.abort_request([req_id])
    return {n: min(ts) for n, ts in times.items()}
