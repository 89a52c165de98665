"""The six prefix-caching workloads at the "bench" scale: prefix-cache hit rate and TTFT p50, cache on vs off.

    python bench/workloads.py [--threads 1]

Prompts are sent one at a time with max_tokens=1 (TTFT only). The workloads, the measuring and the table
come from nanoengine/benchmarks/ (datasets.py and prefix_caching.py); this script only picks the scale and
writes the report: bench/results/workloads_<device>.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script, it still finds bench/machine.py

from bench.machine import machine_info
from nanoengine import LLM, SamplingParams
from nanoengine.benchmarks.datasets import SCALES, make_workloads, sizes
from nanoengine.benchmarks.prefix_caching import measure, prefix_sweep, results_markdown, save_run, sweep_cost_model
from nanoengine.engine.arg_utils import resolve_device


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--scale", default="bench", choices=SCALES)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    start = time.perf_counter()
    llm_on = LLM(device=str(device), progress=False)
    llm_off = LLM(device=str(device), enable_prefix_caching=False, progress=False)
    for llm in (llm_on, llm_off):  # the first forward pass pays one-off set-up costs
        llm.generate("Warm-up.", SamplingParams(temperature=0, max_tokens=2))
    workloads = make_workloads(llm_on.tokenizer, args.scale)
    results = [measure(w, llm_on, llm_off) for w in tqdm(workloads, desc="workloads")]
    points = prefix_sweep(llm_on.tokenizer, llm_on, llm_off)
    model = sweep_cost_model(points)
    out = Path(args.out or Path(__file__).resolve().parent / "results" / f"workloads_{device.type}.json")
    save_run(
        out,
        results,
        points,
        {
            "scale": args.scale,
            "sizes": sizes(args.scale),
            "machine": {
                "device": str(device),
                **machine_info(),
                "torch_threads": torch.get_num_threads(),
                "torch": torch.__version__,
            },
            "seconds": time.perf_counter() - start,
        },
    )
    print(results_markdown(results, model))
    print(f"cost model: {model[0]:.0f} ms + {model[1]:.2f} ms per prefilled token; wrote {out.name}")


if __name__ == "__main__":
    main()
