"""The engine's state as a snapshot (engine/engine_state.py), AsyncLLM.get_engine_state, and the server's
/engine_state, /live and /live/view routes (a tiny random model: no weights to load)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from nanoengine.config import LlamaConfig
from nanoengine.engine.async_llm import AsyncLLM
from nanoengine.engine.engine_state import EngineStateRecorder
from nanoengine.entrypoints.llm import LLM
from nanoengine.entrypoints.openai.api_server import serve_in_thread
from nanoengine.entrypoints.openai.live import LIVE_PAGE
from nanoengine.model import LlamaForCausalLM
from nanoengine.sampling_params import SamplingParams

TINY = LlamaForCausalLM.random(LlamaConfig.tiny(), seed=0)
PREFIX = list(range(100, 116))  # four full 4-token blocks every prompt shares
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def tiny_llm(num_blocks: int = 64) -> LLM:
    return LLM(TINY, block_size=4, num_gpu_blocks_override=num_blocks, progress=False)


def assert_matches_engine(state, engine) -> None:
    """The snapshot says what the live pool and scheduler say (read between steps, as the snapshot was)."""
    pool, manager = engine.kv_cache_manager.block_pool, engine.kv_cache_manager
    assert state.ref_cnt == [b.ref_cnt for b in pool.blocks]
    assert state.block_hashes == [b.block_hash for b in pool.blocks]
    assert state.free_queue == [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
    assert [r.request_id for r in state.running] == [r.request_id for r in engine.scheduler.running]
    assert [r.request_id for r in state.waiting] == [r.request_id for r in engine.scheduler.waiting]
    assert all(r.block_ids == manager.get_block_ids(r.request_id)[0] for r in state.running)
    assert state.num_used_blocks == pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()
    owners = state.block_owners()
    for i, n in enumerate(state.ref_cnt):  # BlockState's invariant: ref_cnt == number of holders
        assert i == state.null_block_id or n == len(owners.get(i, ())), f"block {i}"
    assert (state.prefix_cache_queries, state.prefix_cache_hits) == (
        engine.stats.prefix_cache_queries,
        engine.stats.prefix_cache_hits,
    )


def test_snapshot_is_the_engine_between_steps_and_a_copy():
    engine = tiny_llm().engine
    recorder = EngineStateRecorder(engine, num_steps=4)
    first = engine.add_request(PREFIX + [1, 2, 3], GREEDY)
    engine.step()  # the first prompt is computed and its full blocks cached...
    second = engine.add_request(PREFIX + [7, 8], GREEDY)
    engine.step()  # ...so the second hits them
    state = recorder.take()
    assert_matches_engine(state, engine)
    assert state.step == 2 and [p.step for p in state.steps] == [1, 2]
    assert state.steps[0].num_scheduled_tokens == {first: 19} and state.steps[0].admitted == {first: 0}
    assert state.steps[1].admitted == {second: 16}  # the shared prefix, from the cache
    assert state.steps[1].num_scheduled_tokens == {first: 1, second: 2}
    assert state.prefix_cache_hit_rate == 16 / (19 + 18)
    assert state.num_used_blocks + state.num_cached_free_blocks <= state.num_blocks == 63
    json.dumps(state.to_json())  # plain JSON values throughout
    before = state.to_json()
    while engine.has_unfinished_requests():
        engine.step()
    assert state.to_json() == before, "stepping on changed a snapshot taken earlier"
    after = recorder.take()
    assert_matches_engine(after, engine)
    assert (after.running, after.num_used_blocks) == ([], 0)
    assert after.num_cached_free_blocks > 0
    assert [p.step for p in after.steps] == [4, 5, 6, 7] == list(range(after.step - 3, after.step + 1))  # the last 4
    assert [p.finished for p in after.steps[-2:]] == [[first], [second]]
    recorder.close()
    assert recorder not in engine.observers


def test_step_plans_show_preemption_and_readmission():
    # 12 usable blocks: two 24-token requests decoding to 40 tokens cannot both stay; the newer is preempted.
    engine = tiny_llm(num_blocks=13).engine
    recorder = EngineStateRecorder(engine, num_steps=1000)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    ids = [engine.add_request(list(range(s, s + 24)), params) for s in (10, 50)]
    states = []
    while engine.has_unfinished_requests():
        engine.step()
        states.append(recorder.take())
        assert_matches_engine(states[-1], engine)
    plans = states[-1].steps
    preempting = [p for p in plans if p.preempted]
    assert preempting and preempting[0].preempted == [ids[1]] and not preempting[0].admitted
    assert any(p.admitted.get(ids[1]) is not None and p.step > preempting[0].step for p in plans)
    assert any(r.status == "preempted" for s in states for r in s.waiting)
    assert "PREEMPT r1" in preempting[0].describe()


def test_get_engine_state_is_taken_between_steps_only_and_at_most_every_max_age():
    llm = tiny_llm()
    stages: list[str | None] = []

    async def main() -> None:
        async_llm = AsyncLLM(llm)
        take = async_llm.state_recorder.take

        def watched_take():
            stages.append(llm.engine.stage)  # None between steps; "execute" etc. inside one
            return take()

        async_llm.state_recorder.take = watched_take
        params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
        gens = [asyncio.create_task(_drain(async_llm.generate(PREFIX + [i], params))) for i in range(3)]
        seen_running = 0
        while not all(g.done() for g in gens):
            state = await async_llm.get_engine_state(max_age_s=0)
            seen_running = max(seen_running, len(state.running))
            await asyncio.sleep(0.001)
        await asyncio.gather(*gens)
        assert seen_running == 3
        idle = await async_llm.get_engine_state(max_age_s=0)
        assert idle.running == [] and idle.num_used_blocks == 0
        assert await async_llm.get_engine_state(max_age_s=60) is idle  # young enough: not taken again
        assert await async_llm.get_engine_state(max_age_s=0) is not idle
        await async_llm.shutdown()
        assert async_llm.state_recorder not in llm.engine.observers

    asyncio.run(main())
    assert len(stages) > 10 and set(stages) == {None}


def test_a_part_that_raises_while_read_fails_the_caller_not_the_engine_loop():
    llm = tiny_llm()

    async def main() -> None:
        async_llm = AsyncLLM(llm)

        def broken_take():
            raise NotImplementedError("get_all_free_blocks")  # a replaced free queue not written yet

        async_llm.state_recorder.take = broken_take
        gen = asyncio.create_task(_drain(async_llm.generate(PREFIX, GREEDY)))
        with pytest.raises(NotImplementedError, match="get_all_free_blocks"):
            await asyncio.wait_for(async_llm.get_engine_state(), timeout=30)
        await asyncio.wait_for(gen, timeout=30)  # the request still runs to its end
        await async_llm.shutdown()

    asyncio.run(main())


async def _drain(gen) -> None:
    async for _ in gen:
        pass


@pytest.fixture(scope="module")
def server():
    with serve_in_thread(tiny_llm(), served_model_name="tiny", api_key="key") as s:
        yield s


def test_routes_serve_state_and_page_without_the_api_key(server):
    assert httpx.get(server.url + "/v1/models").status_code == 401  # the key still guards /v1
    state = httpx.get(server.url + "/engine_state").json()
    assert state["num_blocks"] == 63 and len(state["ref_cnt"]) == 64 and state["running"] == []
    assert state["null_block_id"] == 0 and state["prefix_cache_hit_rate"] is None
    page = httpx.get(server.url + "/live")
    assert page.status_code == 200 and page.text == LIVE_PAGE and 'fetch("/live/view"' in page.text
    view = httpx.get(server.url + "/live/view").text
    assert "id='engine-summary'" in view and "data-running='0'" in view and "data-num-blocks='63'" in view
    assert "class='live-running'" in view and "none yet" in view  # the engine's plain view: no step yet
