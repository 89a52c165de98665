"""`python bench/serve.py` runs end to end at a tiny size, and its leak check fails when the server keeps a
request or a block after its client disconnects (two seeded bugs); the README quotes the committed run."""

import json
from pathlib import Path

import pytest

from bench.serve import LeakError, main
from nanoengine.engine.async_llm import AsyncLLM
from nanoengine.entrypoints.llm import LLM
from nanoengine.request import RequestStatus

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--num-prompts", "2", "--output-len", "3", "--max-concurrency", "2", "--random-input-len", "16",
        "--num-disconnects", "3", "--leak-timeout", "2"]  # fmt: skip


@pytest.fixture
def fresh_llm():
    """A pool of its own: the benchmark resets its prefix cache, and a seeded bug leaves it dirty."""
    return LLM(progress=False, kv_cache_memory_bytes=64 * 2**20)


@pytest.mark.model
def test_bench_smoke(tmp_path, fresh_llm, capsys):
    out = tmp_path / "serve.json"
    report = main([*TINY, "--out", str(out)], llm=fresh_llm)
    assert report == json.loads(out.read_text())
    for name, r in report["results"].items():
        one, many = r["one_at_a_time"], r["concurrent"]
        assert (one["concurrency"], many["concurrency"]) == (1, 2)
        assert one["output_tokens"] == many["output_tokens"] == 2 * 3, name  # ignore_eos: every token counted
        assert 0 < one["ttft_p50_ms"] <= one["ttft_p99_ms"] and 0 < one["itl_p50_ms"] <= one["itl_p99_ms"]
        assert r["throughput_ratio"] == many["output_tokens_per_s"] / one["output_tokens_per_s"]
    assert report["results"]["shared_prefix"]["shared_prefix_tokens"] > 500  # the chatbot's system prompt
    assert report["disconnects"]["ok"] and report["disconnects"]["aborted_requests"] >= 1
    assert len(report["machine"]["load_average_1_5_15_min_before"]) == 3
    assert "TTFT p50" in capsys.readouterr().out


def _no_abort(self, engine_ids):  # seeded bug: a disconnected client's request runs on
    pass


def _free_unless_aborted(llm):  # seeded bug: an aborted request's blocks are never freed
    free = llm.engine.kv_cache_manager.free
    return lambda request: None if request.status == RequestStatus.FINISHED_ABORTED else free(request)


def _recover_nothing():  # and the engine's safety net, which frees lost blocks once no request runs, is gone
    return 0


@pytest.mark.model
@pytest.mark.parametrize("bug", ["requests_not_aborted", "blocks_not_freed"])
def test_the_leak_check_catches_a_server_that_keeps_what_a_client_left(tmp_path, fresh_llm, monkeypatch, bug):
    if bug == "requests_not_aborted":
        monkeypatch.setattr(AsyncLLM, "_abort", _no_abort)
    else:
        monkeypatch.setattr(fresh_llm.engine.kv_cache_manager, "free", _free_unless_aborted(fresh_llm))
        monkeypatch.setattr(fresh_llm.engine.kv_cache_manager.block_pool, "recover_free_blocks", _recover_nothing)
    out = tmp_path / "serve.json"
    with pytest.raises(LeakError, match="the server holds"):
        main([*TINY, "--out", str(out)], llm=fresh_llm)
    assert not json.loads(out.read_text())["disconnects"]["ok"]  # written before it fails


def test_readme_quotes_the_committed_serve_benchmark():
    """The README's table must be re-copied whenever bench/results/serve_cpu.json is re-run."""
    report = json.loads((ROOT / "bench" / "results" / "serve_cpu.json").read_text())
    readme = (ROOT / "README.md").read_text()
    assert report["disconnects"]["ok"]
    for name, r in report["results"].items():
        one, many = r["one_at_a_time"], r["concurrent"]
        quoted = [f"({r['throughput_ratio']:.2f}×)"]
        for p in (one, many):
            quoted += [
                f"{p['ttft_p50_ms']:.0f} / {p['ttft_p99_ms']:.0f} ms",
                f"{p['itl_p50_ms']:.0f} / {p['itl_p99_ms']:.0f} ms",
                f"{p['output_tokens_per_s']:.1f}",
            ]
        missing = [q for q in quoted if q not in readme]
        assert not missing, f"README lacks {missing} for {name}; copy them from bench/results/serve_cpu.json"
    load = report["machine"]["load_average_1_5_15_min_before"][0]
    assert f"load average {load:.2f} before the run" in readme
