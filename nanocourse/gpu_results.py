"""Chapter 11's readings of what the GPU tooling wrote under bench/results/ (no GPU or Triton needed).

- `kernels_offline.json` (`python bench/kernels_offline.py`): every Triton kernel compiled for sm_75 (fp16),
  sm_80 and sm_90 with no GPU, with its registers, spills (stack bytes) and the occupancy they allow;
- `attention_<gpu>.json` (`python bench/attention.py` on a GPU): decode bandwidth against the device's
  copy, SDPA and gather + SDPA, eager and replayed from a CUDA graph;
- `engine_cuda*.json` (`python bench/engine.py --device cuda --random-weights`): the chatbot
  benchmark on the GPU, with and without CUDA graphs.

On a CUDA machine, nanocourse.gpu_live measures the same figures again; `figures` reads a stored run and a
live one alike, and `comparison_rows` sets them side by side.
"""

from __future__ import annotations

import json
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parents[1] / "bench" / "results"


def load_json(name: str, results_dir: Path = RESULTS_DIR) -> dict:
    return json.loads((Path(results_dir) / name).read_text())


def compile_rows(
    kernel: str, dtype: str = "bf16", hints: str = "engine", results_dir: Path = RESULTS_DIR
) -> list[dict]:
    """The offline gate's rows for one kernel ("decode_kernel", ...) across shapes and targets."""
    rows = load_json("kernels_offline.json", results_dir)["kernels"]
    return [r for r in rows if r["kernel"] == kernel and f" {dtype}" in r["case"] and r["hints"] == hints]


# The dtype the engine runs on each target (nanoengine's default_dtype): Turing has no bf16.
ENGINE_DTYPES = {"sm_75": "fp16", "sm_80": "bf16", "sm_90": "bf16"}


def engine_compile_rows(kernel: str, hints: str = "engine", results_dir: Path = RESULTS_DIR) -> list[dict]:
    """compile_rows for the dtype the engine runs on each target (ENGINE_DTYPES), each case's targets
    oldest first: sm_75 in fp16 beside sm_80 and sm_90 in bf16."""
    rows = [
        r
        for target, dtype in ENGINE_DTYPES.items()
        for r in compile_rows(kernel, dtype, hints, results_dir)
        if r["target"] == target
    ]
    cases = list(dict.fromkeys(_case(r) for r in compile_rows(kernel, "bf16", hints, results_dir)))
    return sorted(rows, key=lambda r: (cases.index(_case(r)), r["target"]))


def _case(row: dict) -> str:
    """A row's case without its dtype: "decode split-K smollm2"."""
    return row["case"].rsplit(" ", 1)[0]


def compile_history(key: str, results_dir: Path = RESULTS_DIR) -> list[tuple[str, str]]:
    """(change, "N reg, M B stack") for one "case | kernel | target | hints <h>" key, oldest first."""
    history = load_json("kernels_offline.json", results_dir)["history"]
    return [(h["change"], h["figures"][key]) for h in history if key in h["figures"]]


# The chapter's bars, for the Llama-3-8B heads (32/8, d128) at B=64, L=2048, bf16.
BAR_ROW = {"heads": "llama3-8b", "batch": 64, "context": 2048}
BARS = (
    ("% of device-copy bandwidth", "pct_of_copy", 70.0),
    ("× faster than gather + SDPA", "x_vs_gather_sdpa", 2.5),
    ("× SDPA on contiguous KV", "x_vs_sdpa_contiguous", 0.9),
)


def load_gpu_results(results_dir: Path = RESULTS_DIR) -> list[dict]:
    """Every attention_<device>.json bench/attention.py wrote on a GPU, sorted by file name.

    The interpreter smoke's attention_cpu-interpret.json is a check of the script, not a GPU
    result, and is left out.
    """
    paths = sorted(p for p in Path(results_dir).glob("attention_*.json") if p.stem != "attention_cpu-interpret")
    return [json.loads(p.read_text()) for p in paths]


def check_bars(result: dict) -> list[tuple[str, float, float, bool]]:
    """(bar, measured, threshold, passed) for the BAR_ROW decode configuration of one result."""
    row = next((r for r in result["decode"] if all(r[k] == v for k, v in BAR_ROW.items())), None)
    if row is None:
        raise ValueError(f"no decode row for {BAR_ROW} in the results of {result.get('device')}")
    return [(label, row[key], bar, row[key] >= bar) for label, key, bar in BARS]


def plot_decode_bandwidth(result: dict, ax, heads: str = "llama3-8b") -> None:
    """Decode GB/s against context, one line per batch size; the device copy as a dashed line."""
    rows = [r for r in result["decode"] if r["heads"] == heads]
    for batch in sorted({r["batch"] for r in rows}):
        line = sorted((r["context"], r["triton_gbps"]) for r in rows if r["batch"] == batch)
        ax.plot(*zip(*line), marker="o", label=f"Triton, B={batch}")
    gather = sorted((r["context"], r["gather_sdpa_gbps"]) for r in rows if r["batch"] == max(r["batch"] for r in rows))
    ax.plot(*zip(*gather), linestyle=":", color="grey", label="gather + SDPA, largest B")
    ax.axhline(result["copy_gbps"], color="k", linestyle="--", label="device copy")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("GB/s")
    ax.set_title(f"decode, {heads}, {result['device']}, {result['dtype']}", fontsize=9)
    ax.legend(fontsize=7)


def figures(attention: dict, engine: dict) -> dict[str, float | str]:
    """The chapter's GPU figures from one run: an attention result (attention_<gpu>.json's layout) and
    an engine result (engine_cuda.json's), stored or measured live by nanocourse.gpu_live."""
    rows = {
        r["batch"]: r
        for r in attention["decode"]
        if r["heads"] == BAR_ROW["heads"] and r["context"] == BAR_ROW["context"]
    }
    big, one = rows[BAR_ROW["batch"]], rows[1]
    graphed, eager = (
        engine["results"][k]["throughput_tok_s"] for k in ("nanoengine_cache_on", "nanoengine_cache_on_eager")
    )
    return {
        "device": attention["device"],
        "dtype": attention["dtype"],
        "device copy, GB/s": attention["copy_gbps"],
        "decode B=64, GB/s": big["triton_gbps"],
        "decode B=64, % of copy": big["pct_of_copy"],
        "decode B=64, x gather + SDPA": big["x_vs_gather_sdpa"],
        "decode B=1, eager µs": 1e3 * one["triton_ms"],
        "decode B=1, graph µs": 1e3 * one["triton_graph_ms"],
        "engine, eager tokens/s": eager,
        "engine, CUDA graphs tokens/s": graphed,
        "engine, graphs / eager": graphed / eager,
    }


def comparison_rows(stored: dict, live: dict | None) -> list[tuple[str, str, str]]:
    """(figure, stored, live) formatted for printing; live None (no GPU here) gives "-" throughout."""

    def fmt(value):
        return value if isinstance(value, str) else f"{value:,.1f}"

    return [(name, fmt(value), fmt(live[name]) if live else "-") for name, value in stored.items()]
