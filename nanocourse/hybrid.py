"""Chapter 12's views of a hybrid model's KV cache, read from the engine's live objects.

`WindowTableView` runs one request on the tiny hybrid model (three sliding layers to one full): Step
runs one engine step, and the view shows each KV cache group's block table as the manager holds it,
with the null block where the window has moved on. `block_trace` records the blocks each group holds
step by step, `plot_block_traces` draws them. `cache_blocks_at` and `traced_hit` set up and watch the
hybrid coordinator's fixed point on a pool of our choosing.
"""

from __future__ import annotations

import html
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import ipywidgets as widgets

from nanocourse.live import show_view
from nanoengine.config import LlamaConfig
from nanoengine.core import BlockHash, BlockPool, HybridKVCacheCoordinator
from nanoengine.entrypoints.llm import LLM
from nanoengine.model import LlamaForCausalLM
from nanoengine.sampling_params import SamplingParams


def tiny_hybrid_llm(window: int, block_size: int, seed: int = 0, **kwargs) -> LLM:
    """The tiny hybrid model (layers 0-2 slide over `window` tokens, layer 3 is full) with random weights."""
    model = LlamaForCausalLM.random(LlamaConfig.tiny_hybrid(window, max_position_embeddings=4096), seed=seed, std=0.2)
    return LLM(model, block_size=block_size, progress=False, **kwargs)


def group_label(llm: LLM, group_id: int) -> str:
    group = llm.kv_cache.groups[group_id]
    kind = "full attention" if group.sliding_window is None else f"window {group.sliding_window}"
    return f"group {group_id} · {kind} · layer {', '.join(map(str, group.layer_ids))}"


# ---- the table view ---------------------------------------------------------------------------
_CELL = (
    "display:inline-block;width:30px;margin:1px;padding:3px 0;text-align:center;font:11px monospace;border-radius:3px;"
)
_STYLE = {
    "null": "background:#d9d9d9;color:#777",
    "held": "background:#9ecae1",
    "new": "background:#74c476",
    "freed": "background:#d9d9d9;color:#777;outline:2px solid #de2d26",
}
_LEGEND = (
    "<div style='font:11px sans-serif;margin-top:4px'>"
    + " ".join(
        f"<span style='{_CELL}{_STYLE[k]}'>{label}</span> {text}"
        for k, label, text in (
            ("held", "7", "a block held"),
            ("new", "7", "allocated this step"),
            ("null", "∅", "the null block (id 0)"),
            ("freed", "∅", "freed this step: left the window"),
        )
    )
    + "</div>"
)


class WindowTableView:
    """One request on the tiny hybrid model, step by step: each KV cache group's block table.

    `step()`, `reset()` and the buttons drive it; `text()` is the same picture in plain text. The
    tables are the group managers' own lists (`kv_cache_manager.coordinator.single_type_managers[g].req_to_blocks`),
    so a freed block is the null block there; the model runner's table keeps the old id, which no query reads.
    """

    def __init__(self, window: int = 8, block_size: int = 4, prompt_tokens: int = 10, max_tokens: int = 22):
        self.window, self.block_size = window, block_size
        self.prompt = random.Random(0).choices(range(3, 256), k=prompt_tokens)
        self.max_tokens = max_tokens
        self.step_button = widgets.Button(description="Step", button_style="primary", tooltip="one engine step")
        self.steps_button = widgets.Button(description="Step ×5", tooltip="five engine steps")
        self.reset_button = widgets.Button(description="Reset", tooltip="start the request again")
        self.step_button.on_click(lambda _: self.step())
        self.steps_button.on_click(lambda _: self.step(5))
        self.reset_button.on_click(lambda _: self.reset())
        self.tables = widgets.HTML()
        self.widget = widgets.VBox(
            [widgets.HBox([self.step_button, self.steps_button, self.reset_button]), self.tables, widgets.HTML(_LEGEND)]
        )
        self.reset()

    def reset(self) -> None:
        self.llm = tiny_hybrid_llm(self.window, self.block_size, num_gpu_blocks_override=64)
        self.req_id = self.llm.engine.add_request(
            self.prompt, SamplingParams(temperature=0, max_tokens=self.max_tokens, ignore_eos=True)
        )
        self.num_steps, self.before = 0, self.rows()
        self.refresh()

    @property
    def done(self) -> bool:
        return not self.llm.engine.has_unfinished_requests()

    def step(self, n: int = 1) -> None:
        for _ in range(n):
            if self.done:
                break
            self.before = self.rows()
            self.llm.engine.step()
            self.num_steps += 1
        self.refresh()

    def rows(self) -> list[list[int]]:
        """Each group's block ids for the request (0: the null block)."""
        managers = self.llm.engine.kv_cache_manager.coordinator.single_type_managers
        return [[b.block_id for b in m.req_to_blocks.get(self.req_id, [])] for m in managers]

    def computed(self) -> int:
        request = self.llm.engine.scheduler.requests.get(self.req_id)
        return request.num_computed_tokens if request else len(self.prompt) + self.max_tokens

    def _cell(self, block_id: int, old: list[int], i: int) -> str:
        was = old[i] if i < len(old) else None
        kind = ("freed" if was not in (None, 0) else "null") if block_id == 0 else ("new" if was is None else "held")
        return f"<span style='{_CELL}{_STYLE[kind]}'>{'∅' if block_id == 0 else block_id}</span>"

    def refresh(self) -> None:
        pool = self.llm.engine.kv_cache_manager.block_pool
        parts = [f"<div style='font:12px sans-serif'><b>{html.escape(self.status())}</b></div>"]
        for g, (row, old) in enumerate(zip(self.rows(), self.before)):
            cells = "".join(self._cell(b, old, i) for i, b in enumerate(row)) or "<i>none</i>"
            parts.append(
                f"<div style='font:11px sans-serif;margin-top:3px'>{html.escape(group_label(self.llm, g))}"
                f"</div><div>{cells}</div>"
            )
        parts.append(
            f"<div style='font:11px monospace;margin-top:4px'>pool: {pool.get_num_free_blocks()} of "
            f"{pool.num_gpu_blocks - 1} blocks free</div>"
        )
        self.tables.value = "".join(parts)
        self.step_button.disabled = self.steps_button.disabled = self.done

    def status(self) -> str:
        c, w = self.computed(), self.window
        if self.done:
            return f"step {self.num_steps}: finished after {c} tokens; every block is back in the pool"
        if not self.num_steps:
            return "step 0: the request waits; the first Step runs its whole prompt (the prefill)"
        gone = max(0, c - w + 1) // self.block_size
        freed = self.rows()[-1].count(0)
        when = "already freed" if freed == gone else "the next step's allocate_slots frees them"
        behind = (
            f"the first {gone} block{'s' * (gone != 1)} of each sliding group lie{'s' * (gone == 1)} wholly "
            f"behind it ({when})"
            if gone
            else "no block lies wholly behind it"
        )
        return f"step {self.num_steps}: {c} tokens computed; the next query, at position {c}, sees {max(0, c - w + 1)}..{c}; {behind}"

    def text(self) -> str:
        lines = [self.status()]
        for g, row in enumerate(self.rows()):
            lines.append(f"{group_label(self.llm, g):36} " + " ".join("∅" if b == 0 else str(b) for b in row))
        return "\n".join(lines)

    def _ipython_display_(self) -> None:
        show_view(self)


