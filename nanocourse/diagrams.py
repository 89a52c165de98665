"""Diagrams drawn from the engine's real objects, for chapters 04, 05 and 06.

Each function reads a live structure (a free queue, a block pool, the engine's hash function) and
returns a matplotlib Figure, so what a learner sees is the state the engine is in, not a sketch.

    free_queue_diagram(queue, max_blocks=14) -> Figure
        The FreeKVCacheBlockQueue as the doubly linked list it is: head sentinel, the blocks in
        the order their links give (walked through next_free_block, with each prev_free_block
        drawn as well), tail sentinel. Free blocks that keep a prefix-cache hash are drawn apart
        from those without one. Longer queues show their first and last blocks around a gap.

    block_lifecycle_diagram(pool) -> Figure
        The life of a block as a state machine: free (no hash), in use (ref_cnt > 0), cached-free
        (ref_cnt 0, hashed, in the free queue) and evicted, the pass-through where get_new_blocks
        drops a popped block's hash. Each state carries the number of blocks in it now
        (lifecycle_counts(pool)), each edge the BlockPool method that moves a block along it.

    hash_chain_tree(prompts, block_size, pool=None, labels=None, hash_algo="xxhash") -> Figure
        prompts: token-id lists; block_size: tokens per block. Each prompt's full blocks are
        hashed with the engine's own chained hash (hash_block_tokens, from the root
        make_none_hash(hash_fn), as get_request_block_hasher does), and the chains are merged
        into a tree: a shared prefix is one path, a block where prompts differ starts a branch.
        A prompt's partial last block, which has no hash, hangs dashed off its leaf. With pool,
        every node the pool's prefix cache holds is filled in and shows its block id.
        labels name the prompts (default "prompt 0", "prompt 1", ...).
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from nanoengine.core.kv_cache_utils import (
    BlockHash,
    FreeBlockQueue,
    KVCacheBlock,
    get_hash_fn_by_name,
    hash_block_tokens,
    make_none_hash,
)

CACHED = "#8fd18f"  # a block that keeps a prefix-cache hash
PLAIN = "#d9d9d9"  # a free block with no hash
SENTINEL = "#ffffff"
IN_USE = "#9ec5f0"
EVICTED = "#f4a6a6"


def _box(ax, x, y, w, h, text, color, *, dashed=False, fontsize=9, weight="normal"):
    ax.add_patch(
        FancyBboxPatch(
            (x - w / 2, y - h / 2),
            w,
            h,
            boxstyle="round,pad=0.02,rounding_size=0.08",
            facecolor=color,
            edgecolor="#333",
            lw=1.0,
            ls="--" if dashed else "-",
        )
    )
    ax.text(x, y, text, ha="center", va="center", fontsize=fontsize, weight=weight)


def _arrow(ax, start, end, *, rad=0.0, color="#333", lw=1.0, style="-|>", ls="-"):
    ax.add_patch(
        FancyArrowPatch(
            start,
            end,
            arrowstyle=style,
            mutation_scale=10,
            color=color,
            lw=lw,
            ls=ls,
            connectionstyle=f"arc3,rad={rad}",
            shrinkA=2,
            shrinkB=2,
        )
    )


# ---- chapter 05: the free queue ---------------------------------------------------------------
def _walk(queue: FreeBlockQueue) -> list[KVCacheBlock]:
    # Follows the links themselves rather than get_all_free_blocks, so a broken link shows up.
    head, tail = queue.fake_free_list_head, queue.fake_free_list_tail
    chain, node = [], head.next_free_block
    while node is not tail:
        if node is None or len(chain) > queue.num_free_blocks:
            raise ValueError("the free queue's next links do not reach the tail sentinel")
        chain.append(node)
        node = node.next_free_block
    return chain


def free_queue_diagram(queue: FreeBlockQueue, max_blocks: int = 14) -> Figure:
    """The free queue head to tail, with its sentinels and both links of every node."""
    blocks = _walk(queue)
    shown: list[KVCacheBlock | None] = list(blocks)
    if len(blocks) > max_blocks:
        keep = max_blocks // 2
        shown = blocks[:keep] + [None] + blocks[-keep:]
    nodes = ["head", *shown, "tail"]
    fig, ax = plt.subplots(figsize=(0.78 * len(nodes) + 0.6, 2.3), dpi=90)
    w, h = 0.62, 0.5
    for x, node in enumerate(nodes):
        if isinstance(node, str):
            _box(ax, x, 0, w, h, f"{node}\nid -1", SENTINEL, dashed=True, fontsize=8)
        elif node is None:
            ax.text(x, 0, f"… {len(blocks) - 2 * (max_blocks // 2)} more …", ha="center", va="center", fontsize=8)
        else:
            cached = node.block_hash is not None
            _box(
                ax,
                x,
                0,
                w,
                h,
                f"{node.block_id}" + ("\nhash" if cached else ""),
                CACHED if cached else PLAIN,
                fontsize=9 if cached else 10,
                weight="bold",
            )
    for x in range(len(nodes) - 1):
        left, right = nodes[x], nodes[x + 1]
        if left is None or right is None:
            continue
        _arrow(ax, (x + w / 2, 0.1), (x + 1 - w / 2, 0.1), color="#1f5fa8")  # next_free_block
        _arrow(ax, (x + 1 - w / 2, -0.1), (x + w / 2, -0.1), color="#b05a00")  # prev_free_block
    ax.text(0, -0.55, "popped first\n(evicted first)", ha="center", va="top", fontsize=8)
    ax.text(len(nodes) - 1, -0.55, "appended here\n(evicted last)", ha="center", va="top", fontsize=8)
    handles = [
        plt.Rectangle((0, 0), 1, 1, fc=CACHED, ec="#333", label="free, keeps its hash (cached-free)"),
        plt.Rectangle((0, 0), 1, 1, fc=PLAIN, ec="#333", label="free, no hash (never used, or a partial block)"),
        plt.Line2D([], [], color="#1f5fa8", label="next_free_block"),
        plt.Line2D([], [], color="#b05a00", label="prev_free_block"),
    ]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 1.02), ncol=2, fontsize=7.5, frameon=False)
    ax.set_xlim(-0.6, len(nodes) - 0.4)
    ax.set_ylim(-1.05, 0.95)
    ax.set_axis_off()
    ax.set_title(
        f"free queue: {queue.num_free_blocks} free blocks, "
        f"{sum(b.block_hash is not None for b in blocks)} of them cached",
        fontsize=10,
        pad=2,
    )
    fig.tight_layout()
    return fig


# ---- chapter 06: the block lifecycle ----------------------------------------------------------
def _blocks(n: int) -> str:
    return f"{n} block" if n == 1 else f"{n} blocks"


def lifecycle_counts(pool) -> dict[str, int]:
    """Blocks in each resting state now, the null block left out (it never moves)."""
    counts = {"free": 0, "in use": 0, "cached-free": 0}
    for block in pool.blocks:
        if block.is_null:
            continue
        if block.ref_cnt > 0:
            counts["in use"] += 1
        elif block.block_hash is None:
            counts["free"] += 1
        else:
            counts["cached-free"] += 1
    return counts


def block_lifecycle_diagram(pool) -> Figure:
    """Free, in use, cached-free and evicted, with today's counts and the methods that move blocks."""
    counts = lifecycle_counts(pool)
    pos = {"free": (0.0, 0.0), "in use": (4.0, 2.0), "cached-free": (8.0, 0.0), "evicted": (4.0, -2.0)}
    text = {
        "free": f"free, no hash\n{_blocks(counts['free'])}",
        "in use": f"in use (ref_cnt > 0)\n{_blocks(counts['in use'])}",
        "cached-free": f"cached-free\nref_cnt 0, hashed,\nin the free queue\n{_blocks(counts['cached-free'])}",
        "evicted": "evicted: hash dropped\n(a pass-through inside\nget_new_blocks: 0 stay)",
    }
    color = {"free": PLAIN, "in use": IN_USE, "cached-free": CACHED, "evicted": EVICTED}
    fig, ax = plt.subplots(figsize=(8.6, 5.0), dpi=90)
    for state, (x, y) in pos.items():
        _box(ax, x, y, 2.2, 1.05, text[state], color[state], dashed=state == "evicted", fontsize=9)
    # (start, end, curvature, label, label position): endpoints sit on the boxes' edges.
    edges = [
        ((0.4, 0.55), (2.85, 2.1), -0.25, "get_new_blocks\n(popped from the head)", (0.6, 1.75)),
        ((2.85, 1.7), (1.15, 0.2), 0.0, "free_blocks: ref_cnt→0,\nno hash: to the head", (2.55, 0.75)),
        ((5.15, 2.1), (7.6, 0.55), -0.25, "free_blocks: ref_cnt→0,\nhashed: to the tail", (7.4, 1.75)),
        ((6.85, 0.2), (5.15, 1.7), 0.0, "touch (a hit):\nout of the queue", (5.45, 0.75)),
        ((8.0, -0.55), (5.15, -2.0), -0.3, "get_new_blocks\npops it at the head", (7.6, -1.65)),
        ((4.0, -1.45), (4.0, 1.45), 0.0, "same call:\nref_cnt = 1", (4.0, 0.0)),
    ]
    for start, end, rad, label, (lx, ly) in edges:
        _arrow(ax, start, end, rad=rad)
        ax.text(lx, ly, label, ha="center", va="center", fontsize=8, bbox={"fc": "white", "ec": "none", "pad": 0.5})
    x, y = pos["in use"]
    ax.text(
        x,
        y + 0.6,
        "cache_full_blocks names a block once it is full;\ntouch on a held block: ref_cnt + 1",
        ha="center",
        va="bottom",
        fontsize=8,
    )
    ax.text(
        4.0,
        -2.75,
        "reset_prefix_cache, allowed only while no block is in use, drops every hash: "
        "all cached-free blocks become free.",
        ha="center",
        va="top",
        fontsize=8,
        color="#555",
    )
    ax.set_xlim(-1.3, 9.3)
    ax.set_ylim(-3.1, 3.3)
    ax.set_axis_off()
    ax.set_title(
        f"block lifecycle, counted from the pool now ({pool.num_gpu_blocks - 1} usable blocks; "
        "the null block is not counted)",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


# ---- chapter 04: hash chains as a tree --------------------------------------------------------
def _chain(tokens: Sequence[int], block_size: int, hash_fn, root: BlockHash) -> list[BlockHash]:
    hashes, parent = [], root
    for end in range(block_size, len(tokens) + 1, block_size):
        parent = hash_block_tokens(parent, tokens[end - block_size : end], None, hash_fn)
        hashes.append(parent)
    return hashes


def hash_chain_tree(
    prompts: Sequence[Sequence[int]],
    block_size: int,
    pool=None,
    labels: Sequence[str] | None = None,
    hash_algo: str = "xxhash",
) -> Figure:
    """The prompts' block-hash chains merged into a tree; see the module docstring."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}.")
    labels = list(labels) if labels is not None else [f"prompt {i}" for i in range(len(prompts))]
    if len(labels) != len(prompts):
        raise ValueError(f"{len(labels)} labels for {len(prompts)} prompts.")
    hash_fn = get_hash_fn_by_name(hash_algo)
    root = make_none_hash(hash_fn)
    chains = [_chain(list(p), block_size, hash_fn, root) for p in prompts]

    # A trie over hash sequences: a node is the path to it, so equal hashes at one depth share a node.
    children: dict[tuple, list[tuple]] = {(): []}
    ends: dict[tuple, list[int]] = {}
    for i, chain in enumerate(chains):
        path: tuple = ()
        for h in chain:
            child = (*path, h)
            if child not in children:
                children[child] = []
                children[path].append(child)
            path = child
        ends.setdefault(path, []).append(i)

    y: dict[tuple, float] = {}
    label_rows: dict[int, int] = {}
    next_row = [0]

    def place(node):
        rows = []
        for i in ends.get(node, ()):  # each prompt ending here gets a row for its label
            label_rows[i] = next_row[0]
            rows.append(next_row[0])
            next_row[0] += 1
        for child in children[node]:
            place(child)
            rows.append(y[child])
        y[node] = sum(rows) / len(rows) if rows else next_row[0]

    place(())
    depth = max((len(n) for n in children), default=0)
    fig, ax = plt.subplots(figsize=(1.45 * (depth + 2) + 1.5, 0.62 * max(next_row[0], 1) + 1.3), dpi=90)
    lookup = getattr(pool, "cached_block_hash_to_block", None) if pool is not None else None
    w, h = 1.1, 0.46
    _box(ax, 0, y[()], 0.8, h, "root", SENTINEL, dashed=True, fontsize=8)
    for node in children:
        if not node:
            continue
        block = lookup.get_one_block(node[-1]) if lookup is not None else None
        text = f"b{len(node) - 1} {node[-1].hex()[:6]}" + (f"\n→ block {block.block_id}" if block else "")
        _box(ax, 1.4 * len(node), y[node], w, h, text, CACHED if block else "#ffffff", fontsize=7.5)
        parent = node[:-1]
        px = 1.4 * len(parent) + (0.4 if not parent else w / 2)
        _arrow(ax, (px, y[parent]), (1.4 * len(node) - w / 2, y[node]), style="-")
    for node, idxs in ends.items():
        for i in idxs:
            row = label_rows[i]
            rest = len(prompts[i]) % block_size
            x = 1.4 * len(node) + (w / 2 if node else 0.4)
            tail = f"  + {rest} token{'s' if rest > 1 else ''} in a partial block, no hash" if rest else ""
            ax.text(
                x + 0.12,
                row,
                f"{labels[i]} ({len(prompts[i])} tok){tail}",
                ha="left",
                va="center",
                fontsize=8,
                style="italic",
            )
    handles = [plt.Rectangle((0, 0), 1, 1, fc="#ffffff", ec="#333", label="full block, its hash (first hex digits)")]
    if pool is not None:
        handles.append(plt.Rectangle((0, 0), 1, 1, fc=CACHED, ec="#333", label="held by the pool's prefix cache"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2, fontsize=7.5, frameon=False)
    ax.set_xlim(-0.6, 1.4 * (depth + 1) + 2.6)
    ax.set_ylim(next_row[0] - 0.4 if next_row[0] else 0.6, -0.6)
    ax.set_axis_off()
    ax.set_title(f"block-hash chains, {block_size} tokens per block, {hash_algo}", fontsize=10)
    fig.tight_layout()
    return fig
