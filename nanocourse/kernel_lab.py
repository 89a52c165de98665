"""Chapter 03's kernel lab: the engine's Triton paged-attention kernels on tiny shapes, watched.

Runs store/decode/prefill from nanoengine.attention.triton_kernels next to TorchBackend (gather +
SDPA) and records, through the Triton interpreter, which cache slots each program loaded. (The GPU
measurements of these kernels are chapter 11's, in gpu_results.py.)

Invariants: kernels run on CPU tensors under the interpreter (TRITON_INTERPRET=1 before triton is
imported; importing triton_backend sets it when there is no CUDA). Tracing needs the interpreter: a
compiled GPU kernel's loads cannot be observed from Python.
"""

from __future__ import annotations

import html
import time
from contextlib import contextmanager
from dataclasses import dataclass

import ipywidgets as widgets
import numpy as np
import torch

from nanocourse.live import show_view
from nanoengine.attention import (
    triton_backend,  # noqa: F401  (chooses the interpreter before triton loads)
    triton_kernels,
)
from nanoengine.attention.backend import TorchBackend, decode_step_bytes  # noqa: F401  (re-exported for the notebook)

MATCH_TOL = 1e-5


# ---- a paged batch with poisoned free slots ---------------------------------------------------
@dataclass(slots=True)
class PagedBatch:
    """One step's attention inputs over a paged pool, as the engine hands them to a backend.

    Every slot no request owns (the null block 0, spare blocks, the tail of each last block) holds
    NaN, so one stray load turns the output into NaN. block_tables rows are padded with block 0.
    """

    q: torch.Tensor  # [T, Hq, D], T = sum of the query lengths
    k_cache: torch.Tensor  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [B, max_blocks + 1] int32
    seq_lens: torch.Tensor  # [B] int32, context length including the new tokens
    query_start_loc: torch.Tensor  # [B + 1] int32
    max_query_len: int
    scale: float

    @property
    def block_size(self) -> int:
        return self.k_cache.shape[1]

    @property
    def group(self) -> int:
        return self.q.shape[1] // self.k_cache.shape[2]

    def owned_slots(self, i: int) -> np.ndarray:
        """Flat slots (block_id * block_size + offset) of request i's tokens, in token order."""
        t = np.arange(int(self.seq_lens[i]))
        blocks = self.block_tables[i].numpy()[t // self.block_size].astype(np.int64)
        return blocks * self.block_size + t % self.block_size


def random_paged_batch(
    seq_lens: list[int],
    query_lens: list[int] | None = None,
    *,
    num_kv_heads: int = 1,
    group: int = 3,
    head_dim: int = 16,
    block_size: int = 8,
    spare_blocks: int = 2,
    seed: int = 0,
) -> PagedBatch:
    """Random fp32 K/V for requests of seq_lens tokens, in blocks drawn at random from the pool.

    query_lens None means one new token per request (a decode step).
    """
    query_lens = query_lens or [1] * len(seq_lens)
    gen = torch.Generator().manual_seed(seed)
    counts = [-(-n // block_size) for n in seq_lens]
    num_blocks = 1 + sum(counts) + spare_blocks
    ids = (torch.randperm(num_blocks - 1, generator=gen) + 1).int().split(counts + [spare_blocks])
    tables = torch.zeros(len(seq_lens), max(counts) + 1, dtype=torch.int32)
    for i, chunk in enumerate(ids[: len(seq_lens)]):
        tables[i, : len(chunk)] = chunk
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, torch.nan)
    v_cache = torch.full(shape, torch.nan)
    batch = PagedBatch(
        q=torch.randn(sum(query_lens), num_kv_heads * group, head_dim, generator=gen),
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=tables,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        query_start_loc=torch.tensor([0, *query_lens]).cumsum(0).int(),
        max_query_len=max(query_lens),
        scale=head_dim**-0.5,
    )
    for i in range(len(seq_lens)):
        slots = torch.from_numpy(batch.owned_slots(i))
        for cache in (k_cache, v_cache):
            cache.view(-1, num_kv_heads, head_dim)[slots] = torch.randn(
                len(slots), num_kv_heads, head_dim, generator=gen
            )
    return batch


# ---- watching the interpreter ------------------------------------------------------------------
def interpreter_active() -> bool:
    """True when the engine's kernels were defined under TRITON_INTERPRET=1."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(triton_kernels.decode_kernel, InterpretedFunction)


@dataclass(frozen=True, slots=True)
class Load:
    kernel: str  # the @triton.jit function's name
    module: str  # the module that defines it: whose kernel ran
    program: tuple[int, int, int]  # the program's (x, y, z) index in its launch grid
    addresses: np.ndarray  # byte addresses of the lanes its mask let through


@contextmanager
def trace_loads():
    """Record every tl.load lane that kernels launched inside the block actually read.

    Wraps the interpreter's launch and its one entry point for loads; a masked-off lane touches no
    memory, so it is not recorded.
    """
    if not interpreter_active():
        raise RuntimeError("tracing needs the Triton interpreter: set TRITON_INTERPRET=1 before importing triton")
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.interpreter import interpreter_builder as builder

    loads: list[Load] = []
    kernel = [("", "")]
    real_run, real_load = InterpretedFunction.run, builder.create_masked_load

    def launch(self, *args, **kwargs):
        kernel[0] = (self.fn.__name__, self.fn.__module__)
        return real_run(self, *args, **kwargs)

    def record(ptrs, mask, *rest):
        lanes = np.broadcast_to(mask.data.astype(bool), ptrs.data.shape)
        program = tuple(int(i) for i in builder.grid_idx)
        loads.append(Load(*kernel[0], program, ptrs.data[lanes].astype(np.int64)))
        return real_load(ptrs, mask, *rest)

    InterpretedFunction.run, builder.create_masked_load = launch, record
    try:
        yield loads
    finally:
        InterpretedFunction.run = real_run
        del builder.create_masked_load  # the class's own method shows through again


@contextmanager
def record_launches():
    """Names of the @triton.jit kernels launched inside the block, in order: interpreted on a CPU, or
    compiled on a GPU, where no load can be watched from Python but a launch still can."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    names: list[str] = []
    real_runs = {cls: cls.run for cls in (InterpretedFunction, JITFunction)}

    def recording(real_run):
        def run(self, *args, **kwargs):
            if not kwargs.get("warmup"):
                names.append(self.fn.__name__)
            return real_run(self, *args, **kwargs)

        return run

    for cls, real_run in real_runs.items():
        cls.run = recording(real_run)
    try:
        yield names
    finally:
        for cls, real_run in real_runs.items():
            cls.run = real_run


def slots_read(loads: list[Load], cache: torch.Tensor) -> dict[tuple[int, int, int], np.ndarray]:
    """Per program, the sorted flat slots (block * block_size + offset) it loaded from `cache`."""
    assert cache.is_contiguous()
    base, nbytes = cache.data_ptr(), cache.numel() * cache.element_size()
    slot_bytes = cache.stride(1) * cache.element_size()
    per_program: dict[tuple[int, int, int], list[np.ndarray]] = {}
    for load in loads:
        inside = load.addresses[(load.addresses >= base) & (load.addresses < base + nbytes)]
        if inside.size:
            per_program.setdefault(load.program, []).append((inside - base) // slot_bytes)
    return {p: np.unique(np.concatenate(parts)) for p, parts in sorted(per_program.items())}


# ---- one kernel run next to the reference ------------------------------------------------------
@dataclass(slots=True)
class KernelRun:
    """A Triton kernel's output, TorchBackend's, and the K-cache slots each program loaded."""

    out: torch.Tensor
    ref: torch.Tensor
    reads: dict[tuple[int, int, int], np.ndarray]  # K-cache slots, per program that loaded any
    programs: list[tuple[int, int, int]]  # every program that ran (each loads at least seq_lens)
    seconds: float

    @property
    def has_nan(self) -> bool:
        return bool(self.out.isnan().any())

    @property
    def max_abs_diff(self) -> float:
        return float((self.out - self.ref).abs().max())

    @property
    def matches(self) -> bool:
        return not self.has_nan and self.max_abs_diff < MATCH_TOL

    def slots_of(self, seq: int) -> np.ndarray:
        """Every slot any program of request `seq` loaded (program index x is the request)."""
        parts = [s for p, s in self.reads.items() if p[0] == seq]
        return np.unique(np.concatenate(parts)) if parts else np.empty(0, np.int64)


def _traced(call, kernel: str, batch: PagedBatch, ref: torch.Tensor) -> KernelRun:
    """Run call() under the tracer; keep the loads of `kernel` (split-K's reduce launch is separate)."""
    with trace_loads() as all_loads:
        start = time.perf_counter()
        out = call()
        seconds = time.perf_counter() - start
    loads = [load for load in all_loads if load.kernel == kernel]
    programs = sorted({load.program for load in loads})
    return KernelRun(out, ref, slots_read(loads, batch.k_cache), programs, seconds)


def run_decode(batch: PagedBatch, num_splits: int = 1, block_n: int = 16) -> KernelRun:
    """paged_decode (programs: request x KV head x split) against TorchBackend.decode."""
    b = batch
    ref = TorchBackend().decode(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, b.scale)
    return _traced(
        lambda: triton_kernels.paged_decode(
            b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, b.scale, num_splits=num_splits, block_n=block_n
        ),
        "decode_kernel",
        b,
        ref,
    )


def run_prefill(batch: PagedBatch, block_m: int = 16, block_n: int = 16) -> KernelRun:
    """paged_prefill (programs: request x query tile x query head) against TorchBackend.prefill."""
    b = batch
    args = (b.q, b.k_cache, b.v_cache, b.block_tables, b.query_start_loc, b.seq_lens, b.max_query_len, b.scale)
    ref = TorchBackend().prefill(*args)
    return _traced(
        lambda: triton_kernels.paged_prefill(*args, block_m=block_m, block_n=block_n), "prefill_kernel", b, ref
    )


# ---- the widget --------------------------------------------------------------------------------
# One colour per (request, split): request 0 in blues, its neighbour in oranges.
PALETTE = (("#1f77b4", "#6baed6", "#c6dbef"), ("#e6550d", "#fd8d3c", "#fdd0a2"))
UNOWNED, MISSED, STRAY = "#eeeeee", "#d62728", "#000000"


class KernelLab:
    """Sliders choose a decode step; each change runs paged_decode in the interpreter next to
    TorchBackend and draws the pool, slot by slot, coloured by the program that loaded it.

    Request 0 has `context` tokens; request 1, a fixed neighbour of NEIGHBOUR_LEN tokens, shares the
    pool. One KV head, `group` query heads. `run`, `batch`, `summary.value` and `pool.value` hold
    what is shown, so tests (and nbval) read the state from Python.
    """

    NEIGHBOUR_LEN = 11

    def __init__(self, context: int = 19, group: int = 3, block_size: int = 8, splits: int = 1, seed: int = 0):
        self.seed = seed
        self.context = widgets.IntSlider(value=context, min=1, max=40, description="context")
        self.group = widgets.IntSlider(value=group, min=1, max=4, description="GQA group")
        self.block_size = widgets.ToggleButtons(options=[8, 16], value=block_size, description="block size")
        self.splits = widgets.IntSlider(value=splits, min=1, max=3, description="splits")
        self.reshuffle = widgets.Button(description="new random pool")
        self.summary, self.pool = widgets.HTML(), widgets.HTML()
        for control in (self.context, self.group, self.block_size, self.splits):
            control.observe(lambda _: self.refresh(), names="value")
        self.reshuffle.on_click(lambda _: self.refresh(self.seed + 1))
        controls = widgets.VBox([self.context, self.group, self.block_size, self.splits, self.reshuffle])
        self.widget = widgets.HBox([controls, widgets.VBox([self.summary, self.pool])])
        self.refresh()

    def _ipython_display_(self) -> None:
        show_view(self)

    def refresh(self, seed: int | None = None) -> None:
        self.seed = self.seed if seed is None else seed
        self.batch = random_paged_batch(
            [self.context.value, self.NEIGHBOUR_LEN],
            group=self.group.value,
            block_size=self.block_size.value,
            seed=self.seed,
        )
        self.run = run_decode(self.batch, num_splits=self.splits.value)
        self.summary.value = self._summary_html()
        self.pool.value = pool_html(self.batch, self.run)

    def _summary_html(self) -> str:
        b, r = self.batch, self.run
        got_splits = 1 + max(p[2] for p in r.programs)
        verdict = "✓ matches" if r.matches else "✗ does NOT match"
        pad = max(triton_kernels.DOT_MIN, 1 << (b.group - 1).bit_length())
        table = b.block_tables[0].tolist()
        lines = [
            f"<b>{verdict} TorchBackend</b>: max |diff| {r.max_abs_diff:.1e}, NaN in output: {'yes' if r.has_nan else 'no'}",
            (
                f"{len(r.programs)} programs (request × KV head × split) in {r.seconds * 1e3:.0f} ms on the interpreter; "
                f"splits asked {self.splits.value}, launched {got_splits}"
            ),
            (
                f"request 0: table {table} → read {len(r.slots_of(0))} of its {int(b.seq_lens[0])} slots; "
                f"request 1 read {len(r.slots_of(1))} of {self.NEIGHBOUR_LEN}"
            ),
            f"each program reads K/V once for {b.group} query head(s); the kernel pads them to {pad} rows",
        ]
        return "<br>".join(lines)


def pool_html(batch: PagedBatch, run: KernelRun) -> str:
    """The pool as a grid, one row per block: each slot coloured by the program that loaded it.

    Grey: no request owns it (NaN); red: owned but never loaded; black: loaded but not owned.
    Each cell carries data-state="read|missed|stray|free" so tests can count them.
    """
    bs, num_blocks = batch.block_size, batch.k_cache.shape[0]
    owner = {int(s): (i, t) for i in range(len(batch.seq_lens)) for t, s in enumerate(batch.owned_slots(i))}
    reader = {int(s): p for p, slots in run.reads.items() for s in slots}
    label = {0: "null"}
    for i, n in enumerate(batch.seq_lens.tolist()):
        for j, block in enumerate(batch.block_tables[i, : -(-n // bs)].tolist()):
            label[block] = f"req {i} [{j}]"
    rows = []
    for block in range(num_blocks):
        cells = []
        for slot in range(block * bs, (block + 1) * bs):
            state, colour, tip = _slot_style(slot, owner.get(slot), reader.get(slot))
            cells.append(
                f'<td data-state="{state}" title="{html.escape(tip)}" '
                f'style="background:{colour};width:11px;height:11px;padding:0"></td>'
            )
        name = f"block {block} · {label.get(block, 'free')}"
        rows.append(
            f'<tr><td style="font-size:10px;padding-right:4px;white-space:nowrap">{name}</td>{"".join(cells)}</tr>'
        )
    return f'<table style="border-spacing:1px;border-collapse:separate">{"".join(rows)}</table>{LEGEND}'


def _swatch(colour: str, text: str) -> str:
    return f'<span style="background:{colour};display:inline-block;width:10px;height:10px"></span> {text}'


LEGEND = (
    '<div style="font-size:10px">'
    + " &nbsp; ".join(
        [
            _swatch(PALETTE[0][0], "request 0, split 0 (lighter: splits 1, 2)"),
            _swatch(PALETTE[1][0], "request 1"),
            _swatch(UNOWNED, "free or null (NaN)"),
            _swatch(MISSED, "owned, never read"),
            _swatch(STRAY, "read, not owned"),
        ]
    )
    + "</div>"
)


def _slot_style(slot: int, owner: tuple[int, int] | None, program: tuple[int, int, int] | None):
    if owner is None:
        return (
            ("stray", STRAY, f"slot {slot}: nobody's, yet program {program} loaded it")
            if program
            else ("free", UNOWNED, f"slot {slot}: free or null (NaN)")
        )
    seq, token = owner
    if program is None:
        return "missed", MISSED, f"slot {slot}: request {seq} token {token}, never loaded"
    colour = PALETTE[seq % 2][program[2] % 3]
    return "read", colour, f"slot {slot}: request {seq} token {token}, loaded by program {program}"
