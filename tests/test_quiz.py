"""The quiz widget, driven from Python as nbval sees it."""

import pytest

from nanoengine.course.quiz import Question, Quiz

Q = Question("2 + 2?", ("3", "4"), 1, ("3 is one short.", "4 it is."))


def test_wrong_answer_explains_and_right_answer_confirms():
    quiz = Quiz([Q])
    item = quiz.items[0]
    assert item.correct is None and "Pick an answer" in item.check()
    item.choose(0)
    assert item.correct is False and item.check() == "✗ Not quite. 3 is one short."
    item.choose(1)
    item.button.click()
    assert item.correct is True and item.feedback.value == "✓ Right. 4 it is."


def test_question_needs_one_explanation_per_option():
    with pytest.raises(ValueError):
        Question("?", ("a", "b"), 0, ("only one",))
