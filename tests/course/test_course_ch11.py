"""Chapter 11's readers of the GPU results under bench/results/: no GPU and no Triton needed."""

import json

import pytest

from nanocourse import gpu_results as gr


# A synthetic bench/attention.py JSON.
def _row(batch, context, gbps, **extra):
    return {
        "heads": "llama3-8b",
        "batch": batch,
        "context": context,
        "triton_gbps": gbps,
        "gather_sdpa_gbps": gbps / 3,
        "pct_of_copy": 100 * gbps / 3000,
        "x_vs_gather_sdpa": 3.0,
        "x_vs_sdpa_contiguous": 1.1,
        **extra,
    }


def _result(device="NVIDIA H100 80GB HBM3", pct=75.0):
    rows = [_row(b, c, 2000.0) for b in (1, 64) for c in (512, 2048)]
    rows[3] = _row(64, 2048, 30 * pct, pct_of_copy=pct)
    return {"device": device, "dtype": "bfloat16", "copy_gbps": 3000.0, "decode": rows, "prefill": []}


def test_load_gpu_results_reads_bench_json_and_skips_the_interpreter_smoke(tmp_path):
    assert gr.load_gpu_results(tmp_path) == []
    (tmp_path / "attention_h100-80gb-hbm3.json").write_text(json.dumps(_result()))
    (tmp_path / "attention_cpu-interpret.json").write_text(json.dumps(_result("cpu")))
    (tmp_path / "engine_cpu.json").write_text("{}")
    results = gr.load_gpu_results(tmp_path)
    assert [r["device"] for r in results] == ["NVIDIA H100 80GB HBM3"]


def test_check_bars_reads_the_b64_l2048_row():
    passing = gr.check_bars(_result(pct=75.0))
    assert [(label, ok) for label, _, _, ok in passing] == [(label, True) for label, _, _ in gr.BARS]
    assert passing[0][1] == 75.0
    failing = gr.check_bars(_result(pct=60.0))
    assert failing[0][3] is False and failing[1][3] is True
    with pytest.raises(ValueError):
        gr.check_bars({"device": "x", "decode": []})


def test_plot_decode_bandwidth_draws_one_line_per_batch_and_the_copy_line():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    gr.plot_decode_bandwidth(_result(), ax)
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels == ["Triton, B=1", "Triton, B=64", "gather + SDPA, largest B", "device copy"]
    assert ax.get_lines()[1].get_ydata()[-1] == pytest.approx(2250.0)
    plt.close(fig)


def test_the_committed_results_pass_the_bars_and_the_compile_gate():
    """The H100 run meets the chapter's three bars, and no kernel the engine launches spills."""
    (h100,) = gr.load_gpu_results()
    assert all(ok for _, _, _, ok in gr.check_bars(h100))
    rows = gr.compile_rows("decode_kernel") + gr.compile_rows("prefill_kernel")
    assert rows and all(r["stack_bytes"] == 0 for r in rows)
    history = gr.compile_history("decode llama3-8b bf16 | decode_kernel | sm_80 | hints none")
    assert history[0][1].endswith("2864 B stack") and history[-1][1].endswith("0 B stack")
