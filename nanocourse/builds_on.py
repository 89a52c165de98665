"""What chapter 13's Scheduler extends: chapter 07's.

Chapter 13 adds two speculative methods to a scheduler, and the scheduler it adds them to is chapter 07's: your
own once chapter 07 is finished, nanoengine's while it is not, so that chapter 13 can be done first. "Finished"
is decided as my_llm() decides whether your chapter 07 serves (nanocourse.my_engine.part_status): no stub left in
exercises/ch07_scheduler.py and every graded task of chapter 07 passing. That grade is cached on the file's
content (in memory and on disk), so asking again costs nothing until you edit it; a file with stubs left is not
graded at all. A chapter 07 that has no stubs but fails a task is not extended: its mistake would show up as
chapter 13's.

The worked solutions' chapter 13 always extends the worked solutions' chapter 07, so grading `solutions` grades
the pair.

    from nanocourse.builds_on import chapter_07_scheduler
    Chapter07Scheduler = chapter_07_scheduler("exercises")
    class Scheduler(Chapter07Scheduler): ...

scheduler_note(Scheduler) then says, in one line, which one it extends and why: the scorecard of chapter 13
(make grade CH=13) and my_llm()'s table show it.
"""

from __future__ import annotations

import importlib

from nanoengine.core.sched.scheduler import Scheduler as EngineScheduler

SOURCES = ("exercises", "solutions")
_NOTES: dict[type, str] = {}  # each chapter-07 scheduler handed out, with the line that says why


def chapter_07_status(source: str = "exercises") -> tuple[bool, str]:
    """(whether chapter 13 of `source` extends chapter 07's Scheduler, the reason in words)."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    if source == "solutions":
        return True, "the worked solution"
    from nanocourse.my_engine import PARTS, part_status

    status = part_status(next(p for p in PARTS if p.chapter == "07"), source)
    return status.finished, status.why


def extends_line(source: str, finished: bool, why: str = "") -> str:
    """The line that says what chapter 13's Scheduler of `source` extends; why (chapter 07's state) is added when
    it is nanoengine's, unless empty."""
    if source == "solutions":
        return "The worked chapter 13 Scheduler extends the worked chapter 07 Scheduler (solutions/ch07_scheduler.py)."
    if finished:
        return (
            "Your chapter 13 Scheduler extends your chapter 07 Scheduler (exercises/ch07_scheduler.py passes its "
            "grade): your speculative methods run with your schedule()."
        )
    line = (
        "Your chapter 13 Scheduler extends nanoengine's Scheduler, not your chapter 07 one, until chapter 07 passes "
        "its grade."
    )
    return f"{line} Chapter 07: {why}" if why else line


def chapter_07_scheduler(source: str = "exercises") -> type:
    """The class chapter 13's Scheduler of `source` extends: chapter 07's Scheduler of `source` (your
    exercises/ch07_scheduler.py as it is on disk now, or the worked solution's) when chapter 07 is finished, else
    nanoengine's Scheduler. Grades chapter 07 first if it has no stub left and no cached grade (seconds, once)."""
    finished, why = chapter_07_status(source)
    if not finished:
        scheduler = EngineScheduler
    elif source == "solutions":
        scheduler = importlib.import_module("solutions.ch07_scheduler").Scheduler
    else:
        from nanocourse.my_engine import load_exercise

        scheduler = load_exercise("ch07_scheduler").Scheduler
    _NOTES[scheduler] = extends_line(source, finished, why)
    return scheduler


def scheduler_note(scheduler: type) -> str:
    """One line: what this chapter-13 Scheduler extends, and why (for a scorecard or a table)."""
    if scheduler is EngineScheduler:
        return "nanoengine's own Scheduler: chapter 07's schedule() and chapter 13's methods are both the engine's."
    for base in scheduler.__mro__[1:]:
        if base in _NOTES:
            return _NOTES[base]
    base = scheduler.__mro__[1]
    return f"{scheduler.__qualname__} extends {base.__module__}.{base.__qualname__}."


__all__ = ["chapter_07_scheduler", "chapter_07_status", "extends_line", "scheduler_note"]
