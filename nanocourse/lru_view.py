"""Chapter 06's LRU view: a published eviction timeline replayed on the real pool, and the free
policy of older vLLM releases, to measure what vLLM 0.33's change buys.

The timeline is the t=0..t=6 story of the blog post "vLLM v1 Prefix Caching: Hash Chains, LRU
Eviction, and Hit Rate Optimization" (series "vLLM v1 & Omni Internals"). `EvictionTimeline` runs it
through the engine's own Scheduler and KVCacheManager (block size 4, the null block plus 10 blocks,
so the post's blocks 0-9 are our 1-10). `LRUView` is
its widget: Step moves one t forward, and the table shows every block's ref_cnt, short hash, place
in the free queue and whether it was just evicted, all read from the live pool.

`old_pool` builds a pool that frees like vLLM before 0.33 (every block to the tail), and
`replay_hit_rate` serves a workload through the engine's scheduler with the model left out, so
that free policies can be compared on hundreds of requests in a fraction of a second.
"""

from __future__ import annotations

import html
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import ipywidgets as widgets

from nanocourse.live import show_view
from nanocourse.pool_map import block_owners
from nanoengine.core import (
    BlockPool,
    BlockRemoved,
    FreeBlockQueue,
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    KVCacheManager,
    get_request_block_hasher,
)
from nanoengine.core.kv_cache_manager import FULL_ATTENTION_GROUPS
from nanoengine.core.sched.scheduler import Scheduler, SchedulerConfig
from nanoengine.kv_cache_interface import KVCacheGroupSpec
from nanoengine.request import Request, RequestStatus
from nanoengine.sampling_params import SamplingParams
from nanoengine.worker.outputs import ModelRunnerOutput

HASH_DIGITS = 6


def free_queue_ids(pool: BlockPool) -> list[int]:
    """Block ids in the free queue, head (taken first) to tail."""
    return [block.block_id for block in pool.free_block_queue.get_all_free_blocks()]


def short_hash(block_hash: bytes | None) -> str:
    return block_hash.hex()[:HASH_DIGITS] if block_hash else ""


# ---- free policies to compare -----------------------------------------------------------------
class AppendOnlyFreeQueue(FreeKVCacheBlockQueue):
    """A free queue that sends head inserts to the tail: vLLM's free order before 0.33.

    BlockPool.free_blocks prepends the freed blocks that have no hash and appends the hashed ones.
    KVCacheManager hands it a request's blocks last first, and a request's unhashed blocks are its
    last ones, so they lead that order: appending both lists gives exactly the old
    `append_n(every freed block)`.
    """

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        self.append_n(blocks)


def old_pool(num_blocks: int, enable_caching: bool) -> BlockPool:
    """A BlockPool that frees like older vLLM; plugs in as LLM(block_pool=old_pool)."""
    return BlockPool(num_blocks, enable_caching, free_queue_cls=AppendOnlyFreeQueue)


class ForwardFreePool(BlockPool):
    """A pool that undoes KVCacheManager's reverse order, so a request's root block is freed, and
    therefore evicted, first. Only for measuring what the reverse order is worth."""

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        super().free_blocks(list(ordered_blocks)[::-1])


class _FreedBlocks:
    """Stands in for the free queue while BlockPool.free_blocks runs: keeps the blocks it frees."""

    def __init__(self) -> None:
        self.blocks: list[KVCacheBlock] = []

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        self.blocks += blocks

    def append_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        self.blocks += blocks

    def remove(self, block: KVCacheBlock) -> None:
        self.blocks.remove(block)


PlaceFreed = Callable[[FreeKVCacheBlockQueue, list[KVCacheBlock]], None]


