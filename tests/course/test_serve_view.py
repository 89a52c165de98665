"""Chapter 15's views of a served engine: the batch changes read from real step records (an engine stepped by hand,
and one stepped by a server's engine loop), and /metrics read back from a real server."""

import asyncio
import math

import httpx
import pytest
from matplotlib.figure import Figure

from nanocourse import serve_view
from nanocourse.timeline import watch
from nanoengine.config import LlamaConfig
from nanoengine.engine.async_llm import AsyncLLM
from nanoengine.entrypoints.llm import LLM
from nanoengine.entrypoints.openai.api_server import serve_in_thread
from nanoengine.model import LlamaForCausalLM
from nanoengine.sampling_params import SamplingParams

TINY = LlamaForCausalLM.random(LlamaConfig.tiny(), seed=0)
SIX = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def tiny_llm() -> LLM:
    return LLM(TINY, block_size=4, num_gpu_blocks_override=64, max_num_seqs=2, progress=False)


@pytest.fixture(scope="module")
def by_hand():
    """a runs alone; b joins it and c waits (two may run); b is aborted between steps 2 and 3, and c takes its
    place at step 3."""
    engine = tiny_llm().engine
    with watch(engine) as records:
        a = engine.add_request(list(range(1, 8)), SIX)
        engine.step()
        b = engine.add_request(list(range(10, 15)), SIX)
        c = engine.add_request(list(range(20, 29)), SIX)
        engine.step()
        engine.step()
        engine.abort_request([b])
        while engine.has_unfinished_requests():
            engine.step()
    assert not engine.observers, "watch takes its observer away"
    return records, a, b, c


def test_changes_name_who_queued_joined_finished_and_was_aborted(by_hand):
    records, a, b, c = by_hand
    changes = {ch.step: ch for ch in serve_view.batch_changes(records) if ch}
    assert changes[0].joined == (a,) and changes[0].queued == ()
    assert changes[1].joined == (b,) and changes[1].queued == (c,)
    assert changes[2].aborted == (b,) and changes[2].finished == () and changes[2].queued == (), "c still waits"
    assert changes[3].joined == (c,)
    assert changes[5].finished == (a,)
    assert changes[len(records) - 1].finished == (c,)
    assert sorted(changes) == [0, 1, 2, 3, 5, len(records) - 1], "no change is reported where nothing changed"
    assert [step for step, ch in changes.items() if ch.aborted] == [2], "a finished request was not aborted"


def test_text_and_plot_show_every_change(by_hand):
    records, a, b, c = by_hand
    text = serve_view.batch_text(records)
    assert len(text.splitlines()) == 6
    assert f"waiting r{c}" in text and f"aborted before the next step: r{b}" in text
    fig = serve_view.plot_batch(records, max_num_seqs=2, title="t")
    assert isinstance(fig, Figure)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == [f"r{x}" for x in (a, b, c)]


def test_a_server_loop_fills_the_records_from_its_own_thread():
    llm = tiny_llm()
    prompts = [list(range(1, 8)), list(range(30, 36))]

    async def serve() -> list[list[int]]:
        async_llm = AsyncLLM(llm)

        async def collect(prompt):
            return [t async for out in async_llm.generate(prompt, SIX) for t in out.outputs[0].token_ids]

        outs = await asyncio.gather(*(collect(p) for p in prompts))
        await async_llm.shutdown()
        return outs

    with watch(llm.engine) as records:
        outs = asyncio.run(serve())
    assert [len(o) for o in outs] == [6, 6]
    assert sum(s.num_tokens for r in records for s in r.slices) == sum(map(len, prompts)) + 2 * 5
    gaps = serve_view.step_gaps(records)
    assert len(gaps) == len(records) - 1 and all(g >= 0 for g in gaps)
    assert all(r.started > 0 for r in records)


def test_metrics_read_back_from_a_server():
    llm = tiny_llm()
    with serve_in_thread(llm) as server:
        body = {"model": "nanoengine", "prompt": list(range(1, 8)), "max_tokens": 6, "ignore_eos": True}
        assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).status_code == 200
        families = serve_view.scrape(server.url)
    assert serve_view.gauge(families, "vllm:num_requests_running") == 0
    assert serve_view.gauge(families, "vllm:prefix_cache_queries") == 7
    ttft = serve_view.histogram(families, "vllm:time_to_first_token_seconds")
    assert ttft.count == 1 and ttft.buckets[-1] == (math.inf, 1)
    assert ttft.quantile(0.5) <= ttft.sum * 10  # within the bucket that holds the one observation
    itl = serve_view.histogram(families, "vllm:inter_token_latency_seconds")
    assert itl.count == 5
    with pytest.raises(ValueError, match="samples"):
        serve_view.gauge(families, "vllm:time_to_first_token_seconds")


def test_quantiles_interpolate_in_the_bucket_as_prometheus_does():
    h = serve_view.Histogram(count=10, sum=3.0, buckets=((0.1, 2), (0.5, 6), (1.0, 10), (math.inf, 10)))
    assert h.mean == 0.3
    assert h.quantile(0.1) == pytest.approx(0.05)  # rank 1 of the first bucket's 2, from 0 to 0.1
    assert h.quantile(0.5) == pytest.approx(0.4)  # rank 5: 3 of the second bucket's 4, from 0.1 to 0.5
    assert h.quantile(1.0) == pytest.approx(1.0)
    beyond = serve_view.Histogram(count=4, sum=40.0, buckets=((1.0, 1), (math.inf, 4)))
    assert beyond.quantile(0.9) == 1.0, "in the +Inf bucket: the highest finite bound, as histogram_quantile"
    assert math.isnan(serve_view.Histogram(0, 0.0, ((1.0, 0), (math.inf, 0))).quantile(0.5))
    with pytest.raises(ValueError, match="between 0 and 1"):
        h.quantile(1.5)
