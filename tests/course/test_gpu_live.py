"""Chapter 11 live: the figures a GPU run measures are read like the stored ones and set beside them, and
the offline table shows each target in the dtype the engine runs there. No GPU needed."""

import pytest
import torch

from nanocourse import gpu_live
from nanocourse import gpu_results as gr


def _attention(device, copy, scale):
    """An attention result in attention_<gpu>.json's layout: the bar's row and its batch-1 twin."""
    row = lambda batch, ms, graph_ms: {
        "heads": "llama3-8b",
        "batch": batch,
        "context": 2048,
        "triton_gbps": scale * batch,
        "pct_of_copy": 50.0,
        "x_vs_gather_sdpa": 4.0,
        "triton_ms": ms,
        "triton_graph_ms": graph_ms,
    }
    return {
        "device": device,
        "dtype": "float16",
        "copy_gbps": copy,
        "decode": [row(1, 0.1, 0.02), row(64, 0.2, 0.2), {**row(64, 1, 1), "context": 512}],
    }


def _engine(graphed, eager):
    return {
        "results": {
            "nanoengine_cache_on": {"throughput_tok_s": graphed},
            "nanoengine_cache_on_eager": {"throughput_tok_s": eager},
        }
    }


def test_figures_read_the_bar_row_batch_one_and_the_engine_ratio():
    f = gr.figures(_attention("Tesla T4", 250.0, 3.0), _engine(900.0, 300.0))
    assert f["device"] == "Tesla T4" and f["dtype"] == "float16"
    assert f["decode B=64, GB/s"] == 192.0 and f["decode B=64, % of copy"] == 50.0
    assert f["decode B=1, eager µs"] == pytest.approx(100.0) and f["decode B=1, graph µs"] == pytest.approx(20.0)
    assert f["engine, graphs / eager"] == 3.0


def test_comparison_rows_set_live_beside_stored_and_dashes_without_a_gpu():
    stored = gr.figures(_attention("NVIDIA H100 80GB HBM3", 3000.0, 40.0), _engine(3900.0, 650.0))
    live = gr.figures(_attention("Tesla T4", 250.0, 3.0), _engine(900.0, 300.0))
    rows = gr.comparison_rows(stored, live)
    assert [name for name, _, _ in rows] == list(stored)
    assert ("device copy, GB/s", "3,000.0", "250.0") in rows
    assert ("device", "NVIDIA H100 80GB HBM3", "Tesla T4") in rows
    assert all(now == "-" for _, _, now in gr.comparison_rows(stored, None))


def test_the_committed_stored_figures_read():
    stored = gr.figures(gr.load_gpu_results()[-1], gr.load_json("engine_cuda.json"))
    assert stored["engine, graphs / eager"] > 1 and stored["decode B=1, graph µs"] < stored["decode B=1, eager µs"]


def test_engine_compile_rows_show_sm75_in_fp16_beside_sm80_and_sm90_in_bf16():
    rows = gr.engine_compile_rows("decode_kernel")
    assert {(r["target"], r["case"].split()[-1]) for r in rows} == {
        ("sm_75", "fp16"),
        ("sm_80", "bf16"),
        ("sm_90", "bf16"),
    }
    first = [r["target"] for r in rows[:3]]
    assert first == ["sm_75", "sm_80", "sm_90"] and len({r["case"].rsplit(" ", 1)[0] for r in rows[:3]}) == 1
    assert all(r["stack_bytes"] == 0 for r in rows + gr.engine_compile_rows("prefill_kernel"))


def test_chatbot_prompts_share_the_system_prompt_and_keep_the_stored_lengths():
    workload = {"system_prompt_tokens": 5, "prompt_tokens": [8, 9, 7]}
    prompts = gpu_live.chatbot_prompts(workload)
    assert [len(p) for p in prompts] == [8, 9, 7]
    assert all(p[:5] == prompts[0][:5] for p in prompts) and prompts[0][5:] != prompts[1][5:8]
    assert prompts == gpu_live.chatbot_prompts(workload)


def test_measure_is_none_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_live.measure() is None
