"""Time the Triton paged-attention kernels on a GPU: decode bandwidth and prefill throughput.

    python bench/attention.py                 # needs CUDA; writes bench/results/attention_<device>.{json,png}
    python bench/attention.py --interpret-smoke   # one tiny fp32 shape on the Triton interpreter

Decode runs two head shapes (Llama-3-8B: 32 query / 8 KV heads, d128; SmolLM2: 9/3, d64) for
batch {1, 8, 64} x context {512, 2048, 8192} in the engine's default dtype (bf16; fp16 below compute
capability 8.0) with 16-token blocks, the block tables drawn at
random from a pool twice the size the largest configuration needs. Its bandwidth counts the bytes
one decode step must move, 2*sum(L_b)*Hkv*D*elt (K and V) + q/o + block tables, over the median
time, and is set against a device-to-device copy measured in the same run, against SDPA on a
contiguous (unpaged) KV cache, and against gather+SDPA (TorchBackend.decode). Prefill/extend is
reported in TFLOP/s (causal pairs only) next to TorchBackend.prefill. On CUDA each decode shape is
also replayed from a CUDA graph ("graph us"): the gap to the eager time is Python and launch cost.

Times are medians from triton.testing.do_bench, which flushes the L2 cache before every run.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Chooses the Triton interpreter on a CPU-only machine, so it must come before `import triton`.
import triton
from tqdm import tqdm

from nanoengine.attention.backend import TorchBackend, decode_step_bytes
from nanoengine.attention.triton_backend import TritonBackend
from nanoengine.attention.triton_kernels import default_num_splits
from nanoengine.engine.arg_utils import default_dtype

RESULTS = ROOT / "bench" / "results"


@dataclass(frozen=True)
class Heads:
    name: str
    num_heads: int
    num_kv_heads: int
    head_dim: int


GPU_HEADS = [Heads("llama3-8b", 32, 8, 128), Heads("smollm2", 9, 3, 64)]
GPU_BATCHES = [1, 8, 64]
GPU_CONTEXTS = [512, 2048, 8192]
# (query_len, seq_len) per request: a long prompt, a batch of short prompts, extends over a prefix.
GPU_PREFILLS = {
    "1x4096 prompt": [(4096, 4096)],
    "8x512 prompts": [(512, 512)] * 8,
    "4x512 over 3584 cached": [(512, 4096)] * 4,
}
SMOKE_HEADS = [Heads("tiny", 4, 2, 16)]
SMOKE_PREFILLS = {"2x8 over 8 cached": [(8, 16)] * 2}
BLOCK_SIZE = 16


def bench_ms(fn) -> float:
    """Median milliseconds of fn()."""
    if torch.cuda.is_available():
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def graph_ms(fn) -> float:
    """Median milliseconds of fn replayed from a CUDA graph: the kernels' own time, without the
    Python and launch cost that every eager call pays (and that a captured decode step skips)."""
    fn()  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return bench_ms(graph.replay)


def copy_gbps(device, nbytes: int) -> float:
    """Device-to-device copy bandwidth, counting the read and the write."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / bench_ms(lambda: dst.copy_(src)) / 1e6


