"""A load benchmark of the OpenAI-compatible server, as `vllm bench serve` measures it.

    python bench/serve.py [--num-prompts 16] [--output-len 32] [--max-concurrency 8]

The server (`build_app` over the embedded SmolLM2, uvicorn on a free loopback port) runs in a thread of this
process; the clients are asyncio tasks streaming /v1/completions over httpx, at most --max-concurrency at a time
(vLLM's --max-concurrency with --request-rate inf). Each workload's prompts are sent twice in one run: one at a time,
then concurrently, from the same prefix-cache state (reset, then the prompts' common prefix computed once), so
the ratio of output tokens/s compares like with like on the same machine at the same moment. Two workloads:
shared-prefix (the chatbot's system prompt before each of USER_TURNS) and random (unrelated seeded prose).

Per request, from the client side and as vLLM's benchmark defines them: TTFT, send to the first chunk with a
choice; ITL, the gap between successive such chunks; output tokens from the final usage chunk (ignore_eos, so
each request returns exactly --output-len). Output tokens/s is all of them over the phase's wall time.
The run reports medians (p50) and p99.

Then a disconnect phase: --num-disconnects clients stream long completions and each drops its connection at a
random point (before its response arrives, or after a random number of chunks). The check that follows waits up
to --leak-timeout seconds for the server's /metrics to read no request running or waiting and
vllm:kv_cache_usage_perc 0, and for the engine to hold no request and every block but the null one to be free.
It fails the run (LeakError, after the JSON is written) otherwise.

Results are written as JSON to bench/results/serve_cpu.json with the machine and its load average.
Bounded in time: every phase runs under --phase-timeout seconds, and each request under httpx's timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import torch
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script, it still finds the engine's packages

from bench.machine import machine_info
from nanoengine.benchmarks.datasets import USER_TURNS, chat_prompts, prose
from nanoengine.entrypoints.llm import LLM
from nanoengine.entrypoints.openai.api_server import serve_in_thread

MODEL = "bench"


class LeakError(AssertionError):
    """After the disconnect phase the server still holds a request or a KV block."""


@dataclass(slots=True)
class RequestResult:
    """One streamed request, timed at the client (seconds)."""

    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0


def _body(prompt: list[int], max_tokens: int) -> dict:
    return {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def stream_one(client: httpx.AsyncClient, prompt: list[int], max_tokens: int) -> RequestResult:
    """One streamed completion; TTFT and ITL as vLLM's benchmark times them (a chunk with a choice is a token
    event, even if its text is empty: the server holds back text that may still become a stop string)."""
    result, start = RequestResult(), time.perf_counter()
    last = start
    async with client.stream("POST", "/v1/completions", json=_body(prompt, max_tokens)) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line.removeprefix("data: "))
            if "error" in data:
                raise RuntimeError(f"the server's stream failed: {data['error']}")
            now = time.perf_counter()
            if data["choices"]:
                if last == start:
                    result.ttft = now - start
                else:
                    result.itl.append(now - last)
                last = now
            elif data.get("usage"):
                result.output_tokens = data["usage"]["completion_tokens"]
    return result


async def run_phase(url: str, prompts: list[list[int]], max_tokens: int, concurrency: int) -> dict:
    """Every prompt streamed, at most `concurrency` in flight; the phase's latencies and output tokens/s."""
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as client:

        async def gated(prompt: list[int]) -> RequestResult:
            async with gate:
                return await stream_one(client, prompt, max_tokens)

        start = time.perf_counter()
        results = await asyncio.gather(*(gated(p) for p in prompts))
        seconds = time.perf_counter() - start
    ttfts, itls = [r.ttft for r in results], [x for r in results for x in r.itl]
    tokens = sum(r.output_tokens for r in results)
    return {
        "concurrency": concurrency,
        "seconds": seconds,
        "output_tokens": tokens,
        "output_tokens_per_s": tokens / seconds,
        **_percentiles("ttft", ttfts),
        **_percentiles("itl", itls),
    }


def _percentiles(name: str, xs: list[float]) -> dict:
    """Median and p99 in ms (linear interpolation, numpy's default, as vLLM's benchmark reports)."""
    p99 = statistics.quantiles(xs, n=100, method="inclusive")[98] if len(xs) > 1 else xs[0]
    return {f"{name}_p50_ms": 1000 * statistics.median(xs), f"{name}_p99_ms": 1000 * p99}


