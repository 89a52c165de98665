"""The chatbot benchmark: one long shared system prompt, many short user turns.

Run as `python bench/engine.py` (or `make bench`). It measures, in one run:
  - TTFT p50/p90 with requests sent one at a time, prefix caching on and off;
  - the prefix-cache hit rate (tokens);
  - output tokens/s with every request submitted at once;
and, as the baseline, the same requests through Hugging Face transformers' generate, one at a time.
Results print as a table and are written as JSON to bench/results/engine_<device>.json.
`--async-scheduling` runs instead the comparison of async scheduling (vLLM 0.33's default) with synchronous
steps: tokens/s and step time, one request and all at once, rounds alternating between the two in one run, written
to bench/results/async_scheduling_<device>.json.
`--random-weights` runs random weights in SmolLM2-135M's shapes, for a machine without the model
package (a GPU box that can download nothing): the same work, so the same speed, but meaningless text.
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
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script, it still finds the engine's packages

from bench.hf_reference import hf_model
from bench.machine import machine_info
from nanoengine.benchmarks.datasets import SYSTEM_PROMPT, USER_TURNS, chat_prompts
from nanoengine.config import LlamaConfig
from nanoengine.engine.arg_utils import default_dtype, resolve_device
from nanoengine.entrypoints.llm import LLM
from nanoengine.model import LlamaForCausalLM
from nanoengine.model.loader import embedded_gguf_path, unpacked_folder
from nanoengine.model.tokenizer import Tokenizer
from nanoengine.sampling_params import SamplingParams


def _percentile(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[int(q) - 1] if len(xs) > 1 else xs[0]


def _summary(ttfts: list[float], tokens: int, seconds: float, hit_rate: float | None) -> dict:
    return {
        "ttft_p50_ms": 1000 * statistics.median(ttfts),
        "ttft_p90_ms": 1000 * _percentile(ttfts, 90),
        "ttft_ms": [1000 * t for t in ttfts],
        "output_tokens": tokens,
        "throughput_tok_s": tokens / seconds,
        "prefix_hit_rate": hit_rate,
    }


def run_engine(
    model: LlamaForCausalLM | None,
    prompts: list[list[int]],
    params: SamplingParams,
    caching: bool,
    device: str,
    dtype: torch.dtype,
    bar,
    enforce_eager: bool = False,
) -> dict:
    """model None is the embedded SmolLM2, which LLM loads itself. On CUDA the workload runs twice
    and the second pass counts: the first compiles a Triton kernel for each new argument
    specialization (lengths divisible by 16 or not, and so on), which would land in the timings."""
    llm = LLM(
        model, enable_prefix_caching=caching, device=device, dtype=dtype, enforce_eager=enforce_eager, progress=False
    )
    llm.generate(prompt_token_ids=prompts[0][:8], sampling_params=SamplingParams(temperature=0, max_tokens=2))
    for _ in range(2 if llm.device.type == "cuda" else 1):
        llm.reset_prefix_cache()
        result = _measure(llm, prompts, params, bar)
    return result


def _measure(llm: LLM, prompts: list[list[int]], params: SamplingParams, bar) -> dict:
    queries0, hits0 = llm.get_stats().prefix_cache_queries, llm.get_stats().prefix_cache_hits
    ttfts = []
    for ids in prompts:  # one at a time: TTFT
        ttfts.append(llm.generate(prompt_token_ids=ids, sampling_params=params)[0].ttft)
        bar.update(1)
    stats = llm.get_stats()
    queries = stats.prefix_cache_queries - queries0
    hit_rate = (stats.prefix_cache_hits - hits0) / queries if queries else 0.0
    outs, seconds = all_at_once(llm, prompts, params)
    bar.update(len(prompts))
    return _summary(ttfts, sum(len(o.token_ids) for o in outs), seconds, hit_rate) | {
        "outputs": [o.token_ids for o in outs]
    }


def all_at_once(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> tuple[list, float]:
    """(outputs, seconds) of every request submitted at once from an empty prefix cache: the
    throughput run (chapter 11 repeats it on the learner's GPU)."""
    llm.reset_prefix_cache()
    start = time.perf_counter()
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    return outs, time.perf_counter() - start


def load_models(random_weights: bool, device: torch.device, dtype: torch.dtype):
    """(the HF baseline, our model or None for LLM's own load of the embedded one), same weights."""
    if importlib.util.find_spec("transformers") is None:
        raise SystemExit("The HF baseline needs transformers and accelerate: pip install -e '.[test]'")
    if random_weights:
        hf = random_hf_model().to(device=device, dtype=dtype).eval()
        return hf, LlamaForCausalLM.from_state_dict(LlamaConfig.smollm2_135m(), hf.state_dict(), device, dtype)
    return hf_model(embedded_gguf_path(), dtype).to(device), None


def random_hf_model():
    """Hugging Face's LlamaForCausalLM in SmolLM2-135M's shapes with its own random initialization (seed 0),
    fp32 on the CPU: the stand-in wherever the model package is missing (also bench/notebooks_cuda.py)."""
    import transformers

    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(LlamaConfig.smollm2_135m().to_hf())


def run_hf(model, prompts: list[list[int]], max_tokens: int, bar) -> dict:
    def gen(ids, n):
        with torch.no_grad():
            return model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=model.config.eos_token_id)

    gen(torch.tensor([prompts[0][:8]], device=model.device), 2)
    for _ in range(2 if model.device.type == "cuda" else 1):  # as run_engine: the second pass counts
        ttfts, tokens, seconds, outputs = [], 0, 0.0, []
        for p in prompts:
            ids = torch.tensor([p], device=model.device)
            start = time.perf_counter()
            gen(ids, 1)  # time to first token = prefill + one sample
            ttfts.append(time.perf_counter() - start)
            start = time.perf_counter()
            out = gen(ids, max_tokens)[0, ids.shape[1] :].tolist()
            seconds += time.perf_counter() - start
            tokens += len(out)
            outputs.append(out)
            bar.update(2)
    return _summary(ttfts, tokens, seconds, None) | {"outputs": outputs}


