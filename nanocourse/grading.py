"""Grade a chapter: run its graded tests against your code and print a scorecard.

    make grade CH=04                          # from the shell
    make grade CH=04 FIRST=1                  # stop at the first task that fails
    make grade CH=all                         # the whole course, one scorecard
    from nanocourse.grading import grade
    grade("04")                               # from a notebook cell

Each graded test carries a stable task id (`@pytest.mark.task("04.1", "title")`). The tests run in
a fresh Python process, so edits to exercises/ are always picked up without restarting the kernel.
NANOENGINE_IMPL picks what is graded: "exercises" (yours, the default), "solutions" or "nanoengine".
Grading your exercises records which tasks your code tried (nanocourse.attempts): that opens their later hints.
This module is also the pytest plugin that records the results.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import takewhile
from pathlib import Path

import pytest

from nanocourse.attempts import record_attempts
from nanocourse.checkout import use_checkout

# The graded suites ship inside the package. They grade the `exercises` (or `solutions`) folder of the checkout
# nanocourse lies in (nanocourse/checkout.py), whose root the graded run starts in.
GRADED = Path(__file__).resolve().parent / "graded"
BUGS = GRADED.parent / "bugs"
ROOT = use_checkout()
IMPLS = ("exercises", "solutions", "nanoengine")  # or a folder holding chapter modules
MAX_MESSAGE_LINES = 40
MAX_LINE_CHARS = 1000
NOT_IMPLEMENTED = "not implemented yet (the stub still raises NotImplementedError)"
DID_NOT_RUN = "did not run"


@dataclass(slots=True)
class TaskResult:
    task: str
    title: str
    passed: bool
    message: str
    variant: str = ""  # the seeded-bug variant the result belongs to, when variants are graded


def chapter_files(chapter: str) -> list[Path]:
    """The graded test files of one chapter ("04"), of several ("02,04"), or of every chapter ("all")."""
    if chapter == "all":
        return sorted(GRADED.glob("test_ch*_*.py"))
    files = []
    for one in chapter.split(","):
        found = sorted(GRADED.glob(f"test_ch{int(one):02d}_*.py"))
        if not found:
            raise ValueError(f"No graded tests for chapter {one!r} in {GRADED.name}/.")
        files += found
    return files


def chapter_module(chapter: str) -> str:
    """The chapter's exercise module ("ch06_prefix_caching"): exercises/<module>.py is what its graded suite,
    graded/test_<module>.py, grades."""
    return chapter_files(chapter)[0].stem.removeprefix("test_")


def chapter_tasks(chapter: str) -> list[tuple[str, str]]:
    """(task id, title) of every graded task of one chapter, in file order, read from the `task` markers of its
    graded suite without running it."""
    tasks: dict[str, str] = {}
    for path in chapter_files(chapter):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "task":
                task, title = (arg.value for arg in node.args[:2] if isinstance(arg, ast.Constant))
                tasks.setdefault(task, title)
    return list(tasks.items())


class Scorecard(list):
    """The TaskResults of one grading run; shown as the ✓/✗ card in a notebook or a shell.

    skipped: the chapters whose graded suite could not run here, with the reason (chapter 03's needs
    Triton, which publishes wheels for Linux only).
    notes: a line per chapter that its graded suite gave with note() (chapter 13: which Scheduler its own extends),
    shown under the chapter's heading.
    """

    def __init__(
        self,
        chapter: str,
        impl: str,
        results: list[TaskResult],
        skipped: dict[str, str] | None = None,
        notes: dict[str, str] | None = None,
    ):
        super().__init__(results)
        self.chapter, self.impl, self.skipped, self.notes = chapter, impl, skipped or {}, notes or {}

    def __repr__(self) -> str:
        if self.chapter != "all" and "," not in self.chapter:
            heading = f"Chapter {int(self.chapter):02d} ({self.impl})"
            if f"{int(self.chapter):02d}" in self.skipped:
                return f"{heading}: skipped: {self.skipped[f'{int(self.chapter):02d}']}"
            return "\n".join(self._lines(heading, self, self.notes.get(f"{int(self.chapter):02d}")))
        subject = "The course" if self.chapter == "all" else f"Chapters {self.chapter.replace(',', ', ')}"
        lines = [f"{subject} ({self.impl}): {sum(r.passed for r in self)}/{len(self)} tasks pass"]
        for chapter in sorted({r.task.split(".")[0] for r in self} | set(self.skipped)):
            lines.append("")
            if chapter in self.skipped:
                lines.append(f"Chapter {chapter}: skipped: {self.skipped[chapter]}")
            else:
                results = [r for r in self if r.task.split(".")[0] == chapter]
                lines += self._lines(f"Chapter {chapter}", results, self.notes.get(chapter))
        return "\n".join(lines)

    @staticmethod
    def _lines(heading: str, results, note: str | None = None) -> list[str]:
        lines = [f"{heading}: {sum(r.passed for r in results)}/{len(results)} tasks pass"]
        if note:
            lines.append(f"  {note}")
        for r in results:
            lines.append(f"  {'✓' if r.passed else '✗'} {r.task:6} {r.title}")
            if not r.passed:
                lines += [f"           {line}" for line in r.message.splitlines()]
        return lines


def seeded_bugs(module: str) -> list[tuple[str, str, str, str]]:
    """A chapter module's seeded bugs (nanocourse/bugs/<module>.py): (task that must fail, the mistake, text found
    once in the worked solution, its replacement)."""
    return runpy.run_path(str(BUGS / f"{module}.py"))["BUGS"]


def tried_tasks(results: list[TaskResult]) -> list[str]:
    """The tasks a grading run tried with real code: a pass, or a failure other than the stub's
    NotImplementedError (a task that did not run, after a stop at the first failure, is untried)."""
    return sorted({r.task for r in results if r.passed or r.message not in (NOT_IMPLEMENTED, DID_NOT_RUN)})


def grade(chapter: str, impl: str = "exercises", first: bool = False) -> Scorecard:
    """Run chapter `chapter`'s graded tests against `impl`, in one process however many chapters: "04", "02,04",
    or "all"; the result displays as a scorecard. first: stop at the first task that fails (pytest -x); the tasks
    after it show as not run."""
    if impl not in IMPLS and not Path(impl).is_dir():
        raise ValueError(f"impl must be one of {IMPLS} or a folder of chapter modules, got {impl!r}")
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            *map(str, chapter_files(chapter)),
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "nanocourse.grading",
            f"--grade-report={report}",
            *(["-x"] if first else []),
        ]
        # No installed plugin: no graded test needs one, and loading them (nbval's nbformat and jsonschema,
        # hypothesis's, xdist's, anyio's) took 7 of a grade's 11 s.
        env = {**os.environ, "NANOENGINE_IMPL": impl, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False
        )  # failing tests exit 1
        if not report.exists():
            raise RuntimeError(f"the graded tests did not run:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        data = json.loads(report.read_text())
        results = [TaskResult(**r) for r in data["results"]]
        if impl == "exercises":  # the learner's own code: what it tried opens those tasks' later hints
            record_attempts(tried_tasks(results))
        return Scorecard(chapter, impl, results, data["skipped"], data.get("notes"))


# ---- the time limit of a task ---------------------------------------------------------------------
# A graded task that runs longer than this fails with a message naming it (a loop that never ends, or a
# mistake that makes a random grader crawl), and the chapter's other tasks still run. The slowest task on
# the worked solutions takes well under a minute here; NANOENGINE_TASK_LIMIT (seconds) sets another limit.
TASK_LIMIT_S = 240.0


class TaskTimeLimit(BaseException):  # not an Exception: no `except Exception` in graded code swallows it
    """A graded task ran past its time limit."""


def task_limit() -> float:
    return float(os.environ.get("NANOENGINE_TASK_LIMIT", TASK_LIMIT_S))


@contextmanager
def time_limit(task: str, seconds: float):
    """Run the body, stopping it with TaskTimeLimit (naming `task` and the limit) after `seconds` of wall time.

    A watchdog thread signals the main thread (SIGUSR1), whose handler raises: SIGALRM stays free for the
    graders' own per-call limits (nanocourse.differential.within). Where there is no SIGUSR1 (Windows), or off
    the main thread, the body runs unguarded."""
    if not hasattr(signal, "SIGUSR1") or threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield
        return

    def stop(*_):
        raise TaskTimeLimit(
            f"task {task} ran past its time limit of {seconds:g} s, so its grading was stopped: does a loop never "
            f"end, or does your code do far more work than the task needs?"
        )

    main = threading.main_thread().ident
    timer = threading.Timer(seconds, lambda: signal.pthread_kill(main, signal.SIGUSR1))
    timer.daemon = True
    previous = signal.signal(signal.SIGUSR1, stop)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, previous)


# ---- the pytest plugin side -------------------------------------------------------------------
def pytest_addoption(parser):
    parser.addoption("--grade-report", default=None, help="write graded-task results here as JSON")


def pytest_configure(config):
    config.addinivalue_line("markers", "task(id, title): a graded task with a stable id")
    config._graded = {}
    config._skipped_chapters = {}
    config._notes = {}


def note(chapter: str, text: str) -> None:
    """For a graded suite: a line the scorecard shows under chapter `chapter`'s heading (what the graded code
    builds on, say). Outside a graded run (plain pytest) it goes nowhere."""
    if _CONFIG is not None and hasattr(_CONFIG, "_notes"):
        _CONFIG._notes[chapter] = text


def pytest_collectreport(report):
    """A graded file skipped as a whole (pytest.importorskip at its top) skips its chapter."""
    if report.skipped and _CONFIG is not None and (name := Path(report.nodeid).name).startswith("test_ch"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _CONFIG._skipped_chapters[name[7:9]] = reason.removeprefix("Skipped: ")


@pytest.hookimpl(trylast=True)  # after conftest deselections: record only what runs
def pytest_collection_modifyitems(config, items):
    for item in items:
        marker = item.get_closest_marker("task")
        if marker is not None:
            variant = item.callspec.params.get("variant", "") if hasattr(item, "callspec") else ""
            config._graded[item.nodeid] = TaskResult(
                *marker.args, passed=False, message=DID_NOT_RUN, variant=variant or ""
            )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """Each graded task runs under its time limit."""
    marker = item.get_closest_marker("task")
    if marker is None:
        yield
        return
    with time_limit(marker.args[0], task_limit()):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Name the learner's function an exception came out of, while the traceback is still at hand."""
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is not None and not call.excinfo.errisinstance(NotImplementedError):
        report.learner_location = _learner_location(call.excinfo)


