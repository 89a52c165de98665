"""N-gram speculative decoding against plain decoding: output tokens/s and draft acceptance.

Run as `python bench/spec_decode.py`. Two workloads, each submitted all at once, greedy:
  - repetitive: chat requests that ask the model to copy a given text or function (nanoengine.benchmarks.datasets'
    seeded prose and code), whose answers the context already holds: drafts should be accepted;
  - chat: USER_TURNS behind SYSTEM_PROMPT (bench/engine.py's chatbot), whose answers are new text: few drafts.
Each runs with speculation off and with k = 2, 4, 8 (vLLM's n-gram defaults otherwise: prompt_lookup_min =
prompt_lookup_max = 5), every configuration `--runs` times in turn, on one engine each; the median counts.
Greedy outputs must equal speculation off's. Results print and go to bench/results/spec_decode_<device>.json
with the machine they ran on.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script, it still finds the engine's packages and bench/engine.py

from bench.engine import all_at_once
from bench.machine import machine_info
from nanoengine.benchmarks.datasets import SYSTEM_PROMPT, USER_TURNS, chatbot, prose
from nanoengine.entrypoints.llm import LLM
from nanoengine.sampling_params import SamplingParams

KS = (2, 4, 8)
CODE = '''def fare(distance, zone):
    """The fare for one trip."""
    base = 3 * distance + zone
    return round(base * 0.85, 2)


def refund(distance, zone):
    """The refund for one trip."""
    base = 3 * distance + zone
    return round(base * 0.5, 2)
'''


def repetitive(tok, n: int) -> list[list[int]]:
    """Requests to copy a text given in full: prose of about 60 tokens, or a short module of code."""
    rng = random.Random(0)
    texts = [prose(tok, rng, 60) if i % 2 == 0 else CODE for i in range(n)]
    ask = "Copy the following text exactly, word for word:\n\n"
    return [tok.encode(tok.apply_chat_template([{"role": "user", "content": ask + t}])) for t in texts]


def chat(tok, n: int) -> list[list[int]]:
    """The chatbot's first n questions behind its system prompt: answers are new text."""
    return [list(p) for p in chatbot(tok, n, system_tokens=len(tok.encode(SYSTEM_PROMPT))).prompts]


def run(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> dict:
    before = llm.get_stats()
    drafts, accepted, steps = before.num_draft_tokens, before.num_accepted_tokens, before.num_steps
    outs, seconds = all_at_once(llm, prompts, params)
    stats = llm.get_stats()
    tokens = sum(len(o.token_ids) for o in outs)
    return {
        "tokens_per_s": tokens / seconds,
        "output_tokens": tokens,
        "outputs": [o.token_ids for o in outs],
        "draft_tokens": stats.num_draft_tokens - drafts,
        "accepted_tokens": stats.num_accepted_tokens - accepted,
        "steps": stats.num_steps - steps,
    }


def measure(workload: list[list[int]], params: SamplingParams, runs: int, ks=KS, prompt_lookup=(5, 5)) -> dict:
    """Every configuration (speculation off, then n-gram with each k and prompt_lookup = (min, max)), one engine
    each, runs in turn `runs` times (so a slow spell of the machine hits all of them alike); the median run of
    each counts. Chapter 13 runs it live, once."""
    configs = {"off": None} | {
        f"k={k}": {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_min": prompt_lookup[0],
            "prompt_lookup_max": prompt_lookup[1],
        }
        for k in ks
    }
    # A pool of the CPU's default size each: on a GPU, sizing from free memory would leave the later engines none.
    engines = {
        name: LLM(speculative_config=spec, progress=False, kv_cache_memory_bytes=512 * 2**20)
        for name, spec in configs.items()
    }
    for llm in engines.values():  # warm-up: first-call costs stay out of the timings
        llm.generate(prompt_token_ids=workload[0], sampling_params=SamplingParams(temperature=0, max_tokens=4))
    samples: dict[str, list[dict]] = {name: [] for name in engines}
    for _ in range(runs):
        for name, llm in engines.items():
            samples[name].append(run(llm, workload, params))
    base = statistics.median(s["tokens_per_s"] for s in samples["off"])
    results = {}
    for name, runs_ in samples.items():
        tps = statistics.median(s["tokens_per_s"] for s in runs_)
        drafts, accepted = sum(s["draft_tokens"] for s in runs_), sum(s["accepted_tokens"] for s in runs_)
        results[name] = {
            "tokens_per_s": tps,
            "tokens_per_s_runs": [s["tokens_per_s"] for s in runs_],
            "speedup": tps / base,
            "draft_tokens": drafts,
            "accepted_tokens": accepted,
            "acceptance_rate": accepted / drafts if drafts else None,
            "steps": runs_[0]["steps"],
            "same_tokens_as_off": runs_[0]["outputs"] == samples["off"][0]["outputs"],
        }
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4, help="requests per workload, submitted at once")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "spec_decode_cpu.json")
    args = parser.parse_args(argv)
    tok = LLM(progress=False).tokenizer
    workloads = {"repetitive": repetitive(tok, args.requests), "chat": chat(tok, args.requests)}
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    report = {
        "machine": {"device": "cpu", **machine_info()},
        "workload": {
            "requests": args.requests,
            "max_tokens": args.max_tokens,
            "runs": args.runs,
            "chat_questions": USER_TURNS[: args.requests],
            "prompt_lookup": [5, 5],
            "greedy": True,
        },
        "results": {},
    }
    for name, prompts in workloads.items():
        start = time.perf_counter()
        report["results"][name] = measure(prompts, params, args.runs)
        print(
            f"\n{name} ({len(prompts)} requests, <= {args.max_tokens} tokens each, {time.perf_counter() - start:.0f} s)"
        )
        print(f"{'':8}{'tok/s':>9}{'vs off':>9}{'accepted':>10}{'= off':>7}")
        for config, r in report["results"][name].items():
            rate = "-" if r["acceptance_rate"] is None else f"{100 * r['acceptance_rate']:.0f}%"
            print(f"{config:8}{r['tokens_per_s']:>9.1f}{r['speedup']:>8.2f}x{rate:>10}{r['same_tokens_as_off']!s:>7}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