# ---- blocks held over a long generation -------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TracePoint:
    tokens: int  # the request's tokens after the step
    full: int  # blocks the full-attention group holds
    sliding: int  # non-null blocks one sliding group holds
    in_use: int  # blocks the pool has handed out, all groups together


def block_trace(llm: LLM, prompt: Sequence[int], max_tokens: int) -> list[TracePoint]:
    """Serve one request and record, after every step, what each kind of group holds and what the pool
    has handed out (they must agree: the pool is the only source of blocks)."""
    engine, kv = llm.engine, llm.engine.kv_cache_manager
    req_id = engine.add_request(list(prompt), SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    pool, points = kv.block_pool, []
    while engine.has_unfinished_requests():
        engine.step()
        request = engine.scheduler.requests.get(req_id)
        if request is None:
            break
        full, sliding = (
            sum(not b.is_null for b in m.req_to_blocks[req_id]) for m in kv.coordinator.single_type_managers[:2]
        )
        points.append(
            TracePoint(request.num_tokens, full, sliding, pool.num_gpu_blocks - 1 - pool.get_num_free_blocks())
        )
    return points


def plot_block_traces(traces: dict[int, list[TracePoint]], block_size: int):
    """Blocks held against tokens: the full group's line, and one sliding group's per window."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    first = next(iter(traces.values()))
    ax.plot([p.tokens for p in first], [p.full for p in first], color="black", label="full attention group")
    for (window, points), color in zip(traces.items(), ("tab:blue", "tab:orange", "tab:green", "tab:red")):
        ax.plot(
            [p.tokens for p in points], [p.sliding for p in points], color=color, label=f"sliding group, W={window}"
        )
        ax.axhline(-(-window // block_size) + 1, color=color, linestyle=":", linewidth=1)
    ax.set_xlabel("tokens in the request")
    ax.set_ylabel(f"blocks held ({block_size} tokens each)")
    ax.set_title("One request on the tiny hybrid: dotted lines are ceil(W / block size) + 1")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# ---- the coordinator on a pool of our choosing ------------------------------------------------
class _Hashes:
    """What cache_full_blocks reads from a request: its id and block hashes."""

    lora_name = None

    def __init__(self, block_hashes: Sequence[BlockHash]):
        self.request_id, self.block_hashes = "finished", block_hashes


def cache_blocks_at(
    pool: BlockPool, group_id: int, indices: Iterable[int], block_hashes: Sequence[BlockHash], block_size: int
) -> None:
    """Leave a free cached block under block_hashes[i] in group_id for each index i, as a finished
    request's blocks are left: hashed, ref_cnt 0, evictable."""
    request = _Hashes(block_hashes)
    for i in indices:
        (block,) = pool.get_new_blocks(1)
        pool.cache_full_blocks(request, [None] * i + [block], i, i + 1, block_size, kv_cache_group_id=group_id)
        pool.free_blocks([block])


def traced_hit(coordinator: HybridKVCacheCoordinator, block_hashes: Sequence[BlockHash], max_length: int):
    """coordinator.find_longest_cache_hit, with every search it makes: (hit blocks, one list per group; hit
    tokens; the searches as (group ids, max tokens in, tokens out))."""
    calls = []
    for manager in coordinator.single_type_managers:
        search = manager.find_longest_cache_hit

        def traced(hashes, length, group_ids, search=search):
            found = search(hashes, length, group_ids)
            calls.append((tuple(group_ids), length, len(found[0]) * coordinator.block_size))
            return found

        manager.find_longest_cache_hit = traced
    try:
        hits, length = coordinator.find_longest_cache_hit(list(block_hashes), max_length)
    finally:
        for manager in coordinator.single_type_managers:
            del manager.find_longest_cache_hit
    return hits, length, calls
