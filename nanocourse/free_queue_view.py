"""Chapter 05's free-queue lab: a real pool's free queue, head to tail, after each allocate, free and hit.

`FreeQueueLab` runs requests through a real KVCacheManager over a small BlockPool. After each action it
reads the queue itself to record what the action did: the blocks popped from the head (and the cached
content that popping evicted), the blocks a prefix hit pulled out of the queue and where they sat, and
which freed blocks came back at the head or at the tail, each marked by whether it still carries a hash.
`FreeQueueView` puts buttons on it and draws the queue. `remove_append_ns` times the operation a hit
costs, on the linked queue and on a deque.

Where freed blocks go is the eviction policy, chapter 06's design problem, so this chapter's pools do not
use the engine's: `stand_in_pool` puts freed blocks where `to_tail_in_order` says, a stand-in stated as such.
"""

from __future__ import annotations

import html
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import ipywidgets as widgets

from nanocourse.live import show_view
from nanocourse.lru_view import PlacedFreePool, PlaceFreed
from nanoengine.core import (
    FreeBlockQueue,
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    KVCacheManager,
    get_request_block_hasher,
)
from nanoengine.request import Request

# Every chat starts with these 8 tokens: two full 4-token blocks that later chats can hit.
SYSTEM_PROMPT = tuple(range(900, 908))
QUESTION_TOKENS = 6  # a chat's own tokens after the system prompt: one full block and a partial one


def starred(blocks: Sequence[KVCacheBlock]) -> str:
    """Block ids separated by spaces, each followed by * while the block still carries a hash."""
    return " ".join(f"{b.block_id}{'*' if b.block_hash is not None else ''}" for b in blocks)


def to_tail_in_order(queue: FreeKVCacheBlockQueue, freed: list[KVCacheBlock]) -> None:
    """Chapter 05's stand-in placement, not the engine's: every freed block to the tail, in the order given
    (the order its request held them), hashed or not.

    It only keeps the queue whole, so that chapter 05 can show the structure; where freed blocks should
    go, and in which order, is the eviction policy that chapter 06 designs (tasks 06.2 and 06.8).
    """
    queue.append_n(freed)


def stand_in_pool(
    num_blocks: int,
    block_size: int,
    free_queue_cls: type[FreeBlockQueue] = FreeKVCacheBlockQueue,
    place: PlaceFreed = to_tail_in_order,
) -> PlacedFreePool:
    """The engine's BlockPool, caching on, with freed blocks placed by `place` (chapter 06's seam)."""
    return PlacedFreePool(num_blocks, True, place, block_size, free_queue_cls=free_queue_cls)


@dataclass(frozen=True, slots=True)
class Event:
    """What one action did to the free queue, as block ids.

    `pulled` holds (block id, its position in the queue before the action) for each prefix hit on a
    free block: touch() removed it from wherever it was. `shared` are hits on blocks a running request
    already held: their ref count went up and the queue did not change. `to_head` and `to_tail` are the
    freed blocks found at each end afterwards, and `hashed` those of them that still carry a hash.
    """

    action: str
    popped: tuple[int, ...] = ()
    evicted: tuple[int, ...] = ()
    pulled: tuple[tuple[int, int], ...] = ()
    shared: tuple[int, ...] = ()
    to_head: tuple[int, ...] = ()
    to_tail: tuple[int, ...] = ()
    hashed: frozenset[int] = frozenset()
    refused: bool = False

    def marked(self, ids: Sequence[int]) -> str:
        """The ids as a list, each followed by * when the block carries a hash, as in the queue line."""
        return "[" + ", ".join(f"{i}{'*' if i in self.hashed else ''}" for i in ids) + "]"

    def describe(self) -> str:
        if self.refused:
            return f"{self.action}: refused, not enough free blocks; nothing changed"
        pulled_ids, positions = zip(*self.pulled) if self.pulled else ((), ())
        phrases = (
            (pulled_ids, "hit {}, pulled out of the queue at positions " + str(list(positions))),
            (self.shared, "hit {}, already held: ref_cnt + 1"),
            (self.popped, "popped {} from the head"),
            (self.evicted, "evicting the cached content of {}"),
        )
        parts = [template.format(list(ids)) for ids, template in phrases if ids]
        parts += [
            f"freed {self.marked(ids)} to the {end}"
            for ids, end in ((self.to_head, "head"), (self.to_tail, "tail"))
            if ids
        ]
        return f"{self.action}: " + ("; ".join(parts) or "no block changed hands")