class PlacedFreePool(BlockPool):
    """The engine's BlockPool with the free order left to place(queue, freed), task 06.8's seam.

    free_blocks keeps the engine's ref counting and double-free check; the blocks whose last reference
    a call drops go to place, in the order their request holds them (chain root first: the managers
    list a request's blocks last first), and place puts each into the free queue. Plug it in with
    `LLM(block_pool=lambda n, caching: PlacedFreePool(n, caching, place))`.
    """

    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool,
        place: PlaceFreed,
        hash_block_size: int | None = None,
        *,
        free_queue_cls: type[FreeBlockQueue] = FreeKVCacheBlockQueue,
    ) -> None:
        super().__init__(num_gpu_blocks, enable_caching, hash_block_size, free_queue_cls=free_queue_cls)
        self.place = place

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        blocks = list(ordered_blocks)
        queue, freed = self.free_block_queue, _FreedBlocks()
        self.free_block_queue = freed  # type: ignore[assignment]
        try:
            super().free_blocks(blocks)
        finally:
            self.free_block_queue = queue
        # A block listed twice becomes free at its last listing: that listing's place counts.
        listed_at = {block.block_id: i for i, block in enumerate(blocks)}
        self.place(queue, sorted(freed.blocks, key=lambda block: -listed_at[block.block_id]))


# ---- a workload, served without a model -------------------------------------------------------
def chatbot_prompts(
    num_requests: int,
    num_systems: int = 8,
    system_tokens: int = 48,
    question_tokens: int = 8,
    *,
    zipf: float = 1.0,
    seed: int = 0,
) -> list[list[int]]:
    """Prompts of a chatbot with several system prompts: each request picks one (the k-th most
    popular with weight 1/k**zipf; zipf=0 is uniform) and adds a question of its own.

    Token ids are drawn from [1000, 40000), valid for SmolLM2, with a seeded generator.
    """
    rng = random.Random(seed)
    draw = lambda n: [rng.randrange(1000, 40000) for _ in range(n)]
    systems = [draw(system_tokens) for _ in range(num_systems)]
    weights = [1 / (k + 1) ** zipf for k in range(num_systems)]
    return [rng.choices(systems, weights)[0] + draw(question_tokens) for _ in range(num_requests)]


def replay_hit_rate(
    prompts: Sequence[Sequence[int]],
    pool: BlockPool,
    block_size: int = 16,
    max_tokens: int = 4,
    max_num_seqs: int = 4,
    groups: Sequence[KVCacheGroupSpec] | None = None,
) -> float:
    """Serve prompts through the engine's Scheduler and KVCacheManager with the model left out
    (one single-type manager per group when groups, a hybrid model's KV cache groups, are given).

    Every prompt is queued at once, at most max_num_seqs run together (LLM.generate does the same),
    and each decodes exactly max_tokens tokens. The sampled ids are a fixed stand-in: lookups only
    read prompts, and whether a block is hashed depends on how full it is, not on what it holds, so
    the hit rate is the engine's whenever no prompt repeats another request's output.
    Returns the prefix-cache hit rate in tokens, as EngineStats counts it; raises ValueError when
    a prompt cannot fit in the pool at all.
    """
    manager = KVCacheManager(block_size, pool, kv_cache_groups=groups or FULL_ATTENTION_GROUPS)
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=max_num_seqs), manager)
    hasher = get_request_block_hasher(block_size)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for i, tokens in enumerate(prompts):
        scheduler.add_request(Request(str(i), list(tokens), params, block_hasher=hasher))
    while scheduler.has_unfinished_requests():
        out = scheduler.schedule()
        if not out.num_scheduled_tokens:  # nothing runs and the next prompt cannot fit: it never will
            raise ValueError(
                f"the pool ({pool.num_gpu_blocks} blocks) cannot hold the next prompt; give it more blocks"
            )
        requests = scheduler.requests
        done = [r for r in out.num_scheduled_tokens if requests[r].num_computed_tokens == requests[r].num_tokens]
        scheduler.update_from_output(out, ModelRunnerOutput({r: [0] for r in done}))  # a chunk samples nothing
    return manager.make_prefix_cache_stats().hit_rate


# ---- what every block is doing ----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class BlockView:
    """One block as the pool sees it. queue_pos 0 is the head of the free queue (taken first);
    None means the block is not free (held by a request, or the null block)."""

    block_id: int
    ref_cnt: int
    hash_hex: str
    queue_pos: int | None
    owners: tuple[str, ...]
    evicted: bool
    is_null: bool


def block_views(manager: KVCacheManager, evicted: Iterable[int] = ()) -> list[BlockView]:
    """Every block of manager's pool in id order, read from the live objects."""
    pool, evicted = manager.block_pool, set(evicted)
    position = {block_id: i for i, block_id in enumerate(free_queue_ids(pool))}
    owners = block_owners(manager)
    return [
        BlockView(
            b.block_id,
            b.ref_cnt,
            short_hash(b.block_hash),
            position.get(b.block_id),
            tuple(owners.get(b.block_id, ())),
            b.block_id in evicted,
            b.is_null,
        )
        for b in pool.blocks
    ]


