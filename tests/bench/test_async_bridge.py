"""bench/async_bridge.py's measure, whose number AsyncLLM's docstring quotes: one gap per step after the first."""

import asyncio

from bench.async_bridge import PARAMS, run
from nanoengine.config import LlamaConfig
from nanoengine.entrypoints.llm import LLM
from nanoengine.model import LlamaForCausalLM


def test_run_times_every_step_and_the_gaps_between():
    llm = LLM(LlamaForCausalLM.random(LlamaConfig.tiny(), seed=0), device="cpu", progress=False)
    step, gap = asyncio.run(run(llm))
    assert 0 < gap < 0.1 and 0 < step < 1.0, (step, gap)
    assert "step" not in vars(llm.engine), "the engine's own step() is back"
    assert llm.engine.stats.num_steps == PARAMS.max_tokens  # one prefill step, then one per token after the first
