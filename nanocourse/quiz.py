"""Self-check quizzes: pick an answer, press Check, and a wrong answer explains itself.

A chapter's questions live in `quizzes/NN.json`, not in the notebook, so that reading the quiz cell
does not show the answer. The file holds two lists of questions:
- "quiz": the end-of-chapter quiz, shown by `chapter_quiz("NN")`;
- "predict": questions asked before a code cell runs, shown by `chapter_quiz("NN", "predict", i)`,
  whose answer the next cell then measures.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import ipywidgets as widgets

from nanocourse.live import show_widget

QUIZ_DIR = Path(__file__).with_name("quizzes")


@dataclass(slots=True, frozen=True)
class Question:
    """`why[i]` explains option i: why it is right, or the misconception behind choosing it."""

    prompt: str
    options: tuple[str, ...]
    answer: int
    why: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.options) != len(self.why) or not 0 <= self.answer < len(self.options):
            raise ValueError("a Question needs one explanation per option and a valid answer index")


class QuizItem:
    """One question as a widget. `choose(i)` and `check()` drive it from Python (that is how the tests
    and nbval see it, since nbval runs no JavaScript)."""

    def __init__(self, question: Question):
        self.question = question
        self.choices = widgets.RadioButtons(options=shown_order(question), value=None, layout={"width": "max-content"})
        self.button = widgets.Button(description="Check", button_style="primary")
        self.feedback = widgets.HTML()
        self.button.on_click(lambda _: self.check())
        self.widget = widgets.VBox(
            [widgets.HTML(f"<b>{question.prompt}</b>"), self.choices, self.button, self.feedback]
        )

    def choose(self, index: int) -> None:
        self.choices.value = self.question.options[index]

    @property
    def correct(self) -> bool | None:
        if self.choices.value is None:
            return None
        return self.question.options.index(self.choices.value) == self.question.answer

    def check(self) -> str:
        if self.choices.value is None:
            self.feedback.value = "Pick an answer first."
        else:
            why = self.question.why[self.question.options.index(self.choices.value)]
            mark = "✓ Right:" if self.correct else "✗ Not quite:"
            self.feedback.value = f"{mark} {why}"
        return self.feedback.value


def shown_order(question: Question) -> list[str]:
    """The options in the order the widget shows them: a fixed shuffle per question, so that where the
    data file happens to list the answer (often second) does not give it away."""
    return sorted(question.options, key=lambda option: hashlib.sha256(f"{question.prompt}\n{option}".encode()).digest())


class Quiz:
    def __init__(self, questions: list[Question]):
        self.items = [QuizItem(q) for q in questions]
        self.widget = widgets.VBox([item.widget for item in self.items])

    def _ipython_display_(self):
        show_widget(
            self.widget,
            f"Quiz: {len(self.items)} question(s). Run this cell to answer them "
            "(a saved widget comes alive only when its cell runs).",
        )


def load_questions(chapter: str, part: str = "quiz") -> list[Question]:
    """The questions of `part` ("quiz" or "predict") in chapter `chapter`'s data file."""
    data = json.loads((QUIZ_DIR / f"{chapter}.json").read_text(encoding="utf-8"))
    return [Question(q["prompt"], tuple(q["options"]), q["answer"], tuple(q["why"])) for q in data[part]]


def chapter_quiz(chapter: str, part: str = "quiz", index: int | None = None) -> Quiz:
    """Chapter `chapter`'s quiz, or with index the one question `part[index]` (a predict-then-run)."""
    questions = load_questions(chapter, part)
    return Quiz(questions if index is None else [questions[index]])
