"""Chapter 01's tools: a recorder for what attention sees, greedy generation with and without a KV
cache, and the KV-memory calculator (bytes per token, per block, per batch, and what a budget holds).

Every byte count comes from a real LlamaConfig through the engine's own arithmetic
(LlamaConfig.kv_bytes_per_token, PagedKVCache.bytes_per_block), so the calculator cannot disagree
with the pool `LLM(...)` actually allocates.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import ipywidgets as widgets
import torch

from nanocourse.live import show_view
from nanoengine.attention import AttentionContext, ContiguousKVCache
from nanoengine.attention.paged import PagedKVCache
from nanoengine.config import LlamaConfig
from nanoengine.worker.worker import DEFAULT_CPU_KV_BYTES


# ---- what the model hands to attention -------------------------------------------------------
class RecordingAttention:
    """Wraps an attention context and records the shapes of q, k and v each layer passes to it."""

    def __init__(self, inner: AttentionContext):
        self.inner = inner
        self.calls: list[tuple[int, tuple, tuple, tuple]] = []

    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.calls.append((layer_idx, tuple(q.shape), tuple(k.shape), tuple(v.shape)))
        return self.inner(layer_idx, q, k, v)

    def __getattr__(self, name):
        # Everything else (num_tokens, advance) is the wrapped cache's, so the recorder drops in anywhere.
        return getattr(self.inner, name)


def forward_step(model, token_ids: list[int], cache: ContiguousKVCache | RecordingAttention) -> torch.Tensor:
    """Run `token_ids` as the next positions of `cache`'s sequence; return the last token's logits [V].

    `cache` is a ContiguousKVCache, or a RecordingAttention around one.
    Invariant: afterwards the cache holds K/V for every token it has seen, these ones included.
    """
    start = cache.num_tokens
    with torch.inference_mode():
        hidden = model(torch.tensor(token_ids), torch.arange(start, start + len(token_ids)), cache)
        cache.advance(len(token_ids))
        return model.compute_logits(hidden[-1:])[0]


@dataclass(slots=True)
class GenerationTrace:
    """One greedy generation: the new tokens, each step's wall time, and how many token rows each step
    pushed through the projections and MLPs (the work a KV cache saves)."""

    token_ids: list[int] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)


def greedy_generate(model, prompt_ids: list[int], max_new_tokens: int, use_cache: bool = True) -> GenerationTrace:
    """Greedy decoding, one token per step. With the cache, step 0 is the prefill and every later step
    feeds one token; without it, every step recomputes the whole sequence from an empty cache."""
    trace, seq = GenerationTrace(), list(prompt_ids)
    cache = ContiguousKVCache(model.config, len(prompt_ids) + max_new_tokens)
    for _ in range(max_new_tokens):
        if not use_cache:
            cache = ContiguousKVCache(model.config, len(seq))
        feed = seq[cache.num_tokens :]
        t0 = time.perf_counter()
        next_id = int(forward_step(model, feed, cache).argmax())
        trace.step_seconds.append(time.perf_counter() - t0)
        trace.rows.append(len(feed))
        trace.token_ids.append(next_id)
        seq.append(next_id)
    return trace


# ---- the KV-memory calculator -------------------------------------------------------------------
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}

BUDGETS = {
    "nanoengine CPU default (512 MiB)": DEFAULT_CPU_KV_BYTES,
    "8 GiB": 8 * 2**30,
    "the blog post's H100 pool (45 GB)": 45 * 10**9,
    "80 GiB": 80 * 2**30,
}

CONTEXTS = tuple(2**k for k in range(8, 18))  # 256 .. 131072 tokens


def llama_70b() -> LlamaConfig:
    """Llama 3.1 70B's real shape: 80 layers, 64 query heads sharing 8 KV heads of dim 128."""
    return LlamaConfig(
        vocab_size=128256,
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=128,
        rope_theta=500000.0,
        max_position_embeddings=131072,
        bos_token_id=128000,
        eos_token_id=128009,
        tie_word_embeddings=False,
    )


def llama_8b() -> LlamaConfig:
    """Llama 3.1 8B: 32 layers, 32 query heads sharing 8 KV heads of dim 128."""
    return LlamaConfig(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        rope_theta=500000.0,
        max_position_embeddings=131072,
        bos_token_id=128000,
        eos_token_id=128009,
        tie_word_embeddings=False,
    )


@dataclass(slots=True, frozen=True)
class KVMemory:
    """The KV footprint of `batch` requests of `context` tokens each, against `budget_bytes`.

    Invariants: bytes_per_block == block_size * bytes_per_token; a request takes whole blocks;
    budget_blocks leaves out block 0, the null block the engine's pool reserves (as vLLM's does),
    so budget_tokens equals `LLM(kv_cache_memory_bytes=budget_bytes).num_kv_tokens`.
    """

    block_size: int
    context: int
    batch: int
    budget_bytes: int
    bytes_per_token: int
    bytes_per_block: int
    blocks_per_request: int
    budget_blocks: int

    @property
    def total_bytes(self) -> int:
        """What the batch occupies in whole blocks (a partial last block still costs a full one)."""
        return self.batch * self.blocks_per_request * self.bytes_per_block

    @property
    def budget_tokens(self) -> int:
        return self.budget_blocks * self.block_size

    @property
    def max_batch(self) -> int:
        """How many requests of this context fit in the budget at once."""
        return self.budget_blocks // self.blocks_per_request

    @property
    def fits(self) -> bool:
        return self.batch <= self.max_batch


