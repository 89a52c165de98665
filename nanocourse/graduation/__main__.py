"""`python -m nanocourse.graduation` (`make graduate`): nanoengine's parts against vLLM 0.33.0's own classes.

    python -m nanocourse.graduation                  # the engine's own parts
    python -m nanocourse.graduation --parts solutions # the worked solutions (solutions/ch04..ch07, ch13)
    python -m nanocourse.graduation --parts learner   # your finished parts (exercises/), the engine's elsewhere
    python -m nanocourse.graduation --known           # replay the divergences found so far: which still diverge

The first run downloads vLLM's wheel once (336 MB, into the course's cache); without it and without a network it
stops with one message and changes nothing. Exit status 0 when nothing diverged, 1 when something did, 2 when
the wheel could not be had.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from nanocourse.graduation.common import ON_PURPOSE, Parts, Result, parts_for
from nanocourse.graduation.kv_checks import MANAGER_CHECKS, check_free_queue, check_hashes, check_manager, check_pool
from nanocourse.graduation.loader import load_vllm
from nanocourse.graduation.scheduler_check import SCHEDULER_CHECKS, check_scheduler, replay_known
from nanocourse.graduation.vllm_side import Vllm
from nanocourse.graduation.wheel import VLLM_VERSION, WHEEL_SHA256, WheelError, fetch_wheel

PARTS_CHOICES = ("engine", "solutions", "learner")


def checks(examples: int) -> list[tuple[str, Callable[[Vllm, Parts], Result]]]:
    """Every check with its number of random examples (the scheduler's cost more per example)."""
    kv = [
        ("block hashes (cache_salt, LoRA)", lambda v, p: check_hashes(v, p, examples)),
        ("free queue", lambda v, p: check_free_queue(v, p, examples)),
        ("block pool and free queue", lambda v, p: check_pool(v, p, examples)),
    ] + [(name, functools.partial(lambda v, p, n: check_manager(v, p, n, examples), n=name)) for name in MANAGER_CHECKS]
    scheduler = [
        (name, functools.partial(lambda v, p, n: check_scheduler(v, p, n, examples), n=name))
        for name in SCHEDULER_CHECKS
    ]
    return kv + scheduler


def report(results: list[Result], parts: Parts, vllm: Vllm, seconds: float) -> str:
    """The certificate-like summary: the parts, the operations compared, the divergences and vLLM's files."""
    operations = sum(r.operations for r in results)
    diverged = [r for r in results if r.divergence]
    lines = [f"Graduation: {parts.whose} parts against vLLM {VLLM_VERSION}'s own classes, loaded from its wheel"]
    if parts.table:
        lines += [parts.table, ""]
    lines.append(f"  wheel sha256 {WHEEL_SHA256}")
    for path, digest in sorted(vllm.modules.file_sha256.items()):
        lines.append(f"  {digest[:16]}  {path}")
    lines.append("")
    for r in results:
        verdict = "DIVERGES" if r.divergence else "0 divergences"
        lines.append(
            f"  {r.name:44} {r.examples:5} workloads {r.operations:7} operations  {r.seconds:6.1f} s  {verdict}"
        )
    lines.append("")
    if diverged:
        lines.append(
            f"{len(diverged)} of {len(results)} checks diverge from vLLM {VLLM_VERSION} ({operations} operations "
            f"compared in {seconds:.0f} s). The shortest sequence found for each:"
        )
        for r in diverged:
            lines += ["", f"== {r.name}", r.divergence or ""]
    else:
        lines.append(
            f"0 divergences over {operations} operations against vLLM {VLLM_VERSION}'s own BlockPool, KVCacheManager "
            f"and Scheduler ({len(results)} checks, {seconds:.0f} s)."
        )
    lines += ["", "Compared around on purpose (never skipped):"] + [f"  - {note}" for note in ON_PURPOSE]
    return "\n".join(lines)


def known(vllm: Vllm, parts: Parts) -> int:
    """Replay the shortest cases of the divergences found so far (KNOWN_CASES): which still diverge, and how."""
    found = replay_known(vllm, parts)
    for name, story in found.items():
        print(f"{'still diverges' if story else 'agrees now':15} {name}")
        if story:
            print("\n".join(f"    {line}" for line in story.splitlines()[:1]))
    return 1 if any(found.values()) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nanocourse.graduation", description=__doc__.split("\n")[0])
    parser.add_argument("--parts", choices=PARTS_CHOICES, default="engine", help="whose parts to graduate")
    parser.add_argument("--examples", type=int, default=200, help="random workloads per check (default 200)")
    parser.add_argument("--only", action="append", default=[], help="run only checks whose name contains this")
    parser.add_argument("--report", type=Path, help="also write the report to this file")
    parser.add_argument("--known", action="store_true", help="replay only the known divergences' shortest cases")
    args = parser.parse_args(argv)
    try:
        wheel = fetch_wheel()
    except WheelError as error:
        print(f"graduation: {error}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    vllm = Vllm(load_vllm(wheel))
    parts = parts_for(args.parts)
    if args.known:
        return known(vllm, parts)
    todo = [(name, run) for name, run in checks(args.examples) if not args.only or any(o in name for o in args.only)]
    results = []
    with tqdm(todo, desc="graduation", unit="check", file=sys.stderr) as bar:
        for name, run in bar:
            bar.set_postfix_str(name)
            results.append(run(vllm, parts))
    text = report(results, parts, vllm, time.perf_counter() - start)
    print(text)
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(text + "\n")
    return 1 if any(r.divergence for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
