"""`python bench/engine.py` runs end to end and writes its JSON; the README quotes the committed run."""

import json
from pathlib import Path

import pytest

from bench.engine import main


@pytest.mark.model
@pytest.mark.reference
def test_bench_smoke(tmp_path, capsys):
    out = tmp_path / "engine.json"
    assert main(["--users", "2", "--max-tokens", "3", "--out", str(out)]) == json.loads(out.read_text())
    report = json.loads(out.read_text())
    assert report["workload"]["system_prompt_tokens"] >= 512
    results = report["results"]
    assert set(results) == {"hf_transformers", "nanoengine_cache_off", "nanoengine_cache_on"}
    assert results["nanoengine_cache_on"]["prefix_hit_rate"] > 0.4  # the second user reuses the prompt
    assert results["nanoengine_cache_off"]["prefix_hit_rate"] == 0
    assert all(r["same_tokens_as_hf"] for r in results.values())
    assert "TTFT p50" in capsys.readouterr().out
    machine = report["machine"]
    assert machine["cpu"] and machine["cpu_count"] >= 1 and isinstance(machine["vector_extensions"], list)


@pytest.mark.parametrize("name", ["engine_cpu.json", "engine_cuda.json"])
def test_readme_quotes_the_committed_engine_benchmark(name):
    """The README's tables must be re-copied whenever bench/results/engine_<device>.json is re-run."""
    root = Path(__file__).resolve().parents[2]
    results = json.loads((root / "bench" / "results" / name).read_text())["results"]
    readme = (root / "README.md").read_text()
    for run, r in results.items():
        quoted = [f"{r['ttft_p50_ms']:.0f} ms", f"{r['throughput_tok_s']:.1f}"]
        if run != "hf_transformers":
            quoted += [f"({r['ttft_p50_speedup_vs_hf']:.1f}× lower)", f"({r['throughput_vs_hf']:.1f}×)"]
        missing = [q for q in quoted if q not in readme]
        assert not missing, f"README lacks {missing} for {run}; copy them from bench/results/{name}"
    on = results["nanoengine_cache_on"]
    assert f"({100 * on['prefix_hit_rate']:.0f}% hit rate)" in readme


@pytest.mark.model
def test_async_scheduling_bench_smoke(tmp_path, capsys):
    """--async-scheduling: both modes, the same tokens, medians and ratios, the machine and its load."""
    out = tmp_path / "async.json"
    report = main(["--async-scheduling", "--users", "2", "--max-tokens", "3", "--rounds", "1", "--out", str(out)])
    assert report == json.loads(out.read_text())
    assert set(report["results"]) == {"one request", "2 at once"}
    for r in report["results"].values():
        assert r["same_tokens"] and r["async_vs_sync"]["tokens_per_s"] > 0
        assert r["sync"]["step_ms"] >= r["sync"]["forward_ms"] > 0
    assert report["machine"]["load_average_before"] >= 0 and "ratio" in capsys.readouterr().out