def views_text(views: list[BlockView]) -> str:
    """The blocks as aligned rows: ref_cnt, hash (* if evicted in the last step), free-queue position
    (0 is the head), holders."""

    def row(label, cell):
        return f"{label:6}" + "".join(f"{cell(v):>8}" for v in views)

    return "\n".join(
        [
            row("block", lambda v: v.block_id),
            row("ref", lambda v: "null" if v.is_null else v.ref_cnt),
            row("hash", lambda v: (v.hash_hex or "-") + ("*" if v.evicted else "")),
            row("queue", lambda v: "-" if v.queue_pos is None else v.queue_pos),
            row("held", lambda v: ",".join(v.owners) or "-"),
        ]
    )


# ---- the blog post's timeline -------------------------------------------------------------------
SYSTEM_PROMPT = tuple(range(100, 116))  # 16 tokens: four full blocks of 4


@dataclass(frozen=True, slots=True)
class TimelineStep:
    """What the post says happens at time t (in its own block ids), and where the engine differs."""

    t: int
    post_says: str
    engine_differs: str


TIMELINE_STEPS = (
    TimelineStep(
        0,
        "A brings the system prompt: blocks 0-3 are allocated, filled and put in the cache, each with ref_count 1.",
        "Same four blocks, numbered 1-4: block 0 is the engine's null block and never holds tokens.",
    ),
    TimelineStep(
        1,
        "A completes: blocks 0-3 drop to ref_count 0 and join the LRU's tail, oldest first: LRU = [0, 1, 2, 3].",
        "No separate LRU: one free queue holds never-used and cached blocks alike. The request is "
        "freed last block first, so its root (1) sits behind its tail (4) and is evicted last.",
    ),
    TimelineStep(
        2,
        "B brings the same system prompt: lookup matches blocks 0-3, which go back to "
        "ref_count 1 and leave the LRU (now empty).",
        "The lookup takes no reference (by default it only counts itself in the prefix-cache stats); "
        "allocate_slots takes the references once the whole prompt fits. "
        "B has 2 tokens of its own, which need a new block (5). A B that were just the 16-token "
        "prompt would hit 3 blocks, not 4: the last token is always recomputed for its logits.",
    ),
    TimelineStep(
        3,
        "C brings a different prompt: no hit; free blocks 4-7 are allocated.",
        "C gets 6-9, since block 5 went to B. Never-cached blocks come first because nothing "
        "cached sits ahead of them in the queue; no eviction yet.",
    ),
    TimelineStep(
        4,
        "B completes: blocks 0-3 re-enter the LRU at the tail: LRU = [0, 1, 2, 3].",
        "B's partial block 5 has no hash: it goes to the head, to be reused first. The chain "
        "goes to the tail, last block first.",
    ),
    TimelineStep(
        5,
        "C completes: blocks 4-7 join the LRU: LRU = [0, 1, 2, 3, 4, 5, 6, 7].",
        "Same ages, but each chain is reversed: the queue reads [unhashed..., 4, 3, 2, 1, 9, 8, 7, 6].",
    ),
    TimelineStep(
        6,
        "A new request needs 6 blocks and only 2 are free: it takes them, then evicts blocks "
        "0, 1, 2, 3, the system prompt, from the LRU head. The next request with that prompt "
        "pays the full prefill.",
        "With 6 blocks the same four go, but tail first (4, 3, 2, 1). Ask for fewer blocks with the "
        "slider: the engine keeps the root, so the blocks that survive still hit, where a "
        "root-first order would leave them cached but unreachable.",
    ),
)