class FreeQueueLab:
    """A small real pool (block 0 is the null block) and the requests running on it.

    free_queue_cls swaps in another queue class (the chapter's exercise) under the same pool; place decides
    where freed blocks go (chapter 05's stand-in unless given).
    """

    def __init__(
        self,
        num_blocks: int = 16,
        block_size: int = 4,
        free_queue_cls: type[FreeBlockQueue] = FreeKVCacheBlockQueue,
        place: PlaceFreed = to_tail_in_order,
    ) -> None:
        self.pool = stand_in_pool(num_blocks, block_size, free_queue_cls, place)
        self.manager = KVCacheManager(block_size, self.pool)
        self.hasher = get_request_block_hasher(block_size)
        self.running: dict[str, Request] = {}  # admission order: the first is the oldest
        self.events: list[Event] = []
        self.num_requests = self.num_chats = 0

    def free_order(self) -> list[KVCacheBlock]:
        """The free blocks, head (handed out next) to tail, straight from the pool's queue."""
        return self.pool.free_block_queue.get_all_free_blocks()

    def admit(self, name: str, token_ids: Sequence[int]) -> Event:
        """Look up the prefix cache and allocate, as the scheduler does when it admits a request."""
        request = Request(name, list(token_ids), block_hasher=self.hasher)
        before = self.free_order()
        position = {block.block_id: i for i, block in enumerate(before)}
        hashed = {block.block_id for block in before if block.block_hash is not None}
        computed, num_hit_tokens = self.manager.get_computed_blocks(request)
        new = self.manager.allocate_slots(request, request.num_tokens - num_hit_tokens, num_hit_tokens, computed)
        label = f"{name} ({request.num_tokens} tokens)"
        if new is None:
            return self._record(Event(label, refused=True))
        self.running[name] = request
        hits = computed.blocks[0]  # KVCacheBlocks: one list per KV cache group, and this model has one
        popped = tuple(block.block_id for block in new.blocks[0])
        return self._record(
            Event(
                label,
                popped=popped,
                evicted=tuple(i for i in popped if i in hashed),
                pulled=tuple((b.block_id, position[b.block_id]) for b in hits if b.block_id in position),
                shared=tuple(b.block_id for b in hits if b.block_id not in position),
            )
        )

    def free(self, name: str) -> Event:
        """Free a running request; the queue before and after tells where its blocks went."""
        before = {block.block_id for block in self.free_order()}
        self.manager.free(self.running.pop(name))
        after = self.free_order()
        added = [block.block_id for block in after if block.block_id not in before]
        num_at_head = next((k for k, block in enumerate(after) if block.block_id in before), len(after))
        hashed = frozenset(block.block_id for block in after if block.block_hash is not None)
        return self._record(
            Event(
                f"free {name}",
                to_head=tuple(added[:num_at_head]),
                to_tail=tuple(added[num_at_head:]),
                hashed=hashed & frozenset(added),
            )
        )

    def allocate_request(self, num_tokens: int = 14) -> Event:
        """A request whose tokens no other request has: it can only take blocks from the head."""
        self.num_requests += 1
        start = 10_000 * self.num_requests
        return self.admit(f"r{self.num_requests}", range(start, start + num_tokens))

    def chat(self) -> Event:
        """A request that starts with SYSTEM_PROMPT: a prefix hit whenever its blocks are still cached."""
        self.num_chats += 1
        start = 5_000 + 100 * self.num_chats
        return self.admit(f"chat{self.num_chats}", SYSTEM_PROMPT + tuple(range(start, start + QUESTION_TOKENS)))

    def free_oldest(self) -> Event:
        if not self.running:
            return self._record(Event("free oldest (no request is running)"))
        return self.free(next(iter(self.running)))

    def _record(self, event: Event) -> Event:
        self.events.append(event)
        return event

    def text(self) -> str:
        """The queue, the held blocks and the last action, as plain text (* marks a hashed block)."""
        queue = self.free_order()
        lines = [
            self.events[-1].describe() if self.events else "no action yet",
            f"queue head -> tail ({len(queue)} free, * = hashed): {starred(queue)}",
        ]
        for name in self.running:
            blocks = self.manager.get_blocks(name).blocks[0]
            lines.append(f"held by {name}: blocks {[b.block_id for b in blocks]} ref_cnt {[b.ref_cnt for b in blocks]}")
        return "\n".join(lines)


