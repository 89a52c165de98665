"""What AsyncLLM's engine loop adds to a step: the executor hand-off, the inbox and the per-step deltas.

Run as `python bench/async_bridge.py`. One request of 256 greedy tokens on a tiny random-weight model (a step is
short, so the bridge's share is as large as it gets), best of 5: `LLMEngine.step()` in a plain loop against the
same request through `AsyncLLM.generate()`. Prints the two times per step and their difference.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script, it still finds the engine's packages

import torch

from nanoengine.config import LlamaConfig
from nanoengine.engine.async_llm import AsyncLLM
from nanoengine.entrypoints.llm import LLM
from nanoengine.model import LlamaForCausalLM
from nanoengine.sampling_params import SamplingParams

TOKENS = 256
PARAMS = SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True)
PROMPT = list(range(1, 17))


def plain(llm: LLM) -> float:
    engine = llm.engine
    start = time.perf_counter()
    engine.add_request(PROMPT, PARAMS)
    while engine.has_unfinished_requests():
        engine.step()
    return (time.perf_counter() - start) / TOKENS


async def bridged(llm: LLM) -> float:
    async_llm = AsyncLLM(llm)
    start = time.perf_counter()
    async for _ in async_llm.generate(PROMPT, PARAMS):
        pass
    seconds = (time.perf_counter() - start) / TOKENS
    await async_llm.shutdown()
    return seconds


def main() -> None:
    torch.set_num_threads(1)  # one thread in both runs: the step's own threads would only add noise here
    llm = LLM(LlamaForCausalLM.random(LlamaConfig.tiny(max_position_embeddings=512), seed=0), device="cpu")
    plain(llm)  # warm-up
    step = min(plain(llm) for _ in range(5))
    through = min(asyncio.run(bridged(llm)) for _ in range(5))
    print(
        f"step(): {step * 1e3:.3f} ms | through AsyncLLM: {through * 1e3:.3f} ms | bridge: {(through - step) * 1e6:.0f} µs"
    )


if __name__ == "__main__":
    main()
