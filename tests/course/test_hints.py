"""Hints a learner opens on purpose (nanocourse.hints): every chapter that has them lists them and shows each one,
and a wrong chapter or number says what exists."""

import re

import pytest

from nanocourse import hint
from nanocourse.hints import HINTS_DIR, chapter_hints

CHAPTERS = sorted(p.stem for p in HINTS_DIR.glob("*.md"))


def test_chapter_07_has_hints():
    assert "07" in CHAPTERS


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_a_chapters_hints_list_and_open_one_at_a_time(chapter):
    hints = chapter_hints(chapter)
    assert len(hints) >= 3, "hints go from a nudge to close-to-code: at least three steps"
    listing = str(hint(chapter))
    assert all(f"{h.number}. {h.title}" in listing for h in hints)
    assert all(h.text not in listing for h in hints), "the list shows titles only, not the hints themselves"
    first = hint(int(chapter), 1)
    assert str(first).startswith(f"Hint {chapter}.1: {hints[0].title}") and hints[0].text in str(first)
    assert first._repr_markdown_().startswith(f"**Hint {chapter}.1:")


def test_a_wrong_chapter_or_number_says_what_exists():
    with pytest.raises(ValueError, match="hints 1 to"):
        hint("07", 0)
    with pytest.raises(ValueError, match="chapters with hints: .*07"):
        hint("99")


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_attribute_a_hint_names_is_one_the_worked_solution_uses(chapter):
    """A hint that says `self.head` where the grader reads `self.fake_free_list_head` sends the learner to a failure."""
    solution = next((HINTS_DIR.parents[1] / "solutions").glob(f"ch{chapter}_*.py")).read_text()
    named = {n for h in chapter_hints(chapter) for n in re.findall(r"self\.([A-Za-z_]\w*)", h.text)}
    unknown = sorted(n for n in named if not re.search(rf"(self\.{n}\b|def {n}\b)", solution))
    assert unknown == [], (
        f"chapter {chapter}'s hints name self.{', self.'.join(unknown)}, which its worked solution "
        "never uses: the contract's names are the ones the grader reads"
    )
