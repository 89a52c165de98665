"""`python -m nanocourse.graduation` (`make graduate`): nanoengine's parts against vLLM 0.33.0's own classes.

    python -m nanocourse.graduation                  # the engine's own parts
    python -m nanocourse.graduation --parts solutions # the worked solutions (solutions/ch04..ch07, ch13)
    python -m nanocourse.graduation --parts learner   # your finished parts (exercises/), the engine's elsewhere
    python -m nanocourse.graduation --known           # replay the divergences found so far: which still diverge

The first run downloads vLLM's wheel once (336 MB, into the course's cache); without it and without a network it
stops with one message and changes nothing. Exit status 0 when nothing diverged, 1 when something did, 2 when
the wheel could not be had. The last chapter runs the same from Python: `graduate()` in run.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nanocourse.graduation.common import parts_for
from nanocourse.graduation.run import PARTS_CHOICES, graduate, load
from nanocourse.graduation.scheduler_check import KNOWN_PREFIX, replay_known, verdict
from nanocourse.graduation.wheel import WheelError


def known(parts: str) -> int:
    """Replay the shortest cases of the divergences found so far (KNOWN_CASES): which still diverge, and how."""
    try:
        vllm = load()
    except WheelError as error:
        print(f"graduation: {error}", file=sys.stderr)
        return 2
    found = replay_known(vllm, parts_for(parts))
    for name, story in found.items():
        print(f"{verdict(story):15} {name}")
        if story:
            print("\n".join(f"    {line}" for line in story.removeprefix(KNOWN_PREFIX).splitlines()[:1]))
    return 1 if any(verdict(story) == "still diverges" for story in found.values()) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nanocourse.graduation", description=__doc__.split("\n")[0])
    parser.add_argument("--parts", choices=PARTS_CHOICES, default="engine", help="whose parts to graduate")
    parser.add_argument("--examples", type=int, default=200, help="random workloads per check (default 200)")
    parser.add_argument("--only", action="append", default=[], help="run only checks whose name contains this")
    parser.add_argument("--report", type=Path, help="also write the report to this file")
    parser.add_argument("--known", action="store_true", help="replay only the known divergences' shortest cases")
    args = parser.parse_args(argv)
    if args.known:
        return known(args.parts)
    result = graduate(args.parts, args.examples, args.only, file=sys.stderr)
    print(result, file=sys.stderr if result.error else sys.stdout)
    if args.report and not result.error:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(result.text + "\n")
    return result.exit_status


if __name__ == "__main__":
    sys.exit(main())
