"""Why nanoengine's Linear does not call F.linear on an x86 CPU: the fp32 GEMMs of SmolLM2, timed both ways.

    python bench/gemm.py          # writes bench/results/gemm_cpu.json
    python bench/gemm.py --int4   # writes bench/results/gemm_int4_cpu.json

For each projection shape of one SmolLM2 layer (and the vocabulary projection) and a batch of
1, 32 and 620 tokens (one decode, a cached-prompt step, a whole chatbot prompt), it times:
  - F.linear, the baseline, which on CPU calls MKL's sgemm;
  - nanoengine's Linear, which calls oneDNN with the weight packed once into its blocked layout.
Both are fp32 and agree to summation order; the table also prints their largest difference.
Times are medians of 30 runs after 5 warm-ups, in the same process, with torch's default threads.

--int4 times instead, in bf16, each projection of a layer with Q4_1-form weights at 1 to 32 rows: the dense
Linear (bf16, or fp32 above one row where the CPU has no native bf16: llama.CPU_BF16) against torch's 4-bit kernel
(Q4GroupLinear's two paths). Alone, from a hot cache; Q4GroupLinear.MAX_ROWS also weighs a step's, where a dense fp32
weight is read from memory (see its comment).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import gguf
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tqdm import tqdm

from bench.machine import machine_info
from nanoengine.model.llama import CPU_BF16, ONEDNN_LINEAR, Linear, Q4GroupLinear, q4_groups

RESULTS = ROOT / "bench" / "results" / "gemm_cpu.json"
INT4_RESULTS = ROOT / "bench" / "results" / "gemm_int4_cpu.json"
# (name, out_features, in_features) for SmolLM2-135M: hidden 576, 9 + 2 * 3 heads of 64, MLP 1536.
SHAPES = [
    ("qkv_proj", 960, 576),
    ("o_proj", 576, 576),
    ("gate_up_proj", 3072, 576),
    ("down_proj", 576, 1536),
    ("lm_head", 49152, 576),
]
BATCHES = [1, 32, 620]
INT4_BATCHES = [1, 2, 4, 8, 16, 32]


def median_us(fn, runs: int = 30, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times)


def q4_1_linear(n: int, k: int, gen: torch.Generator) -> Q4GroupLinear:
    """A bf16 Q4GroupLinear of a random weight through llama.cpp's Q4_1 (gguf-py's quantizer), as the loader
    reads a GGUF's 4-bit projection."""
    q4_1 = gguf.GGMLQuantizationType.Q4_1
    weight = gguf.quants.quantize((0.02 * torch.randn(n, k, generator=gen)).numpy(), q4_1)
    layer = Linear(k, n, bias=False).requires_grad_(False)
    layer.weight.copy_(torch.from_numpy(gguf.quants.dequantize(weight, q4_1).copy()))
    found = q4_groups(layer.weight)
    assert found is not None
    return Q4GroupLinear(layer, *found).to(torch.bfloat16)


def main_int4() -> dict:
    gen = torch.Generator().manual_seed(0)
    rows = []
    with tqdm(total=(len(SHAPES) - 1) * len(INT4_BATCHES), desc="int4 shapes", unit="shape") as bar:
        for name, n, k in SHAPES[:-1]:  # lm_head is the tied embedding, Q8_0 in the GGUF: it stays dense
            layer = q4_1_linear(n, k, gen)
            for m in INT4_BATCHES:
                x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
                dense = median_us(functools.partial(layer.dense, x))
                int4 = median_us(functools.partial(layer.forward_4bit, x))
                rows.append({"name": name, "m": m, "n": n, "k": k, "dense_us": dense, "int4_us": int4})
                rows[-1]["int4_speedup"] = dense / int4
                bar.update(1)
    report = {
        "machine": {**machine_info(), "torch": torch.__version__, "threads": torch.get_num_threads()},
        "dense": "bf16" if CPU_BF16 else "fp32 above one row (no native bf16)",
        "rows": rows,
        "max_rows_int4_faster_everywhere": max(
            (m for m in INT4_BATCHES if all(r["int4_speedup"] > 1 for r in rows if r["m"] <= m)), default=0
        ),
    }
    print(f"\n{'projection':14}{'tokens':>7}{'dense':>12}{'4-bit':>9}{'speed-up':>10}   (dense: {report['dense']})")
    for r in rows:
        print(f"{r['name']:14}{r['m']:>7}{r['dense_us']:>10.0f}us{r['int4_us']:>7.0f}us{r['int4_speedup']:>9.2f}x")
    print(f"4-bit faster for every projection up to {report['max_rows_int4_faster_everywhere']} rows")
    INT4_RESULTS.write_text(json.dumps(report, indent=2))
    print(f"wrote {INT4_RESULTS.relative_to(ROOT)}")
    return report


def main() -> dict:
    if not ONEDNN_LINEAR:
        raise SystemExit("This torch build or CPU has no oneDNN path; Linear already runs F.linear here.")
    gen = torch.Generator().manual_seed(0)
    rows = []
    with tqdm(total=len(SHAPES) * len(BATCHES), desc="GEMM shapes", unit="shape") as bar:
        for name, n, k in SHAPES:
            layer = Linear(k, n, bias=False).requires_grad_(False)
            layer.weight.copy_(0.02 * torch.randn(n, k, generator=gen))
            for m in BATCHES:
                x = torch.randn(m, k, generator=gen)
                mkl = median_us(functools.partial(F.linear, x, layer.weight))
                onednn = median_us(functools.partial(layer, x))
                diff = (layer(x) - F.linear(x, layer.weight)).abs().max().item()
                rows.append(
                    {
                        "name": name,
                        "m": m,
                        "n": n,
                        "k": k,
                        "f_linear_us": mkl,
                        "linear_us": onednn,
                        "speedup": mkl / onednn,
                        "gflops": 2 * m * n * k / onednn / 1e3,
                        "max_abs_diff": diff,
                    }
                )
                bar.update(1)
    report = {
        "machine": {**machine_info(), "torch": torch.__version__, "threads": torch.get_num_threads()},
        "rows": rows,
    }
    print(
        f"\n{'projection':14}{'tokens':>7}{'F.linear':>11}{'Linear':>10}{'speed-up':>10}{'GFLOP/s':>9}{'max diff':>10}"
    )
    for r in rows:
        print(
            f"{r['name']:14}{r['m']:>7}{r['f_linear_us']:>9.0f}us{r['linear_us']:>8.0f}us{r['speedup']:>9.2f}x"
            f"{r['gflops']:>9.0f}{r['max_abs_diff']:>10.1e}"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2))
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python bench/gemm.py", description=__doc__.split("\n")[0])
    parser.add_argument("--int4", action="store_true", help="the dense Linear against the 4-bit kernel (Q4GroupLinear)")
    main_int4() if parser.parse_args().int4 else main()
