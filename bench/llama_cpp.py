"""nanoengine against llama.cpp (llama-cpp-python) on the chatbot workload, alternating in one process.

Run as `python bench/llama_cpp.py [--llama-cpp-site DIR]` (not part of `make test`: llama-cpp-python builds from
source; DIR is a `pip install --target` folder holding it). Both engines run the embedded model's GGUF on the same
token ids (bench/engine.py's prompts: system prompt + one user turn each), greedy, `--threads` threads, and each
round runs nanoengine then llama.cpp:
  - cold TTFT: the first prompt with nothing cached;
  - cached TTFT p50: each prompt one at a time, the system prompt cached (llama.cpp reuses the longest common
    prefix of its previous request token by token, nanoengine its prefix cache in whole blocks of --block-size
    tokens, so it recomputes the shared prefix's partial last block too);
  - one request at a time: output tokens / seconds over the prompts, one after another;
  - 16 at once (nanoengine only; llama.cpp's Llama serves one sequence): every prompt submitted together.
Ratios compare the medians over rounds. Without llama_cpp it prints why and writes nothing.
Results go to bench/results/llama_cpp_cpu.json with the machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script, it still finds the engine's packages

from bench.machine import machine_info
from nanoengine.benchmarks.datasets import SYSTEM_PROMPT, chat_prompts
from nanoengine.entrypoints.llm import LLM
from nanoengine.model.loader import embedded_gguf_path
from nanoengine.sampling_params import SamplingParams

METRICS = ("cold_ttft_ms", "cached_ttft_p50_ms", "one_request_tok_s", "all_at_once_tok_s")


def skip_reason() -> str | None:
    """Why llama.cpp cannot run here, or None."""
    if importlib.util.find_spec("llama_cpp") is None:
        return (
            "llama_cpp is not importable: build llama-cpp-python (for example `CMAKE_ARGS=-DGGML_NATIVE=ON pip "
            "install --target DIR llama-cpp-python==0.3.36`) and pass --llama-cpp-site DIR"
        )
    return None


def nanoengine_round(llm: LLM, prompts: list[list[int]], max_tokens: int) -> dict:
    one = SamplingParams(temperature=0, max_tokens=1)
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    llm.reset_prefix_cache()
    cold = llm.generate(prompt_token_ids=prompts[0], sampling_params=one)[0].ttft
    cached = [llm.generate(prompt_token_ids=p, sampling_params=one)[0].ttft for p in prompts]
    start, tokens = time.perf_counter(), 0
    for p in prompts:
        tokens += len(llm.generate(prompt_token_ids=p, sampling_params=params)[0].token_ids)
    one_tok_s = tokens / (time.perf_counter() - start)
    llm.reset_prefix_cache()
    start = time.perf_counter()
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    all_tok_s = sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start)
    return _round(cold, cached, one_tok_s, all_tok_s)


def llama_cpp_round(llama, prompts: list[list[int]], max_tokens: int) -> dict:
    def ttft(p):
        start = time.perf_counter()
        llama.create_completion(p, max_tokens=1, temperature=0.0)
        return time.perf_counter() - start

    llama.reset()  # forgets the evaluated tokens, so no prefix is reused
    cold = ttft(prompts[0])
    cached = [ttft(p) for p in prompts]
    start, tokens = time.perf_counter(), 0
    for p in prompts:
        tokens += llama.create_completion(p, max_tokens=max_tokens, temperature=0.0)["usage"]["completion_tokens"]
    return _round(cold, cached, tokens / (time.perf_counter() - start), None)


def _round(cold: float, cached: list[float], one_tok_s: float, all_tok_s: float | None) -> dict:
    return {
        "cold_ttft_ms": 1000 * cold,
        "cached_ttft_p50_ms": 1000 * statistics.median(cached),
        "one_request_tok_s": one_tok_s,
        "all_at_once_tok_s": all_tok_s,
    }


def summarize(rounds: dict[str, list[dict]]) -> dict:
    """Per engine the median of each metric over its rounds (and every round), and nanoengine's ratios to
    llama.cpp: > 1 is nanoengine better (faster TTFT, more tokens/s); all_at_once against llama.cpp's one at a
    time, the issue's target being 2."""
    medians = {
        name: {m: statistics.median(r[m] for r in rs) if rs[0][m] is not None else None for m in METRICS}
        for name, rs in rounds.items()
    }
    ne, lc = medians["nanoengine"], medians["llama_cpp"]
    ratios = {
        "cold_ttft": lc["cold_ttft_ms"] / ne["cold_ttft_ms"],
        "cached_ttft_p50": lc["cached_ttft_p50_ms"] / ne["cached_ttft_p50_ms"],
        "one_request_tok_s": ne["one_request_tok_s"] / lc["one_request_tok_s"],
        "all_at_once_vs_llama_cpp_one_request": ne["all_at_once_tok_s"] / lc["one_request_tok_s"],
    }
    return {"medians": medians, "rounds": rounds, "nanoengine_vs_llama_cpp": ratios}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python bench/llama_cpp.py", description=__doc__.split("\n")[0])
    parser.add_argument("--llama-cpp-site", type=Path, default=None, help="a folder holding llama_cpp")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--dtype", default="auto", help="nanoengine's dtype (LLM(dtype=...))")
    parser.add_argument("--quantization", default=None, help="nanoengine's quantization (LLM(quantization=...))")
    parser.add_argument(
        "--block-size",
        type=int,
        default=16,
        help="nanoengine's KV block size (LLM(block_size=...)); a cached prompt's partial last block is recomputed",
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "llama_cpp_cpu.json"))
    args = parser.parse_args(argv)
    if args.llama_cpp_site is not None:
        sys.path.insert(0, str(args.llama_cpp_site))
    if reason := skip_reason():
        print(f"skipped: {reason}")
        return {"skipped": reason}
    import llama_cpp

    torch.set_num_threads(args.threads)
    gguf = embedded_gguf_path()
    llm = LLM(
        device="cpu", dtype=args.dtype, quantization=args.quantization, block_size=args.block_size, progress=False
    )
    tok = llm.tokenizer
    prompts = chat_prompts(tok)
    llama = llama_cpp.Llama(
        str(gguf), n_ctx=2048, n_batch=512, n_threads=args.threads, n_threads_batch=args.threads, verbose=False
    )
    nanoengine_round(llm, prompts[:2], 2)  # warm-up: oneDNN's first calls pack weights and build kernels
    llama_cpp_round(llama, prompts[:2], 2)
    rounds: dict[str, list[dict]] = {"nanoengine": [], "llama_cpp": []}
    for _ in range(args.rounds):
        rounds["nanoengine"].append(nanoengine_round(llm, prompts, args.max_tokens))
        rounds["llama_cpp"].append(llama_cpp_round(llama, prompts, args.max_tokens))
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    report = {
        "workload": {
            "prompts": len(prompts),
            "prompt_tokens": [len(p) for p in prompts],
            "system_prompt_tokens": len(tok.encode(SYSTEM_PROMPT)),
            # What llama.cpp reuses of a cached prompt, token by token; nanoengine reuses whole blocks of it.
            "common_prefix_tokens": len(os.path.commonprefix(prompts)),
            "max_tokens": args.max_tokens,
            "threads": args.threads,
            "gguf": gguf.name,
            "nanoengine": {"dtype": str(llm.dtype), "quantization": args.quantization, "block_size": args.block_size},
            "llama_cpp_python": llama_cpp.__version__,
        },
        "machine": machine_info() | {"torch": torch.__version__, "loadavg_after": load},
    } | summarize(rounds)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report["medians"], indent=1), json.dumps(report["nanoengine_vs_llama_cpp"], indent=1))
    return report


if __name__ == "__main__":
    main()
