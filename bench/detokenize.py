"""Per-step detokenizing cost as a generation grows: decoding the whole output again (what the engine
did before) against tokenizers' DecodeStream (IncrementalDetokenizer, what it does now).

    python bench/detokenize.py        # table + bench/results/detokenize_cpu.json

The token ids are SmolLM2's tokenizer run over varied text (prose, code, accents, CJK, emoji), so
multi-byte characters split across tokens are in the mix. At each output length n, "whole" times
`decode(ids[:n])` and "stream" times feeding tokens n-31 .. n, one step each, to a detokenizer that
has seen the ids before them; both are medians over repeats. The ratio column is whole / stream in the same run.
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tqdm import tqdm

from bench.machine import machine_info
from nanoengine.engine.detokenizer import IncrementalDetokenizer
from nanoengine.model.loader import unpacked_folder
from nanoengine.model.tokenizer import Tokenizer

RESULTS = ROOT / "bench" / "results" / "detokenize_cpu.json"
LENGTHS = [100, 250, 500, 1000, 2000]
TEXT = (
    "The engine keeps each request's keys and values in fixed-size blocks. "
    "def step(self):\n    return [r for r in self.running if r.num_tokens > 0]\n"
    "Héllo wörld, naïve café — 日本語のテキスト, 한국어 🙂👍🏽. "
)


def median_us(fn, repeats: int = 41) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def stream_step_us(tokenizer: Tokenizer, ids: list[int], n: int, window: int = 32, repeats: int = 41) -> float:
    """Per-step time of tokens n-window+1 .. n fed one by one to a detokenizer that saw the ids before
    them (fed untimed): a mean over a window, since one token may be a multi-byte fragment."""
    times, steps = [], [ids[:k] for k in range(n - window + 1, n + 1)]
    for _ in range(repeats):
        detokenizer = IncrementalDetokenizer(tokenizer)
        detokenizer.update(ids[: n - window])
        start = time.perf_counter()
        for prefix in steps:
            detokenizer.update(prefix)
        times.append((time.perf_counter() - start) / window)
    return statistics.median(times) * 1e6


def main() -> None:
    _, folder = unpacked_folder(progress=False)
    tokenizer = Tokenizer(folder)
    ids = tokenizer.encode(TEXT * 60)[: max(LENGTHS)]
    assert len(ids) == max(LENGTHS)
    rows = []
    for n in tqdm(LENGTHS, desc="detokenize", unit="length"):
        prefix = ids[:n]
        whole = median_us(functools.partial(tokenizer.decode, prefix))
        stream = stream_step_us(tokenizer, ids, n)
        rows.append(
            {
                "output_tokens": n,
                "whole_decode_us": round(whole, 2),
                "stream_step_us": round(stream, 2),
                "whole_over_stream": round(whole / stream, 1),
            }
        )
    print(f"{'output tokens':>13} {'whole decode':>13} {'stream step':>12} {'ratio':>7}")
    for r in rows:
        print(
            f"{r['output_tokens']:>13} {r['whole_decode_us']:>10.1f} us {r['stream_step_us']:>9.2f} us "
            f"{r['whole_over_stream']:>6.1f}x"
        )
    flat = rows[-1]["stream_step_us"] / rows[0]["stream_step_us"]
    print(f"stream step at {LENGTHS[-1]} tokens / at {LENGTHS[0]}: {flat:.2f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "machine": machine_info(),
                "method": "median of 41 repeats per length; stream = mean DecodeStream step over tokens n-31..n",
                "stream_step_growth_100_to_2000": round(flat, 2),
                "rows": rows,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