async def disconnect_phase(url: str, prompts: list[list[int]], max_tokens: int, seed: int) -> None:
    """Each prompt streamed, then dropped at a random point: within its first 0.3 s (maybe before the request
    reaches the server, maybe after some chunks) or after 1 to 8 chunks. max_tokens is long enough that none
    finishes first."""
    rng = random.Random(seed)
    cuts = [rng.choice([None, rng.randint(1, 8)]) for _ in prompts]
    delays = [rng.uniform(0, 0.3) for _ in prompts]

    async def client_that_leaves(client: httpx.AsyncClient, prompt: list[int], cut: int | None, delay: float) -> None:
        if cut is None:  # gone after `delay`, whatever it has received by then
            task = asyncio.ensure_future(stream_one(client, prompt, max_tokens))
            await asyncio.sleep(delay)
            task.cancel()  # the cancelled stream closes its connection
            await asyncio.gather(task, return_exceptions=True)
            return
        async with client.stream("POST", "/v1/completions", json=_body(prompt, max_tokens)) as response:
            chunks = 0
            async for line in response.aiter_lines():
                chunks += line.startswith("data: ")
                if chunks == cut:
                    return  # leaving the block closes the connection mid-stream

    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        await asyncio.gather(*(client_that_leaves(client, p, c, d) for p, c, d in zip(prompts, cuts, delays)))


def scrape(url: str) -> dict[str, float]:
    """The server's gauges that say what it holds, from /metrics."""
    text = httpx.get(url + "/metrics").text
    wanted = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
    return {f.name: f.samples[0].value for f in text_string_to_metric_families(text) if f.name in wanted}


def held(llm: LLM, url: str) -> dict:
    """What the server still holds, seen both through /metrics and through the engine itself."""
    engine = llm.engine
    pool = engine.kv_cache_manager.block_pool
    return {
        **scrape(url),
        "engine_unfinished_requests": len(engine.scheduler.requests),
        "blocks_held": pool.num_gpu_blocks - 1 - pool.get_num_free_blocks(),  # the null block is never free
    }


def wait_idle(llm: LLM, url: str, timeout: float) -> dict:
    """Poll until the server holds nothing; the last reading, whether it got there or not."""
    deadline = time.monotonic() + timeout
    while True:
        state = held(llm, url)
        if not any(state.values()) or time.monotonic() > deadline:
            return state
        time.sleep(0.05)


def common_prefix(prompts: list[list[int]]) -> list[int]:
    """The longest prefix every prompt starts with (at least the first prompt's first token)."""
    n = min(map(len, prompts))
    for i in range(n):
        if any(p[i] != prompts[0][i] for p in prompts):
            n = i
            break
    return prompts[0][: max(n, 1)]


def workloads(llm: LLM, num_prompts: int, random_input_len: int, seed: int) -> dict[str, list[list[int]]]:
    """shared_prefix: the chatbot's system prompt, then one of USER_TURNS (so num_prompts <= 16);
    random: unrelated seeded prose of random_input_len tokens each, no chat template."""
    tok, rng = llm.tokenizer, random.Random(seed)
    if tok is None:
        raise ValueError("llm has no tokenizer, which the workloads need: serve a model loaded with one")
    chat = chat_prompts(tok, num_prompts)
    rand = [tok.encode(prose(tok, rng, random_input_len))[:random_input_len] for _ in range(num_prompts)]
    return {"shared_prefix": chat, "random": rand}


async def _on_fresh_cache(llm: LLM, url: str, prompts: list[list[int]], timeout: float) -> None:
    """The same start for each phase: an empty prefix cache, then the prompts' common prefix computed once
    (a server that has seen its system prompt before)."""
    if not llm.reset_prefix_cache():
        raise LeakError(f"a request is still running before the phase: {held(llm, url)}")
    async with httpx.AsyncClient(base_url=url, timeout=timeout) as client:
        await stream_one(client, common_prefix(prompts), 1)


