"""`python -m nanoengine bench` runs end to end and writes its JSON (a tiny workload; numbers unchecked)."""

import json

import pytest

from nanoengine.__main__ import main


@pytest.mark.model
@pytest.mark.reference
def test_bench_smoke(tmp_path, capsys):
    out = tmp_path / "engine.json"
    assert main(["bench", "--users", "2", "--max-tokens", "3", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["workload"]["system_prompt_tokens"] >= 512
    results = report["results"]
    assert set(results) == {"hf_transformers", "nanoengine_cache_off", "nanoengine_cache_on"}
    assert results["nanoengine_cache_on"]["prefix_hit_rate"] > 0.4  # the second user reuses the prompt
    assert results["nanoengine_cache_off"]["prefix_hit_rate"] == 0
    assert all(r["same_tokens_as_hf"] for r in results.values())
    assert "TTFT p50" in capsys.readouterr().out