def _learner_location(excinfo) -> str:
    """ "your Scheduler.schedule (exercises/ch07_scheduler.py, line 88)" for the innermost frame of the graded
    code (exercises/, solutions/ or a variant folder) the exception passed through; "" if it passed through none."""
    impl = os.environ.get("NANOENGINE_IMPL", "exercises")
    folders = [ROOT / "exercises", ROOT / "solutions"] + ([Path(impl).resolve()] if os.path.isdir(impl) else [])
    for entry in reversed(excinfo.traceback):
        path = Path(str(entry.path)).resolve()
        if any(path.is_relative_to(folder) for folder in folders):
            name = getattr(entry.frame.code.raw, "co_qualname", entry.name)
            where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
            return f"your {name} ({where}, line {entry.lineno + 1})"
    cause = excinfo.value.__cause__  # a grader that reports the learner's exception in its own words
    return _learner_location(pytest.ExceptionInfo.from_exception(cause)) if cause is not None else ""


def pytest_runtest_logreport(report):
    result = _CONFIG._graded.get(report.nodeid) if _CONFIG else None
    if result is None or report.when == "teardown":
        return
    if report.failed:
        result.passed, result.message = False, _short(report)
    elif report.when == "call":
        result.passed, result.message = report.passed, ""


def pytest_sessionstart(session):
    global _CONFIG
    _CONFIG = session.config