async def bench(llm: LLM, url: str, args: argparse.Namespace) -> tuple[dict, dict]:
    results = {}
    async with httpx.AsyncClient(base_url=url, timeout=args.phase_timeout) as client:
        await stream_one(client, [1, 2, 3, 4], 2)  # the first forward pass pays one-off set-up costs
    for name, prompts in workloads(llm, args.num_prompts, args.random_input_len, args.seed).items():
        phases = {}
        for key, concurrency in (("one_at_a_time", 1), ("concurrent", args.max_concurrency)):
            await _on_fresh_cache(llm, url, prompts, args.phase_timeout)
            phases[key] = await asyncio.wait_for(
                run_phase(url, prompts, args.output_len, concurrency), args.phase_timeout
            )
        one, many = phases["one_at_a_time"], phases["concurrent"]
        results[name] = {
            "prompt_tokens": [len(p) for p in prompts],
            "shared_prefix_tokens": len(common_prefix(prompts)),
            **phases,
            "throughput_ratio": many["output_tokens_per_s"] / one["output_tokens_per_s"],
        }
    aborted = llm.engine.stats.num_aborted_requests
    prompts = workloads(llm, args.num_disconnects, args.random_input_len, args.seed + 1)["random"]
    await asyncio.wait_for(disconnect_phase(url, prompts, args.disconnect_output_len, args.seed), args.phase_timeout)
    state = await asyncio.to_thread(wait_idle, llm, url, args.leak_timeout)
    leak = {
        "clients": len(prompts),
        "aborted_requests": llm.engine.stats.num_aborted_requests - aborted,
        "held_after": state,
        "ok": not any(state.values()),
    }
    return results, leak


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: list[str] | None = None, llm: LLM | None = None) -> dict:
    """Run the benchmark and write its JSON; `llm` None loads the embedded SmolLM2 (the tests pass their own)."""
    parser = argparse.ArgumentParser(prog="python bench/serve.py", description=__doc__.split("\n")[0])
    parser.add_argument("--num-prompts", type=_positive, default=16, help="requests per workload and phase (max 16)")
    parser.add_argument("--output-len", type=_positive, default=32, help="tokens each request generates (ignore_eos)")
    parser.add_argument(
        "--max-concurrency", type=_positive, default=8, help="clients in flight in the concurrent phase"
    )
    parser.add_argument("--random-input-len", type=_positive, default=256, help="tokens of each random prompt")
    parser.add_argument("--num-disconnects", type=_positive, default=16, help="clients that drop their stream (max 16)")
    parser.add_argument("--disconnect-output-len", type=_positive, default=256, help="tokens they ask for")
    parser.add_argument("--leak-timeout", type=float, default=10.0, help="seconds the server has to free them")
    parser.add_argument("--phase-timeout", type=float, default=300.0, help="seconds any one phase may take")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "serve_cpu.json"))
    args = parser.parse_args(argv)
    for name in ("num_prompts", "num_disconnects"):
        if getattr(args, name) > len(USER_TURNS):
            parser.error(f"--{name.replace('_', '-')} is at most {len(USER_TURNS)}, one request per user turn")
    load_before = os.getloadavg()
    start = time.perf_counter()
    llm = llm or LLM(device="cpu", progress=False)
    with serve_in_thread(llm, served_model_name=MODEL) as server:
        url = server.url
        results, leak = asyncio.run(bench(llm, url, args))
    report = {
        "workload": {k: v for k, v in vars(args).items() if k != "out"},
        "machine": {
            **machine_info(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "load_average_1_5_15_min_before": list(load_before),
            "load_average_1_5_15_min_after": list(os.getloadavg()),
        },
        "results": results,
        "disconnects": leak,
        "seconds": time.perf_counter() - start,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    _print_table(report)
    if not leak["ok"]:
        raise LeakError(
            f"{args.leak_timeout} s after {leak['clients']} clients disconnected the server holds {leak['held_after']}"
        )
    return report


def _print_table(report: dict) -> None:
    print(f"{'':28}{'TTFT p50':>10}{'TTFT p99':>10}{'ITL p50':>9}{'ITL p99':>9}{'tok/s':>8}{'ratio':>7}")
    for name, r in report["results"].items():
        for key in ("one_at_a_time", "concurrent"):
            p = r[key]
            ratio = f"{r['throughput_ratio']:.2f}x" if key == "concurrent" else ""
            print(
                f"{name + ', c=' + str(p['concurrency']):28}{p['ttft_p50_ms']:>8.0f}ms{p['ttft_p99_ms']:>8.0f}ms"
                f"{p['itl_p50_ms']:>7.0f}ms{p['itl_p99_ms']:>7.0f}ms{p['output_tokens_per_s']:>8.1f}{ratio:>7}"
            )
    d = report["disconnects"]
    print(f"disconnects: {d['clients']} clients, {d['aborted_requests']} aborted; held after: {d['held_after']}")


if __name__ == "__main__":
    main()