def time_steps(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> dict:
    """One generate() of prompts, all at once: wall seconds, output tokens, engine steps, and the seconds the
    forward passes took (ModelRunner.execute_model, timed where it runs: the execute thread under async
    scheduling). The host's share of a step is what the forward passes leave of the wall time: scheduling,
    detokenizing and the rest, which async scheduling runs beside the forward pass."""
    runner, forward = llm.engine.runner, []
    execute = runner.execute_model

    def timed(so):
        start = time.perf_counter()
        try:
            return execute(so)
        finally:
            forward.append(time.perf_counter() - start)

    runner.execute_model = timed
    llm.reset_prefix_cache()
    steps0, start = llm.get_stats().num_steps, time.perf_counter()
    try:
        outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    finally:
        del runner.execute_model
    seconds, steps = time.perf_counter() - start, llm.get_stats().num_steps - steps0
    tokens = sum(len(o.token_ids) for o in outs)
    return {
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "step_ms": 1000 * seconds / steps,
        "forward_ms": 1000 * sum(forward) / steps,
        "host_ms": 1000 * (seconds - sum(forward)) / steps,
        "outputs": [o.token_ids for o in outs],
    }


def compare_async(model, prompts, params, device: str, dtype: torch.dtype, rounds: int) -> dict:
    """Sync and async engines on the same weights, rounds alternating so that a change in the machine's load
    hits both alike: per workload (one request; every prompt at once) the medians of each, the ratio async /
    sync, and whether the tokens are the same."""
    engines = {
        mode: LLM(model, device=device, dtype=dtype, async_scheduling=mode == "async", progress=False)
        for mode in ("sync", "async")
    }
    workloads = {"one request": prompts[:1], f"{len(prompts)} at once": prompts}
    results: dict = {}
    with tqdm(total=rounds * 2 * len(workloads), desc="async scheduling", unit="run") as bar:
        for name, batch in workloads.items():
            runs: dict[str, list[dict]] = {"sync": [], "async": []}
            for llm in engines.values():  # warm-up: the first pass pays one-time costs
                time_steps(llm, batch, params)
            for _ in range(rounds):
                for mode, llm in engines.items():
                    runs[mode].append(time_steps(llm, batch, params))
                    bar.update(1)
            keys = ("tokens_per_s", "step_ms", "forward_ms", "host_ms")
            medians = {m: {k: statistics.median(r[k] for r in rs) for k in keys} for m, rs in runs.items()}
            results[name] = {
                **medians,
                "async_vs_sync": {k: medians["async"][k] / medians["sync"][k] for k in keys},
                "tokens_per_s_runs": {m: [r["tokens_per_s"] for r in rs] for m, rs in runs.items()},
                "same_tokens": all(r["outputs"] == runs["sync"][0]["outputs"] for rs in runs.values() for r in rs),
            }
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python bench/engine.py", description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--users", type=int, default=len(USER_TURNS), help="distinct user turns (max 16)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument(
        "--random-weights",
        action="store_true",
        help="random weights in SmolLM2-135M's shapes (same speed; for machines without the model)",
    )
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="folder with tokenizer.json and tokenizer_config.json (default: the embedded model's)",
    )
    parser.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16", "float16"],
        default="auto",
        help="auto: the engine's default_dtype (bfloat16 on CUDA from compute capability 8.0, "
        "float16 below it, float32 on the CPU)",
    )
    parser.add_argument("--out", default=None, help="JSON path (default bench/results/engine_<device>.json)")
    parser.add_argument(
        "--async-scheduling",
        action="store_true",
        help="compare async scheduling with synchronous steps instead (bench/results/async_scheduling_<device>.json)",
    )
    parser.add_argument("--rounds", type=int, default=5, help="--async-scheduling: rounds of each mode")
    args = parser.parse_args(argv)

    device = resolve_device(args.device)
    llm_tok = Tokenizer(args.tokenizer or unpacked_folder(None)[1])
    prompts = chat_prompts(llm_tok, args.users)
    system_tokens = len(llm_tok.encode(SYSTEM_PROMPT))
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    dtype = getattr(torch, args.dtype) if args.dtype != "auto" else default_dtype(device)
    if args.async_scheduling:
        return _async_report(args, device, dtype, prompts, params)
    hf_model, model = load_models(args.random_weights, device, dtype)
    n, cuda = len(prompts), device.type == "cuda"
    with tqdm(total=(16 if cuda else 6) * n, desc="chatbot benchmark", unit="req") as bar:
        results = {
            "hf_transformers": run_hf(hf_model, prompts, args.max_tokens, bar),
            "nanoengine_cache_off": run_engine(model, prompts, params, False, str(device), dtype, bar),
            "nanoengine_cache_on": run_engine(model, prompts, params, True, str(device), dtype, bar),
        }
        if cuda:  # what the CUDA graphs of decode steps gain
            results["nanoengine_cache_on_eager"] = run_engine(
                model, prompts, params, True, str(device), dtype, bar, True
            )
    hf = results["hf_transformers"]
    for r in results.values():
        r["ttft_p50_speedup_vs_hf"] = hf["ttft_p50_ms"] / r["ttft_p50_ms"]
        r["throughput_vs_hf"] = r["throughput_tok_s"] / hf["throughput_tok_s"]
        r["same_tokens_as_hf"] = r.pop("outputs") == hf["outputs"] if r is not hf else True
    hf.pop("outputs")
    report = {
        "workload": _workload(args, prompts) | {"system_prompt_tokens": system_tokens},
        "machine": _machine(device, dtype),
        "results": results,
    }
    _print_table(report)
    out = Path(args.out or ROOT / "bench" / "results" / f"engine_{device.type}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out.name}")
    return report


