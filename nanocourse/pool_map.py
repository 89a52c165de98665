"""A map of the KV block pool: what every block is doing right now (chapter 02's widget).

`block_states(manager)` reads the real pool: each block's ref count, whether it still carries a
prefix-cache hash, and which requests' block tables point at it (`snapshot_block_states` reads the same from an
EngineState a serving engine took, for the server's live page). `PoolMap` draws those states as a
grid beside each request's block table, and its Step button runs one real engine step.
"""

from __future__ import annotations

import html
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

import ipywidgets as widgets

from nanocourse.live import show_view
from nanoengine.core import KVCacheManager
from nanoengine.engine.engine_state import EngineState

# One color per request id (modulo); the four non-request states get colors no request uses.
_REQUEST_COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#9c755f", "#edc948", "#76b7b2")
_STATE_STYLE = {
    "null": ("#333333", "null block: never given out, stands in where a table has no real block (here: padding)"),
    "shared": ("#ff5fa2", "held by several requests (ref_cnt > 1)"),
    "cached": ("#c7e9c0", "free, hash kept: a request with the same prefix can take it back"),
    "free": ("#f2f2f2", "free, no hash"),
}


@dataclass(frozen=True, slots=True)
class BlockState:
    """One block as the pool sees it.

    Invariant (kept by BlockPool and KVCacheManager): for a non-null block, ref_cnt equals
    len(owners), the number of running requests whose block table holds it.
    """

    block_id: int
    ref_cnt: int
    hashed: bool
    owners: tuple[str, ...]
    is_null: bool = False

    @property
    def kind(self) -> str:
        """'null', 'used' (one owner), 'shared' (several), 'cached' (free, hash kept) or 'free'."""
        if self.is_null:
            return "null"
        if self.ref_cnt > 1:
            return "shared"
        if self.ref_cnt == 1:
            return "used"
        return "cached" if self.hashed else "free"

    @property
    def label(self) -> str:
        """Two characters for the text grid: the owner's id, or a symbol for the other states."""
        symbol = {"null": "##", "shared": "**", "cached": "cc", "free": ".."}.get(self.kind)
        return symbol or self.owners[0][-2:].rjust(2)


def block_owners(manager: KVCacheManager) -> dict[int, list[str]]:
    """block id -> the requests holding it, in request-id order, over every KV cache group's tables (a
    full-attention model has one group)."""
    owners: dict[int, list[str]] = {}
    for group in manager.coordinator.single_type_managers:
        for req_id, blocks in sorted(group.req_to_blocks.items()):
            for block in blocks:
                if req_id not in owners.setdefault(block.block_id, []):
                    owners[block.block_id].append(req_id)
    return owners


def block_states(manager: KVCacheManager) -> list[BlockState]:
    """Every block of manager's pool, in block-id order, read from the live objects."""
    owners = block_owners(manager)
    return [
        BlockState(
            b.block_id,
            b.ref_cnt,
            b.block_hash is not None,
            tuple(sorted(owners.get(b.block_id, ()), key=_id_order)),
            b.is_null,
        )
        for b in manager.block_pool.blocks
    ]


def snapshot_block_states(state: EngineState) -> list[BlockState]:
    """Every block of a snapshot's pool, in block-id order, as block_states reads them from a live pool."""
    owners = state.block_owners()
    return [
        BlockState(i, n, h is not None, tuple(sorted(owners.get(i, ()), key=_id_order)), i == state.null_block_id)
        for i, (n, h) in enumerate(zip(state.ref_cnt, state.block_hashes, strict=True))
    ]


def _id_order(req_id: str) -> tuple[int, str]:
    # Engine ids are decimal strings: order them as numbers so "10" follows "9".
    return (int(req_id), "") if req_id.isdigit() else (1 << 62, req_id)


def request_color(req_id: str) -> str:
    """A fixed color per request id, the same on every run (crc32, not the salted str hash)."""
    key = int(req_id) if req_id.isdigit() else zlib.crc32(req_id.encode())
    return _REQUEST_COLORS[key % len(_REQUEST_COLORS)]


def grid_text(states: list[BlockState], columns: int = 16) -> str:
    """The pool as text, `columns` blocks a row, each row prefixed by its first block id."""
    rows = []
    for start in range(0, len(states), columns):
        cells = " ".join(s.label for s in states[start : start + columns])
        rows.append(f"{start:4d} | {cells}")
    return "\n".join(rows)


def grid_html(states: list[BlockState], columns: int = 16) -> str:
    """The pool as an HTML table; each cell's title spells out the block's real state."""
    rows = []
    for start in range(0, len(states), columns):
        rows.append("<tr>" + "".join(_cell(s) for s in states[start : start + columns]) + "</tr>")
    return "<table style='border-collapse:collapse;font:11px monospace'>" + "".join(rows) + "</table>"


def _cell(s: BlockState) -> str:
    kind = s.kind
    held = kind in ("used", "shared")
    color = request_color(s.owners[0]) if kind == "used" else _STATE_STYLE[kind][0]
    text = "#fff" if held or kind == "null" else "#555"
    owners = ",".join(s.owners) or "-"
    title = f"block {s.block_id}: {kind}, ref_cnt {s.ref_cnt}, hash {'yes' if s.hashed else 'no'}, owners {owners}"
    body = f"{s.block_id}<br><b>{html.escape(owners) if held else '&nbsp;'}</b>"
    return (
        f"<td title='{html.escape(title)}' data-block='{s.block_id}' data-kind='{kind}' data-ref='{s.ref_cnt}' "
        f"style='background:{color};color:{text};width:34px;height:30px;text-align:center;"
        f"border:1px solid #fff'>{body}</td>"
    )