def pytest_sessionfinish(session):
    path = session.config.getoption("--grade-report")
    if path:
        results = [
            {"task": r.task, "title": r.title, "passed": r.passed, "message": r.message, "variant": r.variant}
            for r in session.config._graded.values()
        ]
        data = {"results": results, "skipped": session.config._skipped_chapters, "notes": session.config._notes}
        Path(path).write_text(json.dumps(data))


_CONFIG = None


def _short(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    text = text.removeprefix(f"{__name__}.")  # TaskTimeLimit: ..., not its module's path
    if "NotImplementedError" in text:
        return NOT_IMPLEMENTED
    lines = text.strip().splitlines() or ["failed"]
    if location := getattr(report, "learner_location", ""):  # it came out of the learner's code: say where
        lines[0] = f"{lines[0]}, raised in {location}"
    # A message may span lines (a differential grader's operations); pytest's own introspection, from the first
    # line that starts with "assert ", repeats what the message says in code, and
    # hypothesis's own report of the failing example follows it in the code's terms.
    kept = list(
        takewhile(
            lambda line: (
                not line.startswith(("assert ", "Falsifying example", "Failing test case", "Failing explicit example"))
            ),
            lines[1:MAX_MESSAGE_LINES],
        )
    )
    return "\n".join(_clip(line) for line in [lines[0], *kept])


def _clip(line: str) -> str:
    """A message line as it is, or, past MAX_LINE_CHARS, its start and its end: a grader's message states the rule
    first and what your code returned last, and both must survive."""
    if len(line) <= MAX_LINE_CHARS:
        return line
    head = MAX_LINE_CHARS * 3 // 5
    return f"{line[:head]} … {line[head - MAX_LINE_CHARS :]}"


def main(argv: list[str] | None = None) -> int:
    """Print the scorecard. Open tasks are the learner's normal state, so the exit status is 0 unless
    --strict (CI's mode) asks for 1 whenever a task fails."""
    parser = argparse.ArgumentParser(prog="python -m nanocourse.grading")
    parser.add_argument("chapter", help='a chapter ("04") or "all"')
    parser.add_argument("impl", nargs="?", default="exercises", help="exercises, solutions, nanoengine or a folder")
    parser.add_argument("--strict", action="store_true", help="exit 1 when any task fails")
    parser.add_argument("--first", action="store_true", help="stop at the first task that fails")
    args = parser.parse_args(argv)
    card = grade(args.chapter, args.impl, first=args.first)
    print(card)
    return 1 if args.strict and not all(r.passed for r in card) else 0


if __name__ == "__main__":
    sys.exit(main())