class Pool:
    """Paged K/V pools for one head shape, filled once; each configuration draws random blocks."""

    def __init__(self, heads: Heads, num_blocks: int, dtype, device):
        shape = (num_blocks, BLOCK_SIZE, heads.num_kv_heads, heads.head_dim)
        self.k = torch.randn(shape, dtype=dtype, device=device)
        self.v = torch.randn(shape, dtype=dtype, device=device)
        self.gen = torch.Generator().manual_seed(0)

    def block_tables(self, seq_lens: list[int]) -> torch.Tensor:
        """Random distinct blocks (never the null block 0) for each request, padded with 0."""
        counts = [-(-n // BLOCK_SIZE) for n in seq_lens]
        ids = (torch.randperm(self.k.shape[0] - 1, generator=self.gen)[: sum(counts)] + 1).int()
        tables = torch.zeros(len(seq_lens), max(counts), dtype=torch.int32)
        for i, chunk in enumerate(ids.split(counts)):
            tables[i, : len(chunk)] = chunk
        return tables.to(self.k.device)


def decode_row(pool: Pool, heads: Heads, batch: int, context: int, copy_bw: float) -> dict:
    device, dtype = pool.k.device, pool.k.dtype
    hq, hkv, d = heads.num_heads, heads.num_kv_heads, heads.head_dim
    q = torch.randn(batch, hq, d, dtype=dtype, device=device)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    tables = pool.block_tables([context] * batch)
    scale = d**-0.5
    k_flat = torch.randn(batch, hkv, context, d, dtype=dtype, device=device)
    v_flat = torch.randn_like(k_flat)
    triton_be, torch_be = TritonBackend(), TorchBackend()
    times = {
        "triton": bench_ms(lambda: triton_be.decode(q, pool.k, pool.v, tables, seq_lens, scale)),
        "sdpa_contiguous": bench_ms(
            lambda: torch.nn.functional.scaled_dot_product_attention(
                q.unsqueeze(2), k_flat, v_flat, scale=scale, enable_gqa=True
            )
        ),
        "gather_sdpa": bench_ms(lambda: torch_be.decode(q, pool.k, pool.v, tables, seq_lens, scale)),
    }
    if device.type == "cuda":
        times["triton_graph"] = graph_ms(lambda: triton_be.decode(q, pool.k, pool.v, tables, seq_lens, scale))
    elt = q.element_size()
    nbytes = decode_step_bytes([context] * batch, q.shape[1], hkv, d, elt, tables.shape[1])
    gbps = {name: nbytes / ms / 1e6 for name, ms in times.items()}
    return {
        "heads": heads.name,
        "batch": batch,
        "context": context,
        "bytes": nbytes,
        "num_splits": default_num_splits(q, pool.k, tables),
        **{f"{name}_ms": ms for name, ms in times.items()},
        **{f"{name}_gbps": bw for name, bw in gbps.items()},
        "pct_of_copy": 100 * gbps["triton"] / copy_bw,
        "x_vs_gather_sdpa": times["gather_sdpa"] / times["triton"],
        "x_vs_sdpa_contiguous": times["sdpa_contiguous"] / times["triton"],
    }


def prefill_row(pool: Pool, heads: Heads, label: str, chunks: list[tuple[int, int]]) -> dict:
    device, dtype = pool.k.device, pool.k.dtype
    query_lens, seq_lens = zip(*chunks)
    q = torch.randn(sum(query_lens), heads.num_heads, heads.head_dim, dtype=dtype, device=device)
    qsl = torch.tensor([0, *query_lens], device=device).cumsum(0).int()
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    tables = pool.block_tables(list(seq_lens))
    args = (q, pool.k, pool.v, tables, qsl, lens, max(query_lens), heads.head_dim**-0.5)
    times = {
        "triton": bench_ms(lambda: TritonBackend().prefill(*args)),
        "gather_sdpa": bench_ms(lambda: TorchBackend().prefill(*args)),
    }
    # New token j of a chunk of n over a context of L sees L - n + j + 1 keys; QK^T and PV, 2 flops a MAC.
    pairs = sum(n * (seq_len - n) + n * (n + 1) // 2 for n, seq_len in chunks)
    flops = 4 * pairs * heads.num_heads * heads.head_dim
    return {
        "heads": heads.name,
        "shape": label,
        "tokens": sum(query_lens),
        "flops": flops,
        **{f"{name}_ms": ms for name, ms in times.items()},
        **{f"{name}_tflops": flops / ms / 1e9 for name, ms in times.items()},
    }


def device_slug(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu-interpret"
    name = torch.cuda.get_device_name(device).lower().replace("nvidia", "")
    return "-".join(name.split())


def run(device: torch.device, dtype, heads_list, batches, contexts, prefills) -> dict:
    copy_bw = copy_gbps(device, 1 << 30 if device.type == "cuda" else 1 << 24)
    # Twice the blocks of the largest configuration, plus the null block.
    num_blocks = (
        2
        * max(
            max(batches) * -(-max(contexts) // BLOCK_SIZE),
            max(sum(-(-s // BLOCK_SIZE) for _, s in c) for c in prefills.values()),
        )
        + 1
    )
    configs = [(h, b, c) for h in heads_list for b in batches for c in contexts]
    decode, prefill = [], []
    bar = tqdm(total=len(configs) + len(heads_list) * len(prefills), desc="attention")
    for heads in heads_list:
        pool = Pool(heads, num_blocks, dtype, device)
        for _, batch, context in (cfg for cfg in configs if cfg[0] == heads):
            decode.append(decode_row(pool, heads, batch, context, copy_bw))
            bar.update()
        for label, chunks in prefills.items():
            prefill.append(prefill_row(pool, heads, label, chunks))
            bar.update()
        del pool
    bar.close()
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "dtype": str(dtype).removeprefix("torch."),
        "block_size": BLOCK_SIZE,
        "copy_gbps": copy_bw,
        "decode": decode,
        "prefill": prefill,
    }


def print_tables(results: dict) -> None:
    print(f"\n{results['device']}  copy {results['copy_gbps']:.0f} GB/s  ({results['dtype']}, block {BLOCK_SIZE})")
    print(
        f"{'heads':>10} {'B':>3} {'L':>5} {'splits':>6} {'triton GB/s':>11} {'% copy':>6} "
        f"{'SDPA GB/s':>9} {'gather GB/s':>11} {'x gather':>8} {'x SDPA':>6} {'us':>7} {'graph us':>8}"
    )
    for r in results["decode"]:
        graph = f"{1e3 * r['triton_graph_ms']:>8.1f}" if "triton_graph_ms" in r else f"{'-':>8}"
        print(
            f"{r['heads']:>10} {r['batch']:>3} {r['context']:>5} {r['num_splits']:>6} {r['triton_gbps']:>11.0f} "
            f"{r['pct_of_copy']:>6.1f} {r['sdpa_contiguous_gbps']:>9.0f} {r['gather_sdpa_gbps']:>11.0f} "
            f"{r['x_vs_gather_sdpa']:>8.2f} {r['x_vs_sdpa_contiguous']:>6.2f} {1e3 * r['triton_ms']:>7.1f} {graph}"
        )
    print(f"\n{'heads':>10} {'prefill':>24} {'triton TFLOP/s':>14} {'gather TFLOP/s':>14}")
    for r in results["prefill"]:
        print(f"{r['heads']:>10} {r['shape']:>24} {r['triton_tflops']:>14.2f} {r['gather_sdpa_tflops']:>14.2f}")


def plot(results: dict, path: Path) -> None:
    """Decode GB/s per (batch, context) for each head shape, the copy bandwidth as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heads = list(dict.fromkeys(r["heads"] for r in results["decode"]))
    fig, axes = plt.subplots(1, len(heads), figsize=(7 * len(heads), 4.5), squeeze=False)
    series = [("triton", "Triton paged"), ("sdpa_contiguous", "SDPA, contiguous KV"), ("gather_sdpa", "gather + SDPA")]
    for ax, name in zip(axes[0], heads):
        rows = [r for r in results["decode"] if r["heads"] == name]
        x = range(len(rows))
        width = 0.8 / len(series)
        for i, (key, label) in enumerate(series):
            ax.bar([j + (i - 1) * width for j in x], [r[f"{key}_gbps"] for r in rows], width, label=label)
        ax.axhline(results["copy_gbps"], color="k", linestyle="--", label="device copy")
        ax.set_xticks(list(x), [f"B={r['batch']}\nL={r['context']}" for r in rows], fontsize=8)
        ax.set_title(f"decode, {name}")
        ax.set_ylabel("GB/s")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{results['device']}, {results['dtype']}, block {results['block_size']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--interpret-smoke", action="store_true", help="without CUDA, run one tiny fp32 shape on the Triton interpreter"
    )
    parser.add_argument("--out-dir", type=Path, help="default bench/results (a temporary folder for the smoke)")
    args = parser.parse_args(argv)
    if torch.cuda.is_available():
        device = torch.device("cuda")
        results = run(device, default_dtype(device), GPU_HEADS, GPU_BATCHES, GPU_CONTEXTS, GPU_PREFILLS)
    elif args.interpret_smoke:
        # The interpreter has no bf16, and runs about one program x tile per 10 ms.
        results = run(torch.device("cpu"), torch.float32, SMOKE_HEADS, [2], [40], SMOKE_PREFILLS)
        device = torch.device("cpu")
    else:
        print("bench/attention.py needs a CUDA GPU (none found); --interpret-smoke checks the script on CPU.")
        return 0
    print_tables(results)
    out_dir = args.out_dir or (RESULTS if device.type == "cuda" else Path(tempfile.mkdtemp()))
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"attention_{device_slug(device)}"
    stem.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    plot(results, stem.with_suffix(".png"))
    print(f"wrote {stem}.json and {stem}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
