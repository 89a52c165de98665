"""What vLLM 0.33 chose, and why: a chapter's answers, shown only once its graded tasks pass.

    from nanocourse import reveal
    reveal("06")      # the answers once chapter 06 passes; until then, which tasks are open and how to check them

A chapter that asks for a design keeps its answers out of the notebook, where a learner scrolling down (or reading
the notebook converted to text) would meet them before writing any code. They live in nanocourse/reveals/<chapter>.md.
Whether the chapter passes is decided as my_llm() decides it (nanocourse.my_engine.chapter_grade): the chapter's
graded tasks on your exercise file as it is on disk now, a scorecard kept on disk per file content, so asking again
after no edit grades nothing; a file with stubs left is not graded at all (it cannot pass yet), so that answer is
instant.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

REVEALS_DIR = Path(__file__).resolve().parent / "reveals"


@dataclass(frozen=True, slots=True)
class Reveal:
    """A chapter's answers (markdown), for a learner whose chapter passes."""

    chapter: str
    text: str

    def __str__(self) -> str:
        return self.text  # its first line is the heading

    __repr__ = __str__

    def _repr_markdown_(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class NotYet:
    """The answers stay hidden: the tasks still open, why, and how to check them."""

    chapter: str
    open_tasks: tuple[tuple[str, str], ...]  # (task id, title)
    why: str

    def _lines(self) -> tuple[str, list[str], str]:
        head = f"Chapter {self.chapter}'s answers open once its graded tasks pass: {self.why}."
        tasks = [f"{task} {title}" for task, title in self.open_tasks]
        check = (
            f"Check with `make grade CH={self.chapter}` (or `from nanocourse.grading import grade; "
            f'grade("{self.chapter}")`), then run `reveal("{self.chapter}")` again.'
        )
        return head, tasks, check

    def __str__(self) -> str:
        head, tasks, check = self._lines()
        return "\n".join([head, "Still open:", *(f"  {line}" for line in tasks), check])

    __repr__ = __str__

    def _repr_markdown_(self) -> str:
        head, tasks, check = self._lines()
        return "\n".join([f"**{head}**", "", "Still open:", "", *(f"- {line}" for line in tasks), "", check])


def reveal_text(chapter: str) -> str:
    """The chapter's answers as stored, whatever its grade (for the course's own checks, not for a learner)."""
    path = REVEALS_DIR / f"{chapter}.md"
    if not path.exists():
        raise ValueError(
            f"Chapter {chapter} has nothing to reveal ({path.name} is missing); chapters with a reveal: "
            f"{', '.join(sorted(p.stem for p in REVEALS_DIR.glob('*.md')))}."
        )
    return path.read_text().strip()


def reveal(chapter: str) -> Reveal | NotYet:
    """Chapter `chapter`'s answers once every one of its graded tasks passes on your files as they are now;
    otherwise which tasks are still open and how to check them."""
    from nanocourse import my_engine
    from nanocourse.grading import chapter_module, chapter_tasks

    chapter = f"{int(chapter):02d}"
    text = reveal_text(chapter)
    module = chapter_module(chapter)
    if left := my_engine.stubs_left(module):
        shown = ", ".join(left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
        return NotYet(chapter, tuple(chapter_tasks(chapter)), f"exercises/{module}.py still has stubs ({shown})")
    card = my_engine.chapter_grade(chapter)
    if chapter in card.skipped:
        return NotYet(chapter, tuple(chapter_tasks(chapter)), f"its grading cannot run here: {card.skipped[chapter]}")
    failed = {r.task: r.title for r in card if not r.passed}
    if failed or not card:
        return NotYet(chapter, tuple(failed.items()), f"{len(failed)} of its {len(card)} graded results fail")
    return Reveal(chapter, text)