# The scripted story the Step button plays: two requests, both freed, then a chat that hits blocks in
# the middle of the queue, a large request that evicts from the head, and one more hit.
STORY: tuple[Callable[[FreeQueueLab], Event], ...] = (
    FreeQueueLab.chat,
    FreeQueueLab.allocate_request,
    FreeQueueLab.free_oldest,
    FreeQueueLab.free_oldest,
    FreeQueueLab.chat,
    partial(FreeQueueLab.allocate_request, num_tokens=40),
    FreeQueueLab.free_oldest,
    FreeQueueLab.chat,
)

_HASHED, _UNHASHED, _MOVED = "#8fd18f", "#e6e6e6", "#e8590c"


def chip_html(block: KVCacheBlock, moved: bool, note: str = "") -> str:
    """One block as a chip: green when it carries a hash, grey when not, an orange frame if it just moved."""
    hashed = block.block_hash is not None
    title = (
        f"block {block.block_id}: ref_cnt {block.ref_cnt}, "
        f"{'hash ' + block.block_hash.hex()[:8] if hashed else 'no hash'}{note}"
    )
    ref = f"<sub>×{block.ref_cnt}</sub>" if block.ref_cnt > 1 else ""
    return (
        f"<span title='{html.escape(title)}' data-block='{block.block_id}' data-hashed='{int(hashed)}' "
        f"data-ref='{block.ref_cnt}' style='display:inline-block;min-width:24px;margin:1px;padding:3px 4px;"
        f"text-align:center;font:12px monospace;background:{_HASHED if hashed else _UNHASHED};"
        f"border:2px solid {_MOVED if moved else '#fff'}'>{block.block_id}{ref}</span>"
    )


def queue_html(lab: FreeQueueLab) -> str:
    event = lab.events[-1] if lab.events else Event("")
    arrived = set(event.to_head + event.to_tail)
    return queue_row_html(
        "".join(chip_html(b, b.block_id in arrived, f", position {i}") for i, b in enumerate(lab.free_order()))
    )


def queue_row_html(chips: str) -> str:
    """The free queue's chips in a row, head on the left."""
    return f"<div style='font:12px sans-serif'><b>free queue</b> head → {chips or '(empty)'} ← tail</div>"


def held_html(lab: FreeQueueLab) -> str:
    event = lab.events[-1] if lab.events else Event("")
    taken = set(event.popped + event.shared) | {i for i, _ in event.pulled}
    rows = [
        f"<div style='font:12px sans-serif'>held by <b>{html.escape(name)}</b> "
        + "".join(chip_html(b, b.block_id in taken) for b in lab.manager.get_blocks(name).blocks[0])
        + "</div>"
        for name in lab.running
    ]
    return "".join(rows) or "<div style='font:12px sans-serif'>no request holds a block</div>"


HASH_LEGEND = (
    f"<span style='background:{_HASHED};padding:0 8px'>&nbsp;</span> "
    f"hashed (a later request with the same prefix can hit it) &nbsp; <span style='background:{_UNHASHED};"
    f"padding:0 8px'>&nbsp;</span> no hash"
)
LEGEND = (
    f"<div style='font:11px sans-serif'>{HASH_LEGEND} &nbsp; <span style='border:2px solid {_MOVED};padding:0 6px'>"
    f"&nbsp;</span> moved by the last action &nbsp; ×n: ref_cnt n</div>"
)


