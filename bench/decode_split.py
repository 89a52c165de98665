"""Where a token goes when one request decodes alone: each part of the step knocked out in turn.

Run as `python bench/decode_split.py [--dtype D] [--quantization Q] [--tokens N] [--rounds R] [--llama-cpp-site DIR]`.
The request is the chatbot's first prompt (system prompt + user turn, greedy, N new tokens). A decode token's time is
(a request of N + 1 tokens - a request of 1) / N, the prompt cached. Then each part is made free in turn: it returns
the output it gave the first time for inputs of that shape (the tokens change, the shapes and the work left do
not), and what the token saves is that part's cost inside a step. A part costs more there than alone, since a
token's weights and context stream through caches all the parts share; and knocking one part out also spares the
others the cache lines it took, so the savings need not add up to the token.
  - projections: each layer's qkv, o, gate_up and down;
  - attention: torch's SDPA on the request's context;
  - lm_head; rmsnorm (every norm, the final one too); rotary.
With --llama-cpp-site DIR (see bench/llama_cpp.py), llama.cpp's decode token on the same GGUF is timed the same
way, its end-of-sequence token barred, alternating with nanoengine's. Also recorded: the bytes a token reads (the
weights by the tensors the model holds, the context as the torch backend's fp32 copy of one request's keys and
values) and this machine's streaming read speed by working-set size, which says where its caches end. Results go to
bench/results/decode_split_cpu.json with the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script, it still finds the engine's packages

from bench.llama_cpp import skip_reason
from bench.machine import machine_info
from nanoengine.benchmarks.datasets import chat_prompts
from nanoengine.entrypoints.llm import LLM
from nanoengine.model import llama
from nanoengine.model.loader import embedded_gguf_path
from nanoengine.sampling_params import SamplingParams

STREAM_MB = (8, 16, 32, 64, 128, 256)


def _memo(f):
    """f, answering every call after the first with the same output for args of the same shapes and dtypes."""
    seen: dict = {}

    def free(*args, **kwargs):
        key = tuple((a.shape, a.dtype) for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor))
        if key not in seen:
            seen[key] = f(*args, **kwargs)
        return seen[key]

    return free


@contextlib.contextmanager
def knocked_out(targets: list[tuple[object, str]]):
    """Each (owner, attribute) function made free (_memo) inside the block, restored after it."""
    # A module instance's forward is its class's until set; restoring it means deleting the instance's copy.
    saved = [(owner, name, getattr(owner, name), name in vars(owner)) for owner, name in targets]
    try:
        for owner, name, f, _ in saved:
            setattr(owner, name, _memo(f))
        yield
    finally:
        for owner, name, f, own in saved:
            if own:
                setattr(owner, name, f)
            else:
                delattr(owner, name)


def parts(model: torch.nn.Module) -> dict[str, list[tuple[object, str]]]:
    """By part, the (owner, attribute) functions knocked_out makes free."""
    layers = model.model.layers
    projections = [m for layer in layers for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj)]
    projections += [m for layer in layers for m in (layer.mlp.gate_up_proj, layer.mlp.down_proj)]
    return {
        "projections": [(m, "forward") for m in projections],
        "attention": [(torch.nn.functional, "scaled_dot_product_attention")],
        "lm_head": [(model.lm_head, "forward")],
        "rmsnorm": [(m, "forward") for m in model.modules() if isinstance(m, llama.RMSNorm)],
        "rotary": [(llama, "apply_rotary")],
    }


def token_ms(generate, tokens: int) -> float:
    """One decode token's milliseconds: (a request of tokens + 1 - a request of 1) / tokens, generate(n) running a
    request of n tokens on a cached prompt."""
    times = []
    for n in (1, tokens + 1):
        start = time.perf_counter()
        generate(n)
        times.append(time.perf_counter() - start)
    return 1000 * (times[1] - times[0]) / tokens


def decode_ms(llm: LLM, prompt: list[int], tokens: int) -> float:
    def generate(n: int) -> None:
        llm.generate(
            prompt_token_ids=prompt, sampling_params=SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        )

    return token_ms(generate, tokens)


def llama_cpp_decode_ms(model, prompt: list[int], tokens: int) -> float:
    """decode_ms for a llama_cpp.Llama (which reuses the prompt it saw last), its end-of-sequence token barred."""

    def generate(n: int) -> None:
        out = model.create_completion(prompt, max_tokens=n, temperature=0.0, logit_bias={model.token_eos(): -1e9})
        assert out["usage"]["completion_tokens"] == n, out["usage"]

    return token_ms(generate, tokens)


def bytes_per_token(model: torch.nn.Module, context: int) -> dict[str, int]:
    """What one decode token reads, by part: every tensor the projections and the lm_head hold (a 4-bit module
    keeps a dense copy for many rows, not read by one), and one request's fp32 keys and values."""

    def held(m: torch.nn.Module) -> int:
        if isinstance(m, llama.Q4GroupLinear):
            return m.weight_int4.nbytes + m.scales_and_zeros.nbytes
        if isinstance(m, llama.Int8WeightOnlyLinear):
            return m.weight_int8.nbytes + m.scales.nbytes
        return m.weight.nbytes

    c = model.config
    return {
        "projections": sum(held(m) for m, _ in parts(model)["projections"]),
        "lm_head": held(model.lm_head),
        "context_fp32": 2 * c.num_hidden_layers * c.num_key_value_heads * context * c.head_dim * 4,
    }


