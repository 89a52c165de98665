"""Compile every Triton kernel for real GPU targets, with no GPU, and read what the compiler made.

    python bench/kernels_offline.py                  # table + bench/results/kernels_offline.json
    python bench/kernels_offline.py --record "what changed"   # also appends the figures to its history

Each launcher (store_kvcache, paged_decode with and without split-K, paged_prefill) is called on
small CPU tensors whose strides and dtypes are those the engine uses on CUDA; the kernel launches it
makes are caught, specialised by Triton's own binder exactly as a GPU launch would be (divisibility
by 16, constants), and compiled by `triton.compile` for sm_75 (Turing, the T4 of free notebook GPUs: fp16
only, it has no bf16), sm_80 and sm_90. `cuobjdump` (shipped in the
triton wheel) reads each cubin's registers per thread, stack bytes (spills) and static shared memory;
Triton's metadata gives the dynamic shared memory. From those comes the occupancy the resources allow.

The gate (tests/engine/kernels/test_offline_compile.py): every kernel compiles, no kernel spills (stack 0),
no program asks for more shared memory than one block may have (the launch would fail), and decode uses
at most DECODE_MAX_REGISTERS registers, on every target and every shape.

It must run without TRITON_INTERPRET=1, which turns every kernel into an interpreted function that
cannot be compiled; the test therefore runs it in a subprocess.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results"

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("bench/kernels_offline.py compiles for the GPU: run it without TRITON_INTERPRET=1")

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature

from nanoengine.attention import triton_kernels as tk

DECODE_MAX_REGISTERS = 128
# (name, query heads, KV heads, head_dim): SmolLM2-135M and a Llama-3-8B-like GQA shape.
SHAPES = [("smollm2", 9, 3, 64), ("llama3-8b", 32, 8, 128)]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# Streaming multiprocessor limits (CUDA C Programming Guide, compute capability table): registers,
# threads, resident programs and shared memory per SM; the most shared memory one block may opt in
# to; what the driver reserves per block; and the dtypes the engine runs there (Turing has no bf16).
TARGETS = {
    "sm_75": {
        "capability": 75,
        "registers": 65_536,
        "threads": 1_024,
        "programs": 16,
        "shared": 65_536,
        "block_shared": 65_536,
        "reserved": 0,
        "dtypes": ("fp16",),
    },
    "sm_80": {
        "capability": 80,
        "registers": 65_536,
        "threads": 2_048,
        "programs": 32,
        "shared": 167_936,
        "block_shared": 166_912,
        "reserved": 1_024,
        "dtypes": ("bf16", "fp16"),
    },
    "sm_90": {
        "capability": 90,
        "registers": 65_536,
        "threads": 2_048,
        "programs": 32,
        "shared": 233_472,
        "block_shared": 232_448,
        "reserved": 1_024,
        "dtypes": ("bf16", "fp16"),
    },
}
BLOCK_SIZE = 16
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


@dataclass(frozen=True, slots=True)
class Launch:
    """One kernel launch as the engine makes it: which case it belongs to, and its arguments."""

    case: str
    kernel: str
    args: tuple
    kwargs: dict


class _Catch:
    """Stands in for a @triton.jit kernel in triton_kernels and records `kernel[grid](...)` calls."""

    def __init__(self, name: str, sink: list, case: str):
        self.name, self.sink, self.case = name, sink, case

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.sink.append(Launch(self.case, self.name, args, kwargs))


KERNELS = ("store_kernel", "decode_kernel", "reduce_splits_kernel", "prefill_kernel")


def _launches(case: str, call) -> list[Launch]:
    sink: list[Launch] = []
    real = {name: getattr(tk, name) for name in KERNELS}
    try:
        for name in KERNELS:
            setattr(tk, name, _Catch(name, sink, case))
        call()
    finally:
        for name, fn in real.items():
            setattr(tk, name, fn)
    return sink


def engine_launches(shape: tuple, dtype_name: str, target: str) -> list[Launch]:
    """The launches of one decode step (plain and split-K), one prefill and one store, at `shape`,
    with the tiles the engine picks on `target` (tk.tiles)."""
    name, num_heads, num_kv_heads, head_dim = shape
    dtype = DTYPES[dtype_name]
    capability = divmod(TARGETS[target]["capability"], 10)
    decode_n, prefill_m, prefill_n = tk.tiles(capability)
    # 17 blocks a row: a table width that is not a multiple of 16, as the engine's usually is not,
    # and long enough for split-K to make two splits of whole tiles.
    num_blocks, seqs, width = 8, 2, 17
    cache = torch.zeros(num_blocks, BLOCK_SIZE, num_kv_heads, head_dim, dtype=dtype)
    tables = torch.zeros(seqs, width, dtype=torch.int32)
    seq_lens = torch.full((seqs,), width * BLOCK_SIZE, dtype=torch.int32)
    q = torch.zeros(seqs, num_heads, head_dim, dtype=dtype)
    tokens = torch.zeros(3 * BLOCK_SIZE, num_heads, head_dim, dtype=dtype)
    qkv_k = torch.zeros(3 * BLOCK_SIZE, num_kv_heads, head_dim, dtype=dtype)
    slots = torch.arange(3 * BLOCK_SIZE, dtype=torch.int64)
    starts = torch.tensor([0, 2 * BLOCK_SIZE, 3 * BLOCK_SIZE], dtype=torch.int32)
    tag = f"{name} {dtype_name}"
    return [
        *_launches(f"store {tag}", lambda: tk.store_kvcache(qkv_k, qkv_k, cache, cache, slots)),
        *_launches(
            f"decode {tag}",
            lambda: tk.paged_decode(q, cache, cache, tables, seq_lens, 0.1, num_splits=1, block_n=decode_n),
        ),
        *_launches(
            f"decode split-K {tag}",
            lambda: tk.paged_decode(q, cache, cache, tables, seq_lens, 0.1, num_splits=2, block_n=decode_n),
        ),
        *_launches(
            f"prefill {tag}",
            lambda: tk.paged_prefill(
                tokens,
                cache,
                cache,
                tables,
                starts,
                seq_lens,
                2 * BLOCK_SIZE,
                0.1,
                block_m=prefill_m,
                block_n=prefill_n,
            ),
        ),
    ]


def _resources(cubin: bytes) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run(
            [str(CUOBJDUMP), "--dump-resource-usage", f.name], capture_output=True, text=True, check=True
        ).stdout
    line = next(line for line in text.splitlines() if "REG:" in line)
    return {key.lower(): int(value) for key, value in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", line)}


def occupancy(target: str, registers: int, shared: int, num_warps: int) -> dict:
    """Programs (and warps) one SM can hold at these resources. Registers are allocated per warp in
    units of 256 (8 per thread); every program also reserves 1 KiB of shared memory on sm_80+ (none on sm_75)."""
    sm = TARGETS[target]
    threads = 32 * num_warps
    per_warp = -(-registers * 32 // 256) * 256
    per_program_shared = shared + sm["reserved"]
    limits = {
        "registers": sm["registers"] // (per_warp * num_warps),
        "threads": sm["threads"] // threads,
        "programs": sm["programs"],
        # sm_75 reserves nothing, so a kernel with no shared memory is not limited by it.
        "shared": sm["shared"] // per_program_shared if per_program_shared else sm["programs"],
    }
    programs = min(limits.values())
    return {
        "programs_per_sm": programs,
        "warps_per_sm": programs * num_warps,
        "limited_by": min(limits, key=limits.get),
    }


def compile_launch(launch: Launch, target: str, hints: bool = True) -> dict:
    """Compile one caught launch for `target` the way JITFunction.run would, and read its resources.

    hints=False drops the divisibility-by-16 facts Triton's binder infers from the arguments, as for
    a launch whose pointers or strides are not multiples of 16: the kernel's worst case."""
    fn = getattr(tk, launch.kernel)
    backend = make_backend(GPUTarget("cuda", TARGETS[target]["capability"], 32))
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    kwargs = dict(launch.kwargs, debug=False)
    bound, specialization, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    compiled = triton.compile(
        ASTSource(fn, signature, constexprs, attrs if hints else {}), target=backend.target, options=options.__dict__
    )
    res = _resources(compiled.asm["cubin"])
    shared = res["shared"] + compiled.metadata.shared
    return {
        "case": launch.case,
        "kernel": launch.kernel,
        "target": target,
        "hints": "engine" if hints else "none",
        "registers": res["reg"],
        "stack_bytes": res["stack"],
        "local_bytes": res["local"],
        "shared_bytes": shared,
        "num_warps": options.num_warps,
        "num_stages": options.num_stages,
        **occupancy(target, res["reg"], shared, options.num_warps),
    }


