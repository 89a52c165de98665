"""Hints a learner opens on purpose, one at a time: `hint("07")` lists a chapter's hints, `hint("07", 1)` shows
the first. The stubs in exercises/ state only their contracts (what must hold, the vLLM function mirrored, an
example); the way to get there lives here, from a nudge to the last hint, which may be close to code.

Each chapter's hints are nanocourse/hints/<chapter>.md: a heading `## <title>` per hint, in order. A hint for
an exercise has a title "<task ids> <subject>: <rung>" ("06.2 free_blocks: read vLLM", "06.8, 06.2,
06.2b place_freed: close to code"); any other title speaks to the whole chapter.

The ladder keeps the stubs' order (design, grade, then read vLLM's function beside yours): before a first try
only an exercise's first rung, its question, is open. Every later rung (the idea, the vLLM lines, the code) opens
once every task it names has been tried by a grade of the learner's own code (nanocourse.attempts): an idea read
before one's own try answers the question the stub leaves open. `hint(ch, n, stuck=True)` opens one anyway: a
choice, never an accident.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from nanocourse.attempts import attempts

HINTS_DIR = Path(__file__).resolve().parent / "hints"
LADDER_RUNG = re.compile(r"\b(idea|vLLM|code)\b")
TITLE = re.compile(r"^(?P<tasks>\d\d\.\d+[a-z]?(?:, \d\d\.\d+[a-z]?)*) (?P<subject>[^:]+): (?P<rung>.+)$")


@dataclass(frozen=True, slots=True)
class Hint:
    """One hint. tasks: the graded tasks it is for (none for a hint on the whole chapter); gated: it opens only
    once every one of them has been tried."""

    chapter: str
    number: int
    title: str
    text: str
    tasks: tuple[str, ...] = ()
    gated: bool = False

    def __str__(self) -> str:
        return f"Chapter {self.chapter}, hint {self.number}: {self.title}\n\n{self.text}"

    def _repr_markdown_(self) -> str:
        return f"**Chapter {self.chapter}, hint {self.number}: {self.title}**\n\n{self.text}"

    def untried(self, tried: dict[str, int] | None = None) -> list[str]:
        """The tasks that keep this hint locked: those it names that no grade of the learner's code tried yet.
        tried: the attempt record, where the caller has read it already."""
        if not self.gated:
            return []
        tried = attempts() if tried is None else tried
        return [task for task in self.tasks if not tried.get(task)]


@dataclass(frozen=True, slots=True)
class LockedHint:
    """What `hint(ch, n)` shows for a gated hint whose tasks are untried: which to grade first, and how to open
    it anyway."""

    hint: Hint
    untried: tuple[str, ...]

    def _lines(self) -> list[str]:
        h, tasks = self.hint, " and ".join(self.untried)
        return [
            (
                f"Chapter {h.chapter}, hint {h.number}: {h.title} is locked until you have graded {tasks} with your own "
                "code: a pass, or any failure but the stub's NotImplementedError."
            ),
            (
                f"Try {TITLE.match(h.title)['subject']} yourself, then grade it: `make grade CH={h.chapter}` from the "
                f'shell, or `from nanocourse.grading import grade; grade("{h.chapter}")` in the notebook. Reading the idea, '
                "vLLM or code before your own try turns the design into copying."
            ),
            f"Truly stuck before a first try? `hint({h.chapter!r}, {h.number}, stuck=True)` opens it now.",
        ]

    def __str__(self) -> str:
        return "\n".join(self._lines())

    __repr__ = __str__

    def _repr_markdown_(self) -> str:
        return "\n\n".join(self._lines())


@dataclass(frozen=True, slots=True, repr=False)
class HintList:
    """A chapter's hints, shown by title only, however it is displayed (a notebook, print, a Python prompt): a
    learner opens each hint on purpose. A locked hint says so after its title."""

    chapter: str
    hints: tuple[Hint, ...]

    def _items(self) -> list[str]:
        items, tried = [], attempts()
        for h in self.hints:
            untried = h.untried(tried)
            items.append(
                f"{h.number}. {h.title}" + (f"  (locked: grade {', '.join(untried)} first)" if untried else "")
            )
        return items

    def __str__(self) -> str:
        lines = [f"Chapter {self.chapter}: {len(self.hints)} hints; open one with hint({self.chapter!r}, n)"]
        return "\n".join(lines + [f"  {item}" for item in self._items()])

    __repr__ = __str__

    def _repr_markdown_(self) -> str:
        items = "\n".join(self._items())
        return f"Chapter {self.chapter}: open one with `hint({self.chapter!r}, n)`\n\n{items}"


def chapter_hints(chapter: str) -> tuple[Hint, ...]:
    """The chapter's hints, in order, each with the tasks its title names and whether it is gated."""
    chapter = f"{int(chapter):02d}"
    path = HINTS_DIR / f"{chapter}.md"
    if not path.exists():
        raise ValueError(
            f"Chapter {chapter} has no hints ({path.name} is missing); chapters with hints: "
            f"{', '.join(sorted(p.stem for p in HINTS_DIR.glob('*.md')))}."
        )
    parts = re.split(r"^## (.+)$", path.read_text(), flags=re.MULTILINE)[1:]
    titles = [title.strip() for title in parts[::2]]
    matches = [TITLE.match(title) for title in titles]
    exercises = [m.group("tasks", "subject") if m else None for m in matches]
    hints = []
    for i, (title, text, match) in enumerate(zip(titles, parts[1::2], matches)):
        tasks = tuple(match["tasks"].split(", ")) if match else ()
        # Open: an exercise's first rung when it is a question; every idea, vLLM or code rung waits for a try.
        gated = match is not None and (exercises[i] in exercises[:i] or bool(LADDER_RUNG.search(match["rung"])))
        hints.append(Hint(chapter, i + 1, title, text.strip(), tasks, gated))
    return tuple(hints)


def hint(chapter: str, number: int | None = None, *, stuck: bool = False) -> Hint | HintList | LockedHint:
    """The chapter's hint `number` (from 1), or without a number the list of its hints' titles.

    A gated hint whose tasks no grade of your code has tried yet comes back as a LockedHint saying what to grade;
    stuck=True opens it anyway."""
    hints = chapter_hints(chapter)
    if number is None:
        return HintList(hints[0].chapter, hints)
    if not isinstance(number, int) or not 1 <= number <= len(hints):
        raise ValueError(f"Chapter {hints[0].chapter} has hints 1 to {len(hints)}; got {number!r}.")
    chosen = hints[number - 1]
    untried = [] if stuck else chosen.untried()
    return LockedHint(chosen, tuple(untried)) if untried else chosen