class FreeQueueView:
    """Buttons on a FreeQueueLab: Step plays STORY, the others act freely, Reset starts over.

    make_lab builds the lab (and is called again by Reset). Everything drawn is read from the pool
    after each action; `text()` gives the same picture for tests and nbval.
    """

    def __init__(
        self,
        make_lab: Callable[[], FreeQueueLab] = FreeQueueLab,
        story: Sequence[Callable[[FreeQueueLab], Event]] = STORY,
    ) -> None:
        self.make_lab, self.story = make_lab, tuple(story)
        self.step_button = widgets.Button(
            description="Step", button_style="primary", tooltip="play the next action of the scripted story"
        )
        self.allocate_button = widgets.Button(
            description="allocate request",
            layout={"width": "auto"},
            tooltip="a request with new tokens: blocks come from the head",
        )
        self.chat_button = widgets.Button(
            description="touch cached prefix",
            layout={"width": "auto"},
            tooltip="a chat that starts with the shared system prompt",
        )
        self.free_button = widgets.Button(description="free oldest request", layout={"width": "auto"})
        self.reset_button = widgets.Button(description="Reset")
        self.step_button.on_click(lambda _: self.step())
        self.allocate_button.on_click(lambda _: self.act(FreeQueueLab.allocate_request))
        self.chat_button.on_click(lambda _: self.act(FreeQueueLab.chat))
        self.free_button.on_click(lambda _: self.act(FreeQueueLab.free_oldest))
        self.reset_button.on_click(lambda _: self.reset())
        self.log, self.queue, self.held = widgets.HTML(), widgets.HTML(), widgets.HTML()
        buttons = widgets.HBox(
            [self.step_button, self.allocate_button, self.chat_button, self.free_button, self.reset_button]
        )
        self.widget = widgets.VBox([buttons, self.log, self.queue, self.held, widgets.HTML(LEGEND)])
        self.reset()

    def reset(self) -> None:
        self.lab, self.num_steps = self.make_lab(), 0
        self.refresh()

    def step(self) -> None:
        """Play the next story action; past the end, do nothing."""
        if self.num_steps < len(self.story):
            self.num_steps += 1
            self.act(self.story[self.num_steps - 1])

    def act(self, action: Callable[[FreeQueueLab], Event]) -> None:
        action(self.lab)
        self.refresh()

    def refresh(self) -> None:
        last = self.lab.events[-1].describe() if self.lab.events else "press Step, or any action button"
        self.log.value = (
            f"<div style='font:12px sans-serif'>story step {self.num_steps}/{len(self.story)} · "
            f"{html.escape(last)}</div>"
        )
        self.queue.value = queue_html(self.lab)
        self.held.value = held_html(self.lab)

    def text(self) -> str:
        return f"story step {self.num_steps}/{len(self.story)}\n{self.lab.text()}"

    def _ipython_display_(self) -> None:
        show_view(self)


def free_list(num_blocks: int, use_deque: bool = False) -> tuple[FreeKVCacheBlockQueue | deque[int], Sequence]:
    """A queue holding every block, in block order, and the item that stands for block i in it.

    use_deque gives nano-vllm's layout, a deque of block ids, where a hit must call deque.remove;
    otherwise the engine's linked queue over real KVCacheBlocks.
    """
    if use_deque:
        return deque(range(num_blocks)), range(num_blocks)
    blocks = [KVCacheBlock(block_id=i) for i in range(num_blocks)]
    return FreeKVCacheBlockQueue(blocks), blocks


def time_remove_append(queue, items: Sequence) -> float:
    """ns per remove(item) + append(item) over items, one pass; each item ends at the tail."""
    remove, append = queue.remove, queue.append
    start = time.perf_counter_ns()
    for item in items:
        remove(item)
        append(item)
    return (time.perf_counter_ns() - start) / len(items)


def remove_append_ns(num_blocks: int, num_ops: int, use_deque: bool = False, repeats: int = 5) -> float:
    """The fastest of `repeats` passes, in ns per hit-like remove + append, among num_blocks free blocks.

    The items are spread evenly over the middle half of the queue, and every repeat starts from the
    queue in block order, so the deque always scans to the same depths.
    """
    middle = range(num_blocks // 4, 3 * num_blocks // 4)
    picks = middle[:: max(1, len(middle) // num_ops)][:num_ops]
    runs = []
    for _ in range(repeats):
        queue, item_of = free_list(num_blocks, use_deque)
        runs.append(time_remove_append(queue, [item_of[i] for i in picks]))
    return min(runs)  # the least disturbed pass: other processes only ever add time
