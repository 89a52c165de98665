"""The course's pictures of a serving engine, for the server's live page: `python -m nanocourse serve` hands
`engine_state_html` to the server (build_app's live_view), which calls it with each EngineState its engine loop took
between two steps.

It draws chapter 02's pool grid and legend (pool_map), chapter 05's free-queue chips (free_queue_view), the
requests with their block tables, and the last steps' plans as chapter 07's timeline names them, each request in its
pool-map colour. Everything is read from the snapshot, never from the engine, which runs on meanwhile.
"""

from __future__ import annotations

import html

from nanocourse.free_queue_view import HASH_LEGEND, chip_html, queue_row_html
from nanocourse.pool_map import grid_html, legend_html, request_color, snapshot_block_states
from nanoengine.core import KVCacheBlock
from nanoengine.engine.engine_state import EngineState, RequestState, StepPlan
from nanoengine.entrypoints.openai.live import free_queue_ends, request_line

GRID_COLUMNS = 32  # SmolLM2's default pool (728 blocks) then fits in 23 rows


def engine_state_html(state: EngineState) -> str:
    """The pool grid, the free queue's ends, the requests and the last steps' plans (newest first)."""
    sections = [
        ("block pool", grid_html(snapshot_block_states(state), GRID_COLUMNS) + legend_html()),
        ("free queue", free_queue_html(state) + f"<div style='font:11px sans-serif'>{HASH_LEGEND}</div>"),
        ("requests", "".join(_request_html(r) for r in state.running + state.waiting) or "none"),
        ("last steps", "".join(step_plan_html(p) for p in reversed(state.steps)) or "none yet"),
    ]
    return "".join(
        f"<h4 style='margin:10px 0 2px'>{title}</h4><div class='live-{title.split()[-1]}'>{body}</div>"
        for title, body in sections
    )


def free_queue_html(state: EngineState) -> str:
    """The free queue's head and tail as chapter 05's chips (green: hashed), the middle counted."""
    head, skipped, tail = free_queue_ends(state.free_queue)

    def chips(block_ids: list[int], first: int) -> str:
        return "".join(chip_html(_block(state, i), False, f", position {first + k}") for k, i in enumerate(block_ids))

    middle = f" … {skipped} more … " if skipped else ""
    return queue_row_html(chips(head, 0) + middle + chips(tail, len(state.free_queue) - len(tail)))


def _block(state: EngineState, block_id: int) -> KVCacheBlock:
    block = KVCacheBlock(block_id, state.ref_cnt[block_id])
    if (block_hash := state.block_hashes[block_id]) is not None:
        block.block_hash = block_hash
    return block


def _swatch(req_id: str, text: str) -> str:
    return (
        f"<span style='background:{request_color(req_id)};color:#fff;padding:0 4px;margin-right:2px'>"
        f"{html.escape(text)}</span>"
    )


def _request_html(r: RequestState) -> str:
    swatch = _swatch(r.request_id, "r" + r.request_id)
    return f"<div style='font:12px monospace'>{swatch} {html.escape(request_line(r))}</div>"


def step_plan_html(plan: StepPlan) -> str:
    """One step: each request's tokens in its colour, then the step's events."""
    ran = "".join(_swatch(r, f"r{r}:{n}") for r, n in plan.num_scheduled_tokens.items()) or "-"
    return (
        f"<div style='font:12px monospace;margin:1px 0'>{plan.headline()} {ran} "
        f"{html.escape(' '.join(plan.events()))}</div>"
    )
