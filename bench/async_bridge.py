"""What AsyncLLM's engine loop adds to each step: the gap between one `LLMEngine.step()` returning and the next one
starting (the executor hand-off both ways, the inbox, the per-step deltas and the caller taking them).

Run as `python bench/async_bridge.py`. One request of 256 greedy tokens on a tiny random-weight model through
`AsyncLLM.generate()`, one torch thread; prints the median gap over the steps of the best of 5 runs, beside the
median step, so that a loaded machine shows as a slower step rather than as bridge time.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
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

PARAMS = SamplingParams(temperature=0.0, max_tokens=256, ignore_eos=True)
PROMPT = list(range(1, 17))


async def run(llm: LLM) -> tuple[float, float]:
    """(median step, median gap between steps), in seconds."""
    engine, spans = llm.engine, []
    step = engine.step

    def timed_step():
        start = time.perf_counter()
        out = step()
        spans.append((start, time.perf_counter()))
        return out

    engine.step = timed_step
    async_llm = AsyncLLM(llm)
    async for _ in async_llm.generate(PROMPT, PARAMS):
        pass
    await async_llm.shutdown()
    del engine.step
    steps = [end - start for start, end in spans]
    gaps = [start - end for (_, end), (start, _) in itertools.pairwise(spans)]
    return statistics.median(steps), statistics.median(gaps)


def main() -> None:
    torch.set_num_threads(1)
    llm = LLM(LlamaForCausalLM.random(LlamaConfig.tiny(), seed=0), device="cpu", progress=False)
    step, gap = min(asyncio.run(run(llm)) for _ in range(5))
    print(f"median step {step * 1e3:.2f} ms; median gap between steps (the bridge) {gap * 1e6:.0f} µs")


if __name__ == "__main__":
    main()
