"""Chapter 08: the workloads are deterministic, the block prediction is the engine's real behaviour, and
the explorer shows the engine's own numbers."""

import itertools

import pytest
import torch

from nanocourse import workloads as W
from nanoengine import LLM, SamplingParams

pytestmark = pytest.mark.model


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny prompts gain nothing from two threads, and on a busy 2-core machine two threads wait on each
    other (10x slower here); the session's setting comes back afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def llm_off():
    return LLM(progress=False, enable_prefix_caching=False, kv_cache_memory_bytes=16 * 2**20)


def _small(tok):
    return [
        W.chatbot(tok, n=3, system_tokens=40),
        W.multi_turn(tok, n=3, system_tokens=32, reply_tokens=8),
        W.code_completion(tok, n=3, context_tokens=16, file_tokens=48),
        W.random_prompts(tok, n=2, prompt_tokens=24),
    ]


def _engine_hits(llm, prompts):
    assert llm.reset_prefix_cache()
    return [
        llm.generate(prompt_token_ids=list(p), sampling_params=W.SamplingParams(temperature=0, max_tokens=1))[
            0
        ].num_cached_tokens
        for p in prompts
    ]


def test_workloads_are_deterministic_and_have_their_structure(llm):
    tok = llm.tokenizer
    first, again = W.make_workloads(tok), W.make_workloads(tok)
    assert first == again
    assert [w.name for w in first] == list(W.BLOG_POST_TABLE)
    by_name = {w.name: w for w in first}
    turns = by_name["multi_turn"].prompts
    assert all(later[: len(earlier)] == earlier for earlier, later in itertools.pairwise(turns))
    assert all(r.hit_tokens == 0 for r in W.block_rows(by_name["random"].prompts))
    chat = W.block_rows(by_name["chatbot"].prompts)
    assert chat[0].hit_tokens == 0 and all(r.hit_tokens >= 0.75 * r.num_tokens for r in chat[1:])
    assert W.make_workloads(tok, seed=1)[2] != by_name["rag"], "the seed must change the draws"


def test_block_rows_predict_the_engines_cached_tokens(llm):
    for work in _small(llm.tokenizer):
        rows = W.block_rows(work.prompts)
        assert [r.hit_tokens for r in rows] == _engine_hits(llm, work.prompts), work.name


def test_block_aligned_repeat_shows_the_recomputed_block(llm):
    prompt = list(range(300, 348))
    rows = W.block_rows([prompt, prompt])
    assert rows[1].blocks == (W.HIT, W.HIT, W.RECOMPUTED)
    assert rows[0].blocks == (W.NEW,) * 3 and W.block_rows([prompt[:40]])[0].blocks[-1] == W.PARTIAL
    assert _engine_hits(llm, [prompt, prompt]) == [0, 32]


def test_measure_reports_the_engines_counters(llm, llm_off):
    work = _small(llm.tokenizer)[0]
    result = W.measure(work, llm, llm_off)
    assert result.cached_tokens == [r.hit_tokens for r in W.block_rows(work.prompts)]
    assert result.hit_rate == pytest.approx(sum(result.cached_tokens) / sum(result.prompt_tokens))
    assert len(result.ttft_on_ms) == len(result.ttft_off_ms) == len(work.prompts)
    with pytest.raises(ValueError):
        W.measure(work, llm, llm)


def test_cost_model_and_stored_runs(tmp_path):
    fixed, per_token = W.fit_cost_model([0, 100, 200, 300, 150], [50.0, 250.0, 450.0, 650.0, 5000.0])
    assert (fixed, per_token) == pytest.approx((50.0, 2.0)), "one slowed-down request must not tilt the fit"
    result = W.WorkloadResult("chatbot", [200, 200], [0, 160], 0.4, [450.0, 450.0], [450.0, 130.0])
    assert W.predicted_reduction(result, fixed, per_token) == pytest.approx(1 - 290 / 450)
    points = [W.SweepPoint(p, p + 32, p, 50 + 2 * (p + 32), 50 + 64) for p in (0, 64, 128)]
    W.save_run(tmp_path / "run.json", [result], points, {"machine": "test"})
    results, loaded, report = W.load_run(tmp_path / "run.json")
    assert results == [result] and loaded == points and report["machine"] == "test"
    assert report["cost_model_ms"]["per_token"] == pytest.approx(2.0)
    assert "| chatbot | 40% |" in W.results_markdown(results)


def test_explorer_shows_predictions_stored_results_and_a_live_rerun(llm):
    tok, works = llm.tokenizer, _small(llm.tokenizer)
    stored = W.WorkloadResult("multi_turn", [1, 1], [0, 0], 0.123, [100.0, 100.0], [40.0, 40.0])
    ex = W.WorkloadExplorer(tok, works, [stored], llm=llm, live_requests=2)
    assert ex.choice.value == "chatbot" and "Measured" not in ex.summary.value
    ex.choice.value = "multi_turn"
    rows = W.block_rows(works[1].prompts)
    assert ex.rows == rows
    assert ex.view.value.count("<tr>") == len(rows)
    assert ex.view.value.count(W._COLORS[W.HIT]) == sum(r.blocks.count(W.HIT) for r in rows) + 1  # + legend
    assert "hit rate 12.3%" in ex.summary.value and "60% less" in ex.summary.value
    ex.button.click()
    assert ex.live == {0: 0, 1: rows[1].hit_tokens}
    assert f"engine: {rows[1].hit_tokens}" in ex.view.value and "Re-run TTFTs" in ex.summary.value
    assert W.WorkloadExplorer(tok, works).button.disabled


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_watch_phases_shows_the_next_step_planned_before_the_last_output_is_taken_only_under_async(
    async_scheduling,
):
    from nanocourse.timeline import watch_phases

    llm = LLM(progress=False, kv_cache_memory_bytes=8 * 2**20, async_scheduling=async_scheduling)
    engine = llm.engine
    engine.add_request([1, 2, 3, 4, 5], SamplingParams(temperature=0, max_tokens=4))
    with watch_phases(engine) as phases:
        while engine.has_unfinished_requests():
            engine.step()
    # Async: the step planned while the last token's step ran is empty (the early skip of a request sure to stop).
    expected = [5, 1, 1, 1] + [0] * async_scheduling
    assert [p.step for p in phases] == list(range(len(expected))) and [p.tokens for p in phases] == expected
    assert all(p.planned <= p.forward_start < p.forward_end <= p.taken for p in phases)
    ahead = [b.planned < a.taken for a, b in itertools.pairwise(phases)]
    assert ahead == [async_scheduling] * (len(expected) - 1)
    assert "execute_model" not in vars(engine.runner) and not engine.observers  # both left with the block
