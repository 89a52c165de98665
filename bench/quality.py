"""What lower-precision weights cost in quality, against fp32 on the same machine.

Run as `python bench/quality.py`. For each precision (dtype and quantization, as LLM takes them) it reports:
  - greedy agreement with fp32 on the chatbot prompts (bench/engine.py's: system prompt + user turn, 32 new
    tokens): the share of requests whose tokens are all the same, and the share of tokens before the first
    difference;
  - the perplexity of a small text (the system prompt itself, one forward pass).
Results print and go to bench/results/quality_cpu.json with the machine.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script, it still finds the engine's packages

from bench.machine import machine_info
from nanoengine.attention import ContiguousKVCache
from nanoengine.benchmarks.datasets import SYSTEM_PROMPT, USER_TURNS, chat_prompts
from nanoengine.entrypoints.llm import LLM
from nanoengine.sampling_params import SamplingParams

VARIANTS = {
    "fp32": {"dtype": "float32"},
    "bf16": {"dtype": "bfloat16"},
    "int8_weights_fp32": {"dtype": "float32", "quantization": "int8_per_channel_weight_only"},
    "int8_weights_bf16": {"dtype": "bfloat16", "quantization": "int8_per_channel_weight_only"},
    "q4_1_weights_bf16": {"dtype": "bfloat16", "quantization": "q4_1"},
}


def perplexity(llm: LLM, ids: list[int]) -> float:
    """exp of the mean next-token cross-entropy over ids, in one pass of llm's model (logits in fp32)."""
    model = llm.model
    cache = ContiguousKVCache(model.config, len(ids), dtype=llm.dtype)
    with torch.inference_mode():
        logits = model.compute_logits(model(torch.tensor(ids), torch.arange(len(ids)), cache))
    return math.exp(torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:])).item())


def agreement(outputs: list[list[int]], reference: list[list[int]]) -> dict:
    """Share of requests identical to the reference, and share of tokens before each one's first difference."""
    prefix = [
        next((i for i, (a, b) in enumerate(zip(o, r)) if a != b), min(len(o), len(r)))
        for o, r in zip(outputs, reference)
    ]
    return {
        "same_requests": sum(o == r for o, r in zip(outputs, reference)) / len(reference),
        "same_prefix_tokens": sum(prefix) / sum(len(r) for r in reference),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python bench/quality.py", description=__doc__.split("\n")[0])
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "quality_cpu.json"))
    args = parser.parse_args(argv)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    results: dict[str, dict] = {}
    reference: list[list[int]] = []
    for name, kwargs in VARIANTS.items():
        llm = LLM(device="cpu", progress=False, **kwargs)
        tok = llm.tokenizer
        prompts = chat_prompts(tok)
        outputs = [o.token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params)]
        reference = reference or outputs
        results[name] = {"kwargs": kwargs, "perplexity": perplexity(llm, tok.encode(SYSTEM_PROMPT))} | agreement(
            outputs, reference
        )
        print(
            f"{name:20} ppl {results[name]['perplexity']:.3f}  same requests {results[name]['same_requests']:.0%}  "
            f"same tokens {results[name]['same_prefix_tokens']:.0%}"
        )
    report = {
        "workload": {"prompts": len(USER_TURNS), "max_tokens": args.max_tokens, "perplexity_text": "SYSTEM_PROMPT"},
        "machine": machine_info() | {"torch": torch.__version__, "torch_threads": torch.get_num_threads()},
        "results": results,
    }
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
