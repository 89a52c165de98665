"""The server's live page, `GET /live`: the engine's state redrawn twice a second while clients stream.

The page is a shell whose small script fetches `GET /live/view` every LIVE_POLL_MS and puts the HTML it gets in
place. That HTML is rendered on the server from an EngineState the engine loop took between two steps
(AsyncLLM.get_engine_state): `summary_html` (the counts, as data- attributes too, for scripts and tests) and then
a `LiveView`, a function from EngineState to HTML. The engine's own, `plain_view`, is tables and text; richer
pictures come in through build_app(live_view=...) (and serve_cli's), so that the engine imports no drawing code.
"""

from __future__ import annotations

import html
from collections.abc import Callable

from nanoengine.engine.engine_state import EngineState, RequestState

LiveView = Callable[[EngineState], str]
LIVE_POLL_MS = 500
FREE_QUEUE_HEAD, FREE_QUEUE_TAIL = 32, 8  # the free-queue blocks a view lists: the next to go, and the last

LIVE_PAGE = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>nanoengine: live engine state</title>
<link rel="icon" href="data:,"></head>
<body style="font:13px sans-serif;margin:12px">
<h3 style="margin:0 0 6px">nanoengine, live <small id="live-status" style="font-weight:normal;color:#777"></small></h3>
<div id="live-view">waiting for the first snapshot...</div>
<script>
const view = document.getElementById("live-view"), status = document.getElementById("live-status");
async function refresh() {{
  try {{
    const response = await fetch("/live/view", {{cache: "no-store"}});
    if (!response.ok) throw new Error("HTTP " + response.status);
    view.innerHTML = await response.text();
    status.textContent = "updated " + new Date().toLocaleTimeString();
  }} catch (error) {{
    status.textContent = "cannot reach the server (" + error.message + "); retrying";
  }}
  setTimeout(refresh, {LIVE_POLL_MS});
}}
refresh();
</script></body></html>
"""


def summary_html(state: EngineState) -> str:
    """The snapshot's one-line summary, its counts also as data- attributes of #engine-summary."""
    rate = state.prefix_cache_hit_rate
    data = {
        "step": state.step,
        "running": len(state.running),
        "waiting": len(state.waiting),
        "used-blocks": state.num_used_blocks,
        "cached-blocks": state.num_cached_free_blocks,
        "num-blocks": state.num_blocks,
        "hit-rate": "" if rate is None else f"{rate:.4f}",
    }
    attributes = " ".join(f"data-{k}='{v}'" for k, v in data.items())
    return f"<div id='engine-summary' {attributes} style='font:13px monospace'>{html.escape(state.summary())}</div>"


def free_queue_ends(free_queue: list[int]) -> tuple[list[int], int, list[int]]:
    """The head of the free queue, how many blocks are left out, and its tail (what a view lists of it)."""
    if len(free_queue) <= FREE_QUEUE_HEAD + FREE_QUEUE_TAIL:
        return free_queue, 0, []
    return (
        free_queue[:FREE_QUEUE_HEAD],
        len(free_queue) - FREE_QUEUE_HEAD - FREE_QUEUE_TAIL,
        free_queue[-FREE_QUEUE_TAIL:],
    )


def request_line(r: RequestState) -> str:
    """One request: status, tokens with KV computed of all, the prefix cache's share, and its block table."""
    cached = f", {r.num_cached_tokens} from the prefix cache" if r.num_cached_tokens > 0 else ""
    blocks = f", blocks {r.block_ids}" if r.block_ids else ""
    return f"r{r.request_id} {r.status}: {r.num_computed_tokens}/{r.num_tokens} tokens computed{cached}{blocks}"


def plain_view(state: EngineState) -> str:
    """The engine's own rendering: the requests, the free queue's ends and the last step plans, as text."""
    head, skipped, tail = free_queue_ends(state.free_queue)
    queue = " ".join(map(str, head)) + (f" ... ({skipped} more) ... " if skipped else " ") + " ".join(map(str, tail))
    sections = {
        "running": [request_line(r) for r in state.running] or ["none"],
        "waiting": [request_line(r) for r in state.waiting] or ["none"],
        "free queue, head (taken next) to tail": [queue.strip() or "(empty)"],
        "last steps": [p.describe() for p in reversed(state.steps)] or ["none yet"],
    }
    return "".join(
        f"<h4 style='margin:10px 0 2px'>{title}</h4><pre style='margin:0' class='live-{title.split()[0]}'>"
        + html.escape("\n".join(lines))
        + "</pre>"
        for title, lines in sections.items()
    )
