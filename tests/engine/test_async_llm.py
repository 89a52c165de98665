"""AsyncLLM: one engine loop stepping in the background under many async generators (a tiny random model)."""

from __future__ import annotations

import asyncio
import time

import pytest

from nanoengine.config import LlamaConfig
from nanoengine.engine.async_llm import AsyncLLM
from nanoengine.entrypoints.llm import LLM
from nanoengine.errors import InvalidRequestError
from nanoengine.model import LlamaForCausalLM
from nanoengine.sampling_params import SamplingParams

TINY = LlamaForCausalLM.random(LlamaConfig.tiny(), seed=0)
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [9, 8, 7, 6], list(range(20, 60))]


def tiny_llm() -> LLM:
    return LLM(TINY, block_size=4, num_gpu_blocks_override=64, progress=False)


class Scheduled:
    """Records, per step, when it was scheduled and which engine requests it computed for."""

    def __init__(self) -> None:
        self.steps: list[tuple[float, set[str]]] = []

    def on_schedule(self, scheduler, scheduler_output, running_before) -> None:
        self.steps.append((time.perf_counter(), set(scheduler_output.num_scheduled_tokens)))

    def on_step(self, *args) -> None:
        pass


async def _collect(gen) -> list[int]:
    return [t async for out in gen for t in out.outputs[0].token_ids]


def test_requests_join_a_running_batch_and_match_llm_generate():
    llm = tiny_llm()
    expected = [o.token_ids for o in llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY)]
    seen = Scheduled()
    llm.engine.observers.append(seen)

    async def main() -> list[list[int]]:
        async_llm = AsyncLLM(llm)
        first = asyncio.create_task(_collect(async_llm.generate(PROMPTS[0], GREEDY)))
        while len(seen.steps) < 5:  # the first request is decoding alone...
            await asyncio.sleep(0.001)
        rest = [asyncio.create_task(_collect(async_llm.generate(p, GREEDY))) for p in PROMPTS[1:]]
        outs = [await first] + [await t for t in rest]  # ...when the others join its batch
        await async_llm.shutdown()
        return outs

    assert asyncio.run(main()) == expected
    assert any(len(ids) == 3 for _, ids in seen.steps), "the three requests never shared a step"
    assert not llm.engine.has_unfinished_requests()


def test_closing_a_generator_aborts_its_request_before_the_next_step():
    llm = tiny_llm()
    seen = Scheduled()
    llm.engine.observers.append(seen)
    pool = llm.engine.kv_cache_manager.block_pool

    async def main() -> tuple[float, str]:
        async_llm = AsyncLLM(llm)
        keep = asyncio.create_task(_collect(async_llm.generate(PROMPTS[1], GREEDY)))
        gen = async_llm.generate(PROMPTS[2], SamplingParams(temperature=0, max_tokens=1000, ignore_eos=True))
        await anext(gen)
        aborted_id = (await anext(gen)).request_id  # the engine's id
        await gen.aclose()
        closed = time.perf_counter()
        assert len(await keep) == GREEDY.max_tokens  # the other request runs on, unharmed
        await async_llm.shutdown()
        return closed, aborted_id

    closed, aborted_id = asyncio.run(main())
    after = [ids for t, ids in seen.steps if t > closed]
    assert after and not any(aborted_id in ids for ids in after), "a step after the close still computed it"
    assert llm.engine.stats.num_aborted_requests == 1
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1


def test_n_samples_and_bad_arguments():
    llm = tiny_llm()

    async def main() -> dict[int, list[int]]:
        async_llm = AsyncLLM(llm)
        with pytest.raises(InvalidRequestError, match="max_model_len"):  # checked at the call, nothing queued
            async_llm.generate([1] * 600, GREEDY)
        with pytest.raises(InvalidRequestError, match="priority"):
            async_llm.generate(PROMPTS[0], GREEDY, priority="high")
        samples: dict[int, list[int]] = {}
        params = SamplingParams(temperature=1.0, max_tokens=5, n=3, seed=1, ignore_eos=True)
        async for out in async_llm.generate(PROMPTS[0], params):
            samples.setdefault(out.outputs[0].index, []).extend(out.outputs[0].token_ids)
        await async_llm.shutdown()
        return samples

    samples = asyncio.run(main())
    reference = llm.generate(prompt_token_ids=PROMPTS[0], sampling_params=SamplingParams(
        temperature=1.0, max_tokens=5, n=3, seed=1, ignore_eos=True))[0]  # fmt: skip
    assert [samples[i] for i in range(3)] == [c.token_ids for c in reference.outputs]