def kv_memory(
    config: LlamaConfig, dtype: torch.dtype, context: int, batch: int, budget_bytes: int, block_size: int = 16
) -> KVMemory:
    per_block = PagedKVCache.bytes_per_block(config, block_size, dtype)
    return KVMemory(
        block_size=block_size,
        context=context,
        batch=batch,
        budget_bytes=budget_bytes,
        bytes_per_token=config.kv_bytes_per_token(torch.empty((), dtype=dtype).element_size()),
        bytes_per_block=per_block,
        blocks_per_request=-(-context // block_size),
        budget_blocks=max(budget_bytes // per_block - 1, 0),
    )


def fmt_bytes(n: int) -> str:
    """Both units, because papers and vendors say MB/GB (powers of 10) and allocators count MiB/GiB (powers of 2)."""
    for power, dec, binary in ((4, "TB", "TiB"), (3, "GB", "GiB"), (2, "MB", "MiB"), (1, "kB", "KiB")):
        if n >= 1000**power:
            return f"{n:,} B ({n / 1000**power:.2f} {dec}, {n / 1024**power:.2f} {binary})"
    return f"{n:,} B"


def summary_lines(m: KVMemory) -> list[tuple[str, str]]:
    verdict = "fits" if m.fits else f"does NOT fit (at most {m.max_batch:,} such requests)"
    return [
        ("per token", fmt_bytes(m.bytes_per_token)),
        (f"per block ({m.block_size} tokens)", fmt_bytes(m.bytes_per_block)),
        (f"one request of {m.context:,} tokens", f"{m.blocks_per_request:,} blocks"),
        (f"batch of {m.batch}", f"{fmt_bytes(m.total_bytes)}: {verdict}"),
        ("budget", fmt_bytes(m.budget_bytes)),
        ("budget holds", f"{m.budget_blocks:,} blocks = {m.budget_tokens:,} tokens (null block excluded)"),
    ]


class KVMemoryCalculator:
    """Pick a model, a dtype, a context length, a batch size and a memory budget; read the KV bill.

    `presets` maps a label to a real LlamaConfig (the notebook passes `llm.config` for SmolLM2).
    The controls are public widgets, so tests and notebooks set `.context.value` etc. from Python;
    `.result` is the KVMemory the display shows.
    """

    def __init__(self, presets: dict[str, LlamaConfig], block_size: int = 16):
        self.presets, self.block_size = presets, block_size
        style = {"description_width": "110px"}
        self.model = widgets.Dropdown(options=list(presets), description="model", style=style)
        self.dtype = widgets.Dropdown(options=list(DTYPES), value="fp32", description="KV dtype", style=style)
        self.context = widgets.SelectionSlider(
            options=CONTEXTS, value=4096, description="context (tokens)", style=style, layout={"width": "480px"}
        )
        self.batch = widgets.IntSlider(
            value=1, min=1, max=256, description="batch", style=style, layout={"width": "480px"}
        )
        self.budget = widgets.Dropdown(
            options=list(BUDGETS), description="memory budget", style=style, layout={"width": "480px"}
        )
        self.output = widgets.HTML()
        for control in (self.model, self.dtype, self.context, self.batch, self.budget):
            control.observe(lambda _: self.refresh(), names="value")
        self.widget = widgets.VBox([self.model, self.dtype, self.context, self.batch, self.budget, self.output])
        self.refresh()

    @property
    def config(self) -> LlamaConfig:
        return self.presets[self.model.value]

    @property
    def result(self) -> KVMemory:
        return kv_memory(
            self.config,
            DTYPES[self.dtype.value],
            self.context.value,
            self.batch.value,
            BUDGETS[self.budget.value],
            self.block_size,
        )

    def warnings(self) -> list[str]:
        limit = self.config.max_position_embeddings
        return (
            [f"{self.model.value} has {limit:,} positions; a {self.context.value:,}-token context is past them"]
            if self.context.value > limit
            else []
        )

    def summary(self) -> str:
        """The display as plain text (what nbval and the tests read)."""
        lines = [f"{label:>36}: {value}" for label, value in summary_lines(self.result)]
        return "\n".join(lines + [f"warning: {w}" for w in self.warnings()])

    def refresh(self) -> None:
        m = self.result
        rows = "".join(
            f"<tr><th style='text-align:right;padding-right:10px'>{label}</th><td>{value}</td></tr>"
            for label, value in summary_lines(m)
        )
        share = min(m.total_bytes / m.budget_bytes, 1.0)
        bar = (
            f"<div style='width:460px;height:14px;border:1px solid #666'><div style='width:{share * 100:.1f}%;"
            f"height:100%;background:{'#5a9' if m.fits else '#d55'}'></div></div>"
        )
        warn = "".join(f"<p style='color:#b50'>⚠ {w}</p>" for w in self.warnings())
        self.output.value = f"<table>{rows}</table><p>share of the budget this batch needs:</p>{bar}{warn}"

    def _ipython_display_(self) -> None:
        show_view(self)