def _compile_one(job: tuple[int, str, str, str, bool]) -> dict:
    index, shape_name, dtype_name, target, hints = job
    shape = next(s for s in SHAPES if s[0] == shape_name)
    return compile_launch(engine_launches(shape, dtype_name, target)[index], target, hints)


def compile_all(workers: int = 2) -> list[dict]:
    jobs = [
        (i, shape[0], dtype, target, hints)
        for hints in (True, False)
        for shape in SHAPES
        for dtype in DTYPES
        for target in TARGETS
        if dtype in TARGETS[target]["dtypes"]
        for i in range(len(engine_launches(shape, dtype, target)))
    ]
    # fork after torch has started its thread pools can deadlock the children: spawn them.
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(_compile_one, jobs))


def gate_failures(rows: list[dict]) -> list[str]:
    """What the offline gate rejects: any spill, a program over its target's shared memory per block
    (Triton would refuse to launch it), and decode above DECODE_MAX_REGISTERS registers."""
    failures = [f"{_name(r)}: {r['stack_bytes']} B of stack (spills)" for r in rows if r["stack_bytes"] > 0]
    failures += [
        f"{_name(r)}: {r['shared_bytes']} B of shared memory > {TARGETS[r['target']]['block_shared']}"
        for r in rows
        if r["shared_bytes"] > TARGETS[r["target"]]["block_shared"]
    ]
    failures += [
        f"{_name(r)}: {r['registers']} registers > {DECODE_MAX_REGISTERS}"
        for r in rows
        if r["kernel"] == "decode_kernel" and r["registers"] > DECODE_MAX_REGISTERS
    ]
    return failures


