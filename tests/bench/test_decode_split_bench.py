"""bench/decode_split.py: a knocked-out part answers with its first output and comes back whole; the bytes a token
reads; a run end to end; the README quotes the committed run."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from bench import decode_split as bench
from nanoengine.config import LlamaConfig
from nanoengine.model import LlamaForCausalLM, llama

ROOT = Path(__file__).resolve().parents[2]


def test_a_knocked_out_part_repeats_its_first_output_per_shape_and_is_restored_after():
    model = LlamaForCausalLM.random(LlamaConfig.tiny())
    norm, rotary = model.model.norm, llama.apply_rotary
    hidden = norm.weight.shape[0]
    a, b, c = torch.randn(1, hidden), torch.randn(1, hidden), torch.randn(2, hidden)
    with bench.knocked_out([(norm, "forward"), (llama, "apply_rotary")]):
        first = norm(a)
        assert norm(b) is first  # same shape: no work, the first answer
        assert norm(c).shape == (2, hidden)  # another shape is computed once
        assert llama.apply_rotary is not rotary
    assert "forward" not in vars(norm) and llama.apply_rotary is rotary
    torch.testing.assert_close(norm(b), norm.forward(b))
    assert not torch.equal(norm(a), norm(b))


def test_bytes_per_token_counts_the_projections_the_lm_head_and_an_fp32_context():
    config = LlamaConfig.tiny()
    model = LlamaForCausalLM.random(config)
    got = bench.bytes_per_token(model, context=10)
    layers = model.model.layers
    projections = sum(
        m.weight.nbytes
        for layer in layers
        for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
    )
    assert got["projections"] == projections
    assert got["lm_head"] == config.vocab_size * config.hidden_size * 4
    assert got["context_fp32"] == 2 * config.num_hidden_layers * config.num_key_value_heads * 10 * config.head_dim * 4


@pytest.mark.model
def test_bench_smoke_without_llama_cpp_says_why(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    out = tmp_path / "split.json"
    report = bench.main(["--dtype", "float32", "--quantization", "none", "--tokens", "2", "--rounds", "1",
                         "--llama-cpp-site", str(tmp_path), "--out", str(out)])  # fmt: skip
    assert report == json.loads(out.read_text())
    assert "llama_cpp is not importable" in report["llama_cpp"]["skipped"]
    assert set(report["saved_ms_without"]) == {"projections", "attention", "lm_head", "rmsnorm", "rotary"}
    assert report["decode_token_ms"] > 0 and len(report["runs_ms"]["step"]) == 1
    assert set(report["stream_read_gb_s_by_mb"]) == {str(mb) for mb in bench.STREAM_MB}
    assert report["bytes_per_token"]["projections"] > report["bytes_per_token"]["context_fp32"] > 0


def test_the_readme_quotes_the_committed_run():
    """Re-copy the README's figures whenever bench/results/decode_split_cpu.json is re-run."""
    report = json.loads((ROOT / "bench" / "results" / "decode_split_cpu.json").read_text())
    readme = (ROOT / "README.md").read_text()
    quoted = [f"{report['decode_token_ms']:.1f} ms", f"{report['llama_cpp']['decode_token_ms']:.1f} ms"]
    quoted += [f"{name} {ms:.1f} ms" for name, ms in report["saved_ms_without"].items()]
    missing = [q for q in quoted if q not in readme]
    assert not missing, f"README lacks {missing}; copy them from bench/results/decode_split_cpu.json"
