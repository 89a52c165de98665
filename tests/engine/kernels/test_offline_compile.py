"""The offline compile gate: every Triton kernel compiles for sm_75 (Turing, the T4: fp16 only), sm_80
and sm_90 with no GPU, spills nothing, fits its target's shared memory, and decode stays within
DECODE_MAX_REGISTERS, at the shapes, dtypes and tiles the engine launches on each. The committed
bench/results/kernels_offline.json must be what this compiler produces."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="Triton is not installed (it publishes wheels for Linux only)")
pytestmark = pytest.mark.triton

ROOT = Path(__file__).resolve().parents[3]
COMMITTED = ROOT / "bench" / "results" / "kernels_offline.json"


def _key(row):
    return row["case"], row["kernel"], row["target"], row["hints"]


def _compiler_env(tmp_path) -> dict:
    """The interpreter turns kernels into Python functions that cannot be compiled: run without it, on a fresh
    cache."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "cache"), TRITON_DEFAULT_FP_FUSION="1")
    return env


def test_kernels_compile_for_sm75_sm80_and_sm90_without_spills(tmp_path):
    out = tmp_path / "kernels_offline.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "kernels_offline.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        env=_compiler_env(tmp_path),
        timeout=300,
        check=False,
    )
    report = json.loads(out.read_text())
    assert run.returncode == 0 and not report["gate_failures"], run.stdout[-3000:] + run.stderr[-3000:]

    rows = {_key(r): r for r in report["kernels"]}
    kernels = {r["kernel"] for r in rows.values()}
    assert kernels == {"store_kernel", "decode_kernel", "reduce_splits_kernel", "prefill_kernel"}
    assert {r["target"] for r in rows.values()} == {"sm_75", "sm_80", "sm_90"}
    assert {r["case"].split()[-2] for r in rows.values()} == {"smollm2", "llama3-8b"}
    assert {r["case"].split()[-1] for r in rows.values()} == {"bf16", "fp16"}
    # Turing has no bf16: the engine runs fp16 there, so that is all the gate compiles for it.
    assert {r["case"].split()[-1] for r in rows.values() if r["target"] == "sm_75"} == {"fp16"}
    for r in rows.values():
        assert {"registers", "stack_bytes", "programs_per_sm", "warps_per_sm", "limited_by"} <= r.keys()

    committed = json.loads(COMMITTED.read_text())
    assert committed["triton"] == report["triton"], "re-run python bench/kernels_offline.py for this triton"
    figures = lambda r: (r["registers"], r["stack_bytes"])
    then = {_key(r): figures(r) for r in committed["kernels"]}
    stale = [k for k, r in rows.items() if then.get(k) != figures(r)]
    assert not stale, f"{COMMITTED.name} is stale for {stale[:3]}: re-run python bench/kernels_offline.py"
    assert committed["history"][0]["change"].startswith("before"), "the JSON keeps the figures before the fixes"


DOT_RULE = """
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

@triton.jit
def dot(a, b, c, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr):
    m, k, n = tl.arange(0, M), tl.arange(0, K), tl.arange(0, N)
    x = tl.load(a + m[:, None] * K + k[None, :])
    y = tl.load(b + k[:, None] * N + n[None, :])
    tl.store(c + m[:, None] * N + n[None, :], tl.dot(x, y))

for dtype, (m, k, n) in [("bf16", (4, 64, 64)), ("bf16", (64, 64, 4)), ("bf16", (64, 8, 64)), ("fp32", (16, 4, 16))]:
    signature = {"a": f"*{dtype}", "b": f"*{dtype}", "c": "*fp32", "M": "constexpr", "K": "constexpr", "N": "constexpr"}
    try:
        triton.compile(ASTSource(fn=dot, signature=signature, constexprs={"M": m, "K": k, "N": n}),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
        print(dtype, m, k, n, "compiles")
    except Exception:
        print(dtype, m, k, n, "rejected")
"""


def test_the_gpu_compiler_needs_16_along_the_reduction_only(tmp_path):
    """What triton_kernels.DOT_MIN's comment and chapters 03 and 11 say of tl.dot on a GPU: fewer than 16 rows or
    columns compile, a reduction below 16 (bf16) or 8 (fp32) does not, which the interpreter never checks."""
    script = tmp_path / "dot_rule.py"  # @triton.jit reads its source from a file
    script.write_text(DOT_RULE)
    run = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=_compiler_env(tmp_path),
        timeout=300,
        check=False,
    )
    assert run.stdout.split("\n")[:4] == [
        "bf16 4 64 64 compiles",
        "bf16 64 64 4 compiles",
        "bf16 64 8 64 rejected",
        "fp32 16 4 16 rejected",
    ], run.stdout + run.stderr[-3000:]
