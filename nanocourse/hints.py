"""Hints a learner opens on purpose, one at a time: `hint("07")` lists a chapter's hints, `hint("07", 1)` shows
the first. The stubs in exercises/ state only their contracts (what must hold, the vLLM function mirrored, an
example); the way to get there lives here, from a nudge to the last hint, which may be close to code.

Each chapter's hints are nanocourse/hints/<chapter>.md: a heading `## <title>` per hint, in order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

HINTS_DIR = Path(__file__).resolve().parent / "hints"


@dataclass(frozen=True, slots=True)
class Hint:
    chapter: str
    number: int
    title: str
    text: str

    def __str__(self) -> str:
        return f"Chapter {self.chapter}, hint {self.number}: {self.title}\n\n{self.text}"

    def _repr_markdown_(self) -> str:
        return f"**Chapter {self.chapter}, hint {self.number}: {self.title}**\n\n{self.text}"


@dataclass(frozen=True, slots=True, repr=False)
class HintList:
    """A chapter's hints, shown by title only, however it is displayed (a notebook, print, a Python prompt): a
    learner opens each hint on purpose."""

    chapter: str
    hints: tuple[Hint, ...]

    def __str__(self) -> str:
        lines = [f"Chapter {self.chapter}: {len(self.hints)} hints; open one with hint({self.chapter!r}, n)"]
        return "\n".join(lines + [f"  {h.number}. {h.title}" for h in self.hints])

    __repr__ = __str__

    def _repr_markdown_(self) -> str:
        items = "\n".join(f"{h.number}. {h.title}" for h in self.hints)
        return f"Chapter {self.chapter}: open one with `hint({self.chapter!r}, n)`\n\n{items}"


def chapter_hints(chapter: str) -> tuple[Hint, ...]:
    """The chapter's hints, in order."""
    chapter = f"{int(chapter):02d}"
    path = HINTS_DIR / f"{chapter}.md"
    if not path.exists():
        raise ValueError(
            f"Chapter {chapter} has no hints ({path.name} is missing); chapters with hints: "
            f"{', '.join(sorted(p.stem for p in HINTS_DIR.glob('*.md')))}."
        )
    parts = re.split(r"^## (.+)$", path.read_text(), flags=re.MULTILINE)[1:]
    return tuple(
        Hint(chapter, i + 1, title.strip(), text.strip())
        for i, (title, text) in enumerate(zip(parts[::2], parts[1::2]))
    )


def hint(chapter: str, number: int | None = None) -> Hint | HintList:
    """The chapter's hint `number` (from 1), or without a number the list of its hints' titles."""
    hints = chapter_hints(chapter)
    if number is None:
        return HintList(hints[0].chapter, hints)
    if not isinstance(number, int) or not 1 <= number <= len(hints):
        raise ValueError(f"Chapter {hints[0].chapter} has hints 1 to {len(hints)}; got {number!r}.")
    return hints[number - 1]