class EvictionTimeline:
    """The post's t=0..t=6 on the engine's Scheduler and KVCacheManager.

    `step()` runs the next t; `did` says what the engine did, `evicted` lists the blocks that lost
    their hash in that step, in eviction order. `e_blocks` is how many blocks the request at t=6
    needs (6 in the post).
    """

    block_size = 4

    def __init__(self, e_blocks: int = 6):
        self.e_blocks = e_blocks
        pool = BlockPool(11, True, enable_kv_cache_events=True)
        self.manager = KVCacheManager(self.block_size, pool, log_stats=False)
        self.scheduler = Scheduler(SchedulerConfig(max_model_len=64), self.manager)
        self.hasher = get_request_block_hasher(self.block_size)
        self.t = -1
        self.did = "Nothing has run yet: every block but the null block is free."
        self.evicted: list[int] = []

    @property
    def pool(self) -> BlockPool:
        return self.manager.block_pool

    @property
    def done(self) -> bool:
        return self.t == len(TIMELINE_STEPS) - 1

    @property
    def timeline_step(self) -> TimelineStep | None:
        return TIMELINE_STEPS[self.t] if self.t >= 0 else None

    def step(self) -> None:
        """Run the next t (nothing after t=6) and record what it evicted from the pool's events."""
        if self.done:
            return
        self.t += 1
        hash_before = {b.block_id: b.block_hash for b in self.pool.blocks}
        self.pool.take_events()
        self.did = _ACTIONS[self.t](self)
        removed = [h for ev in self.pool.take_events() if isinstance(ev, BlockRemoved) for h in ev.block_hashes]
        self.evicted = [
            block_id
            for h in removed
            for block_id, old in hash_before.items()
            if old == h and self.pool.blocks[block_id].block_hash != h
        ]

    def system_prompt_hit(self) -> int:
        """Tokens a new request made of the system prompt plus one token would reuse now."""
        probe = Request("probe", [*SYSTEM_PROMPT, 1], block_hasher=self.hasher)
        return self.manager.get_computed_blocks(probe)[1]

    def views(self) -> list[BlockView]:
        return block_views(self.manager, self.evicted)

    def _admit(self, name: str, tokens: Sequence[int]) -> str:
        request = Request(name, list(tokens), SamplingParams(max_tokens=1), block_hasher=self.hasher)
        self.scheduler.add_request(request)
        self.scheduler.schedule()
        ids = self.manager.get_block_ids(name)[0]  # the one KV cache group's ids
        hits = request.num_cached_tokens // self.block_size
        reused = f"reuses blocks {ids[:hits]} from the cache" if hits else "finds nothing cached"
        return f"{name} ({request.num_tokens} tokens) {reused} and takes {ids[hits:]} from the free queue's head."

    def _finish(self, name: str) -> str:
        ids = self.manager.get_block_ids(name)[0]  # the one KV cache group's ids
        self.scheduler.finish_requests([name], RequestStatus.FINISHED_STOPPED)
        return f"{name} finishes; its blocks {ids} are freed as {ids[::-1]} (last first)."


_ACTIONS = (
    lambda tl: tl._admit("A", SYSTEM_PROMPT),
    lambda tl: tl._finish("A"),
    lambda tl: tl._admit("B", [*SYSTEM_PROMPT, 7, 8]),
    lambda tl: tl._admit("C", range(500, 516)),
    lambda tl: tl._finish("B"),
    lambda tl: tl._finish("C"),
    lambda tl: tl._admit("E", range(900, 900 + 4 * tl.e_blocks)),
)


def timeline_text(timeline: EvictionTimeline) -> str:
    """What the widget shows, as plain text: the step, the post's claim, the engine's state."""
    step = timeline.timeline_step
    lines = [f"t={step.t}" if step else "before t=0"]
    if step:
        lines.append(f"the post: {step.post_says}")
    lines.append(f"engine:   {timeline.did}")
    if timeline.evicted:
        lines.append(f"evicted:  {timeline.evicted}, in this order (* below: the hash shown is the new owner's)")
    if step:
        lines.append(f"differs:  {step.engine_differs}")
    lines += [
        views_text(timeline.views()),
        f"free queue, head to tail: {free_queue_ids(timeline.pool)}",
        f"a new request with the system prompt would reuse {timeline.system_prompt_hit()} tokens",
    ]
    return "\n".join(lines)


