"""One graduation run, from Python or the command line: every check on one side's parts, and its report.

`graduate()` is what the last chapter's cell and `make graduate` both call. Its result prints (and displays in a
notebook) as the certificate-like report: the parts, the operations compared, the wheel's and every loaded file's
sha256, and for each check that diverges the shortest sequence found. Without the wheel and without a network it
returns the reason instead (`Graduation.error`), having changed nothing.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import IO, Any

from tqdm import tqdm

from nanocourse.graduation.common import KNOWN_DIFFERENCES, ON_PURPOSE, Parts, Result, parts_for
from nanocourse.graduation.kv_checks import MANAGER_CHECKS, check_free_queue, check_hashes, check_manager, check_pool
from nanocourse.graduation.loader import load_vllm
from nanocourse.graduation.scheduler_check import SCHEDULER_CHECKS, check_scheduler, replay_known, verdict
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


def load(wheel_announce: Callable[[str], Any] = print) -> Vllm:
    """vLLM's classes from the wheel (fetched once); WheelError where it cannot be had."""
    return Vllm(load_vllm(fetch_wheel(announce=wheel_announce)))


def report(results: list[Result], parts: Parts, vllm: Vllm, seconds: float, known: dict[str, str | None]) -> str:
    """The certificate-like summary: the parts, the operations compared, the divergences and vLLM's files; where
    something diverges, which of the divergences found so far (KNOWN_CASES) still diverge."""
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
        outcome = "DIVERGES" if r.divergence else "0 divergences"
        num_known = sum(count for count, _ in r.known.values())
        lines.append(
            f"  {r.name:44} {r.examples:5} workloads {r.operations:7} operations  {r.seconds:6.1f} s  {outcome}"
            + (f" ({num_known} reached a known difference)" if num_known else "")
        )
    lines.append("")
    reached = [(r.name, case, count, first) for r in results for case, (count, first) in r.known.items()]
    if reached:
        lines.append("Known differences, reported by name and compared no further (workloads that reached one):")
        for name, case, count, first in reached:
            lines += [f"  {name}: {count} reached {case}: {KNOWN_DIFFERENCES[case]}", f"    the first: {first}"]
        lines.append("")
    if diverged:
        lines.append(
            f"{len(diverged)} of {len(results)} checks diverge from vLLM {VLLM_VERSION} ({operations} operations "
            f"compared in {seconds:.0f} s)."
        )
        lines += ["", "Divergences found so far (--known), replayed on these parts:"]
        lines += [f"  {verdict(story):15} {name}" for name, story in known.items()]
        lines += ["", "The shortest sequence found for each check that diverges:"]
        for r in diverged:
            lines += ["", f"== {r.name}", r.divergence or ""]
    else:
        lines.append(
            f"0 divergences over {operations} operations against vLLM {VLLM_VERSION}'s own BlockPool, KVCacheManager "
            f"and Scheduler ({len(results)} checks, {seconds:.0f} s)."
        )
    lines += ["", "Compared around on purpose (never skipped):"] + [f"  - {note}" for note in ON_PURPOSE]
    return "\n".join(lines)


@dataclass
class Graduation:
    """A run's outcome. Prints, and displays in a notebook, as its report; `error` says why it could not run."""

    text: str
    results: list[Result] = field(default_factory=list)
    error: str | None = None

    @property
    def diverged(self) -> list[Result]:
        return [r for r in self.results if r.divergence]

    @property
    def exit_status(self) -> int:
        """`python -m nanocourse.graduation`'s: 0 nothing diverged, 1 something did, 2 no wheel."""
        return 2 if self.error else 1 if self.diverged else 0

    def __str__(self) -> str:
        return self.text

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.text)


def graduate(
    parts: str = "learner", examples: int = 200, only: Iterable[str] = (), file: IO[str] | None = None
) -> Graduation:
    """Run every check (or those whose name contains one of `only`) with `examples` random workloads each, on
    `parts`: "learner" (your finished parts, nanoengine's where a chapter is not), "solutions" or "engine".
    A progress bar shows the check running (a widget in a notebook, `file` or stderr elsewhere).

    ValueError for a `parts` not among PARTS_CHOICES or an `examples` below 1. Without the wheel and without a
    network: a Graduation whose error (and text) says so; nothing was changed."""
    if parts not in PARTS_CHOICES:
        raise ValueError(f"parts={parts!r}: give one of {', '.join(PARTS_CHOICES)}")
    if examples < 1:
        raise ValueError(f"examples={examples}: give at least 1 random workload per check")
    start = time.perf_counter()
    try:
        vllm = load()
    except WheelError as error:
        return Graduation(text=f"graduation could not run: {error}", error=str(error))
    chosen = parts_for(parts)
    only = list(only)
    todo = [(name, run) for name, run in checks(examples) if not only or any(o in name for o in only)]
    results = []
    # tqdm's text bar, in a notebook too: its widget bar would be a widget with nothing to interact with
    with tqdm(todo, desc="graduation", unit="check", file=file, mininterval=5) as bar:
        for name, run in bar:
            bar.set_postfix_str(name, refresh=False)
            results.append(run(vllm, chosen))
    known = replay_known(vllm, chosen) if any(r.divergence for r in results) else {}
    return Graduation(report(results, chosen, vllm, time.perf_counter() - start, known), results)
