"""Chapter 11 on the learner's own GPU: the bandwidth, launch-cost and CUDA-graph figures that
bench/attention.py and bench/engine.py stored for an H100, measured again here (15 s on an H200).

`measure()` returns None without CUDA. With it, it runs this module in a child Python: the chapter's
kernel runs the Triton interpreter (TRITON_INTERPRET=1 is read once, when triton is first imported),
and the kernels must be compiled for the GPU to be timed. The child reuses the benchmarks' own
measurements (bench/attention.py's copy_gbps and decode_row, bench/engine.py's all_at_once) at one
configuration each, and prints their figures as JSON in the stored files' layout, so that
nanocourse.gpu_results.figures reads both alike.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
# The stored decode bar's row (gpu_results.BAR_ROW) and its batch-1 twin, where launch cost shows.
HEADS, CONTEXT, BATCHES = "llama3-8b", 2048, (1, 64)


def measure(timeout_s: int = 300) -> dict | None:
    """This GPU's figures ({"attention": ..., "engine": ...}), or None on a machine without CUDA."""
    if not torch.cuda.is_available():
        return None
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-m", "nanocourse.gpu_live"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,  # a failure is raised below with the child's stderr
    )
    if run.returncode != 0:
        raise RuntimeError(f"measuring on the GPU failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def bench_script(name: str):
    """bench/<name>.py as a module: the benchmarks are scripts, not a package."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look it up there
    spec.loader.exec_module(module)
    return module


def attention_figures(device: torch.device, dtype: torch.dtype) -> dict:
    """The device copy and decode at HEADS, CONTEXT and each of BATCHES, eager and graph-replayed."""
    att = bench_script("attention")
    heads = next(h for h in att.GPU_HEADS if h.name == HEADS)
    copy = att.copy_gbps(device, 1 << 30)
    # Twice the largest batch's blocks plus the null block, as bench/attention.py draws its tables.
    pool = att.Pool(heads, 2 * max(BATCHES) * CONTEXT // att.BLOCK_SIZE + 1, dtype, device)
    decode = [att.decode_row(pool, heads, batch, CONTEXT, copy) for batch in BATCHES]
    return {
        "device": torch.cuda.get_device_name(device),
        "dtype": str(dtype).removeprefix("torch."),
        "copy_gbps": copy,
        "decode": decode,
    }


def chatbot_prompts(workload: dict, seed: int = 0) -> list[list[int]]:
    """Random token ids in the stored chatbot run's shape: one shared system prompt of
    workload["system_prompt_tokens"], then a different user turn up to each prompt's length."""
    rng = random.Random(seed)
    ids = lambda n: [rng.randrange(1000, 40_000) for _ in range(n)]
    system = ids(workload["system_prompt_tokens"])
    return [system + ids(n - len(system)) for n in workload["prompt_tokens"]]


def engine_figures(device: torch.device, dtype: torch.dtype, workload: dict) -> dict:
    """Output tokens/s of the stored chatbot workload submitted at once, random weights in SmolLM2's
    shapes, with CUDA graphs and without (bench/engine.py's cache-on rows)."""
    from nanoengine import LLM, SamplingParams
    from nanoengine.config import LlamaConfig
    from nanoengine.model import LlamaForCausalLM

    eng = bench_script("engine")
    model = LlamaForCausalLM.random(LlamaConfig.smollm2_135m(), device=device, dtype=dtype)
    prompts = chatbot_prompts(workload)
    params = SamplingParams(temperature=0, max_tokens=workload["max_tokens"], ignore_eos=True)
    results = {}
    for name, eager in (("nanoengine_cache_on", False), ("nanoengine_cache_on_eager", True)):
        # A small pool: the default takes 90% of the free memory, slow to allocate and not needed here.
        llm = LLM(model, enforce_eager=eager, kv_cache_memory_bytes=1 << 30, progress=False)
        eng.all_at_once(llm, prompts, params)  # the first pass compiles each kernel specialization
        outs, seconds = eng.all_at_once(llm, prompts, params)
        results[name] = {"throughput_tok_s": sum(len(o.token_ids) for o in outs) / seconds}
        del llm
    return {"results": results}


def main() -> None:
    from nanocourse.gpu_results import load_json
    from nanoengine.engine.arg_utils import default_dtype

    device = torch.device("cuda")
    dtype = default_dtype(device)
    workload = load_json("engine_cuda.json")["workload"]
    print(
        json.dumps({"attention": attention_figures(device, dtype), "engine": engine_figures(device, dtype, workload)})
    )


if __name__ == "__main__":
    main()