def _name(row: dict) -> str:
    return f"{row['case']} | {row['kernel']} | {row['target']} | hints {row['hints']}"


def summary(rows: list[dict]) -> dict:
    return {_name(r): f"{r['registers']} reg, {r['stack_bytes']} B stack" for r in rows}


def write_report(rows: list[dict], out: Path, record: str | None) -> dict:
    history = json.loads(out.read_text()).get("history", []) if out.exists() else []
    if record:
        history.append({"change": record, "figures": summary(rows)})
    report = {
        "triton": triton.__version__,
        "block_size": BLOCK_SIZE,
        "decode_max_registers": DECODE_MAX_REGISTERS,
        "targets": TARGETS,  # the SM limits the occupancy was computed from, for readers without triton
        "gate_failures": gate_failures(rows),
        "kernels": rows,
        "history": history,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    return report


def print_table(rows: list[dict]) -> None:
    print(
        f"{'case':<32} {'kernel':<20} {'target':<6} {'hints':<6} {'reg':>4} {'stack':>6} {'shared':>7} {'progs/SM':>8}  limit"
    )
    for r in rows:
        print(
            f"{r['case']:<32} {r['kernel']:<20} {r['target']:<6} {r['hints']:<6} {r['registers']:>4} {r['stack_bytes']:>6} "
            f"{r['shared_bytes']:>7} {r['programs_per_sm']:>8}  {r['limited_by']}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "kernels_offline.json")
    parser.add_argument("--record", help="append these figures to the JSON's history under this name")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    rows = compile_all(args.workers)
    print_table(rows)
    report = write_report(rows, args.out, args.record)
    for failure in report["gate_failures"]:
        print("GATE:", failure)
    print(f"wrote {args.out}")
    return 1 if report["gate_failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
