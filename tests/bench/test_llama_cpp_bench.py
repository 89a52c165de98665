"""bench/llama_cpp.py without llama_cpp: it says why and writes nothing; the ratios it reports; the README quotes the
committed runs."""

import importlib.util
import json
from pathlib import Path

import pytest

from bench import llama_cpp as bench

ROOT = Path(__file__).resolve().parents[2]


def test_without_llama_cpp_it_skips_with_the_reason_and_writes_nothing(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    out = tmp_path / "out.json"
    report = bench.main(["--out", str(out)])
    assert "llama_cpp is not importable" in report["skipped"] and "--llama-cpp-site" in report["skipped"]
    assert not out.exists()


def test_summary_takes_medians_and_gives_nanoengine_over_llama_cpp():
    ne = [bench._round(1.0, [0.05, 0.06, 0.07], 30.0, 90.0), bench._round(1.2, [0.06], 40.0, 70.0)]
    lc = [bench._round(3.0, [0.12], 20.0, None), bench._round(3.0, [0.12], 20.0, None)]
    report = bench.summarize({"nanoengine": ne, "llama_cpp": lc})
    assert report["medians"]["nanoengine"]["cached_ttft_p50_ms"] == pytest.approx(60)
    assert report["medians"]["llama_cpp"]["all_at_once_tok_s"] is None
    ratios = report["nanoengine_vs_llama_cpp"]
    assert ratios["cold_ttft"] == pytest.approx(3.0 / 1.1)
    assert ratios["cached_ttft_p50"] == pytest.approx(2.0)
    assert ratios["one_request_tok_s"] == pytest.approx(35 / 20)
    assert ratios["all_at_once_vs_llama_cpp_one_request"] == pytest.approx(80 / 20)


def test_the_readme_quotes_every_committed_run():
    """The README's table must be re-copied whenever a bench/results/llama_cpp_cpu*.json is re-run: its row (the
    one naming the file) quotes the run's four ratios."""
    results = sorted((ROOT / "bench" / "results").glob("llama_cpp_cpu*.json"))
    assert results, "no committed llama.cpp run"
    rows = {line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("|")}
    for path in results:
        row = next((r for r in rows if f"`{path.name}`" in r), None)
        assert row is not None, f"README's table has no row for {path.name}"
        r = json.loads(path.read_text())["nanoengine_vs_llama_cpp"]
        quoted = (
            f"{r['cold_ttft']:.1f}×",
            f"{r['cached_ttft_p50']:.2f}×",
            f"{r['one_request_tok_s']:.2f}×",
            f"{r['all_at_once_vs_llama_cpp_one_request']:.2f}×",
        )
        missing = [q for q in quoted if q not in row]
        assert not missing, f"README's row for {path.name} lacks {missing}; copy them from the file"