def legend_html() -> str:
    swatch = "<span style='background:{};padding:0 8px;border:1px solid #999'>&nbsp;</span>"
    held = "".join(swatch.format(c) for c in _REQUEST_COLORS)
    items = [f"{held} held by one request (one colour per request; the number is its id)"]
    items += [f"{swatch.format(c)} {t}" for c, t in _STATE_STYLE.values()]
    return "<div style='font:11px sans-serif'>" + " &nbsp; ".join(items) + "</div>"


def block_table_lines(engine) -> list[str]:
    """One line per unfinished request: status, tokens with KV stored, block table, and the tail waste."""
    manager, size = engine.kv_cache_manager, engine.scheduler.block_size
    lines = []
    for req_id in sorted(engine.scheduler.requests, key=_id_order):
        request = engine.scheduler.requests[req_id]
        per_group = manager.get_block_ids(req_id)  # one list per KV cache group
        table = per_group[0] if len(per_group) == 1 else per_group
        computed = request.num_computed_tokens
        waste = len(per_group[0]) * size - computed
        lines.append(
            f"req {req_id:>3} {request.status.name.lower():8} {computed:4d}/{request.num_tokens:<4d} tokens "
            f"in KV, blocks {table}, {waste} empty slots"
        )
    return lines


class PoolMap:
    """The pool grid, the block tables and a Step button wired to a real LLMEngine.

    `arrivals[k]` lists (prompt_token_ids, SamplingParams) to add before the widget's k-th step
    (k counts from 0), so a scripted story replays the same way on every run. `step()`,
    `step_button.click()`, `reset()` and `text()` drive and read it from Python, which is how the
    tests and nbval see it. Step is disabled once the story has ended; Reset replays it.
    """

    def __init__(self, engine, arrivals: dict[int, Iterable[tuple]] | None = None, columns: int = 16):
        self.engine = engine
        self.story = {k: list(v) for k, v in (arrivals or {}).items()}
        self.arrivals = dict(self.story)
        self.columns = columns
        self.num_steps = 0
        self.finished: list[str] = []
        self.states: list[BlockState] = []
        self.grid = widgets.HTML()
        self.tables = widgets.HTML()
        self.status = widgets.HTML()
        self.step_button = widgets.Button(
            description="Step", button_style="primary", tooltip="run one real engine step"
        )
        self.step_button.on_click(lambda _: self.step())
        self.reset_button = widgets.Button(
            description="Reset", tooltip="finish what runs, clear the prefix cache and start the story again"
        )
        self.reset_button.on_click(lambda _: self.reset())
        self.widget = widgets.VBox(
            [
                widgets.HBox([self.step_button, self.reset_button, self.status]),
                self.grid,
                widgets.HTML(legend_html()),
                self.tables,
            ]
        )
        self._add_arrivals()
        self.refresh()

    def _add_arrivals(self) -> None:
        for token_ids, params in self.arrivals.pop(self.num_steps, ()):
            self.engine.add_request(list(token_ids), params)

    def step(self) -> None:
        """Run one engine step (if anything is left to run), then redraw from the pool."""
        if not self.engine.has_unfinished_requests() and self.arrivals:
            self.num_steps = min(self.arrivals)  # idle until the next arrival: skip to it
            self._add_arrivals()
        if self.engine.has_unfinished_requests():
            self.finished = [out.request_id for out in self.engine.step()]
            self.num_steps += 1
            self._add_arrivals()
        self.refresh()

    def reset(self) -> None:
        """Run what is left to its end, clear the prefix cache and replay the story from step 0."""
        while self.engine.has_unfinished_requests():
            self.engine.step()
        self.engine.kv_cache_manager.reset_prefix_cache()
        self.arrivals, self.num_steps, self.finished = dict(self.story), 0, []
        self._add_arrivals()
        self.refresh()

    @property
    def ended(self) -> bool:
        return not self.engine.has_unfinished_requests() and not self.arrivals

    def refresh(self) -> None:
        self.step_button.disabled = self.ended
        self.states = block_states(self.engine.kv_cache_manager)
        self.grid.value = grid_html(self.states, self.columns)
        self.tables.value = (
            "<pre style='font-size:11px;margin:0'>"
            + html.escape("\n".join(block_table_lines(self.engine)) or "no unfinished requests")
            + "</pre>"
        )
        self.status.value = html.escape(self.summary())

    def summary(self) -> str:
        kinds = [s.kind for s in self.states]
        held = sum(k in ("used", "shared") for k in kinds)
        done = f", finished: req {', '.join(self.finished)}" if self.finished else ""
        return (
            f"after step {self.num_steps}: {held} blocks held, {kinds.count('cached')} cached-free, "
            f"{kinds.count('free')} free of {len(kinds) - 1}{done}"
        )

    def text(self) -> str:
        """The same picture in plain text: the summary, the grid and the block tables."""
        return "\n".join([self.summary(), grid_text(self.states, self.columns), *block_table_lines(self.engine)])

    def _ipython_display_(self) -> None:
        show_view(self)