# ---- the widget -------------------------------------------------------------------------------
def _cell(v: BlockView) -> str:
    if v.is_null:
        color = "#333"
    elif v.evicted:
        color = "#f4a6a6"
    elif v.ref_cnt:
        color = "#8fb8e0"
    else:
        color = "#c7e9c0" if v.hash_hex else "#f2f2f2"
    owners = html.escape(",".join(v.owners))
    lines = [
        f"<b>{v.block_id}</b>",
        "ref -" if v.is_null else f"ref {v.ref_cnt}",
        "null" if v.is_null else (v.hash_hex or "no hash"),
        "&nbsp;" if v.queue_pos is None else f"q{v.queue_pos}",
        owners or "&nbsp;",
    ]
    return (
        f"<td data-block='{v.block_id}' data-ref='{v.ref_cnt}' data-hash='{v.hash_hex}' "
        f"data-pos='{'' if v.queue_pos is None else v.queue_pos}' data-evicted='{int(v.evicted)}' "
        f"data-owners='{owners}' style='background:{color};color:{'#fff' if v.is_null else '#222'};"
        f"width:58px;text-align:center;border:1px solid #fff;font:11px monospace'>{'<br>'.join(lines)}</td>"
    )


def table_html(views: list[BlockView]) -> str:
    return "<table style='border-collapse:collapse'><tr>" + "".join(map(_cell, views)) + "</tr></table>"


_LEGEND = (
    "<div style='font:11px sans-serif'>blue: held (ref &gt; 0) &nbsp; green: free, hash kept "
    "(a hit can rescue it) &nbsp; grey: free, no hash &nbsp; red: evicted in this step (the hash "
    "shown is its new owner's) &nbsp; "
    "qN: position in the free queue, q0 is taken first</div>"
)


class LRUView:
    """Step through the blog post's eviction timeline on the real pool.

    `step()`, `reset()`, `step_button.click()` and `e_slider.value = n` drive it from Python (that
    is how the tests and nbval see it); `text()` is the same picture in plain text.
    """

    def __init__(self, e_blocks: int = 6):
        self.timeline = EvictionTimeline(e_blocks)
        self.step_button = widgets.Button(description="Step", button_style="primary", tooltip="run the next t")
        self.reset_button = widgets.Button(description="Reset", tooltip="back to before t=0")
        self.e_slider = widgets.IntSlider(
            value=e_blocks, min=1, max=10, description="E's blocks", tooltip="how many blocks the request at t=6 needs"
        )
        self.header = widgets.HTML()
        self.table = widgets.HTML()
        self.footer = widgets.HTML()
        self.step_button.on_click(lambda _: self.step())
        self.reset_button.on_click(lambda _: self.reset())
        self.e_slider.observe(lambda _: self._replay(self.timeline.t), names="value")
        self.widget = widgets.VBox(
            [
                widgets.HBox([self.step_button, self.reset_button, self.e_slider]),
                self.header,
                self.table,
                widgets.HTML(_LEGEND),
                self.footer,
            ]
        )
        self.refresh()

    def step(self) -> None:
        self.timeline.step()
        self.refresh()

    def reset(self) -> None:
        self._replay(-1)

    def _replay(self, t: int) -> None:
        # The story is deterministic: rebuilding it up to t shows the same state with the new slider value.
        self.timeline = EvictionTimeline(self.e_slider.value)
        while self.timeline.t < t:
            self.timeline.step()
        self.refresh()

    def refresh(self) -> None:
        tl, step = self.timeline, self.timeline.timeline_step
        rows = [f"<b>{f't={step.t}' if step else 'before t=0'}</b>"]
        if step:
            rows.append(f"<i>the post:</i> {html.escape(step.post_says)}")
        rows.append(f"<i>engine:</i> {html.escape(tl.did)}")
        if step:
            rows.append(f"<i>differs:</i> {html.escape(step.engine_differs)}")
        self.header.value = "<div style='font:12px sans-serif;max-width:760px'>" + "<br>".join(rows) + "</div>"
        self.views = tl.views()
        self.table.value = table_html(self.views)
        self.footer.value = (
            f"<div style='font:12px monospace'>free queue, head to tail: {free_queue_ids(tl.pool)}"
            f"<br>evicted in this step: {tl.evicted or 'none'}<br>a new request with the system "
            f"prompt would reuse {tl.system_prompt_hit()} tokens</div>"
        )
        self.step_button.disabled = tl.done

    def text(self) -> str:
        return timeline_text(self.timeline)

    def _ipython_display_(self) -> None:
        show_view(self)