def _workload(args, prompts: list[list[int]]) -> dict:
    return {
        "users": len(prompts),
        "max_tokens": args.max_tokens,
        "prompt_tokens": [len(p) for p in prompts],
        "weights": "random in SmolLM2-135M's shapes" if args.random_weights else "SmolLM2-135M-Instruct",
    }


def _machine(device: torch.device, dtype: torch.dtype) -> dict:
    return {
        "device": str(device),
        **machine_info(),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch_threads": torch.get_num_threads(),
        "dtype": str(dtype),
        "torch": torch.__version__,
    }


def _async_report(args, device: torch.device, dtype: torch.dtype, prompts, params: SamplingParams) -> dict:
    """--async-scheduling: compare_async's results with the workload and the machine (its load average before
    the run, since other work on the cores moves both modes' numbers), printed and written as JSON."""
    model = (
        LlamaForCausalLM.random(LlamaConfig.smollm2_135m(), device=device, dtype=dtype) if args.random_weights else None
    )
    load = os.getloadavg()[0]
    report = {
        "workload": _workload(args, prompts) | {"rounds": args.rounds},
        "machine": _machine(device, dtype) | {"load_average_before": load},
        "results": compare_async(model, prompts, params, str(device), dtype, args.rounds),
    }
    print(f"\nasync scheduling vs sync, medians of {args.rounds} rounds, load average {load:.2f} before the run:")
    print(f"{'':16}{'mode':>7}{'tok/s':>9}{'step ms':>9}{'forward':>9}{'host':>8}{'same':>6}")
    for name, r in report["results"].items():
        for mode in ("sync", "async", "async_vs_sync"):
            m = r[mode]
            print(
                f"{name:16}{mode.replace('async_vs_sync', 'ratio'):>7}{m['tokens_per_s']:>9.2f}{m['step_ms']:>9.2f}{m['forward_ms']:>9.2f}"
                f"{m['host_ms']:>8.2f}{'yes' if r['same_tokens'] else 'no':>6}"
            )
    out = Path(args.out or ROOT / "bench" / "results" / f"async_scheduling_{device.type}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out.name}")
    return report


def _print_table(report: dict) -> None:
    w = report["workload"]
    print(
        f"\nchatbot workload: {w['users']} users, {w['system_prompt_tokens']}-token system prompt, "
        f"<= {w['max_tokens']} new tokens each, weights: {w['weights']}, on {report['machine']['gpu'] or report['machine']['device']} "
        f"({report['machine']['cpu']}, {report['machine']['cpu_count']} cores, {' '.join(report['machine']['vector_extensions'])})"
    )
    print(f"{'':22}{'TTFT p50':>10}{'TTFT p90':>10}{'vs HF':>8}{'hit rate':>10}{'tok/s':>9}{'vs HF':>8}{'= HF':>6}")
    for name, r in report["results"].items():
        hit = "-" if r["prefix_hit_rate"] is None else f"{100 * r['prefix_hit_rate']:.0f}%"
        print(
            f"{name:22}{r['ttft_p50_ms']:>8.0f}ms{r['ttft_p90_ms']:>8.0f}ms{r['ttft_p50_speedup_vs_hf']:>7.1f}x"
            f"{hit:>10}{r['throughput_tok_s']:>9.1f}{r['throughput_vs_hf']:>7.1f}x{'yes' if r['same_tokens_as_hf'] else 'no':>6}"
        )


if __name__ == "__main__":
    main()