def stream_gb_s(megabytes: int) -> float:
    """The best of a few sums over an fp32 tensor of that size, in GB/s: a working set within the caches the
    process gets reads faster than one from memory."""
    x = torch.ones(megabytes * 2**20 // 4)
    best = float("inf")
    for _ in range(max(3, 256 // megabytes)):
        start = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - start)
    return x.nbytes / best / 1e9


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python bench/decode_split.py", description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--quantization", default="q4_1")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--llama-cpp-site", type=Path, default=None, help="a folder holding llama_cpp")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "decode_split_cpu.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    quantization = None if args.quantization == "none" else args.quantization
    llm = LLM(device="cpu", dtype=args.dtype, quantization=quantization, progress=False)
    prompt = chat_prompts(llm.tokenizer, 1)[0]
    decode_ms(llm, prompt, 2)  # warm-up: oneDNN packs weights on first use, and the prompt gets cached
    peer, peer_report = None, None  # llama_cpp.Llama, and what the JSON says of it
    if args.llama_cpp_site is not None:
        sys.path.insert(0, str(args.llama_cpp_site))
        if reason := skip_reason():
            print(f"llama.cpp skipped: {reason}")
            peer_report = {"skipped": reason}
        else:
            import llama_cpp as lc

            peer = lc.Llama(str(embedded_gguf_path()), n_ctx=2048, n_threads=args.threads, verbose=False)
            llama_cpp_decode_ms(peer, prompt, 2)
            peer_report = {"llama_cpp_python": lc.__version__, "runs_ms": []}
    runs: dict[str, list[float]] = {"step": [], **{name: [] for name in parts(llm.model)}}
    for _ in range(args.rounds):  # alternating, so a drift of the machine's speed touches every part alike
        runs["step"].append(decode_ms(llm, prompt, args.tokens))
        for name, targets in parts(llm.model).items():
            with knocked_out(targets):
                runs[name].append(decode_ms(llm, prompt, args.tokens))
        if peer is not None:
            peer_report["runs_ms"].append(llama_cpp_decode_ms(peer, prompt, args.tokens))
    if peer is not None:
        peer_report["decode_token_ms"] = statistics.median(peer_report["runs_ms"])
    step = statistics.median(runs["step"])
    report = {
        "workload": {
            "prompt_tokens": len(prompt),
            "context_tokens": [len(prompt), len(prompt) + args.tokens],
            "tokens": args.tokens,
            "threads": args.threads,
            "dtype": str(llm.dtype),
            "quantization": quantization,
        },
        "machine": machine_info() | {"torch": torch.__version__},
        "decode_token_ms": step,
        "saved_ms_without": {name: step - statistics.median(ms) for name, ms in runs.items() if name != "step"},
        "runs_ms": runs,
        "llama_cpp": peer_report,
        "bytes_per_token": bytes_per_token(llm.model, len(prompt) + args.tokens // 2),
        "stream_read_gb_s_by_mb": {str(mb): stream_gb_s(mb) for mb in STREAM_MB},
    }
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps({k: report[k] for k in ("decode_token_ms", "saved_ms_without", "bytes_per_token")}, indent=1))
    return report


if __name__ == "__main__":
    main()
