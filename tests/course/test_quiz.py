"""The quiz widget, driven from Python as nbval sees it, and the chapters' quiz data files."""

import json
import re
from pathlib import Path

import pytest

from nanocourse.quiz import QUIZ_DIR, Question, Quiz, chapter_quiz, load_questions, shown_order

Q = Question("2 + 2?", ("3", "4"), 1, ("3 is one short.", "4 it is."))
NOTEBOOKS = sorted((Path(__file__).parents[2] / "notebooks").glob("[0-9][0-9]_*.ipynb"))
CHAPTERS = [nb.name[:2] for nb in NOTEBOOKS]


def test_wrong_answer_explains_and_right_answer_confirms():
    quiz = Quiz([Q])
    item = quiz.items[0]
    assert item.correct is None and "Pick an answer" in item.check()
    item.choose(0)
    assert item.correct is False and item.check() == "✗ Not quite: 3 is one short."
    item.choose(1)
    item.button.click()
    assert item.correct is True and item.feedback.value == "✓ Right: 4 it is."


def test_question_needs_one_explanation_per_option():
    with pytest.raises(ValueError):
        Question("?", ("a", "b"), 0, ("only one",))


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_chapter_has_a_quiz_whose_feedback_does_not_repeat_the_verdict(chapter):
    questions = load_questions(chapter)
    assert len(questions) >= 4
    for q in questions:
        assert len(set(q.options)) == len(q.options), q.prompt
        for why in q.why:
            assert not re.match(r"(Right|Correct|Wrong)\b", why), f"{q.prompt}: the verdict is printed already"
    item = chapter_quiz(chapter).items[0]
    item.choose(item.question.answer)
    assert item.check().startswith("✓ Right:")


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_no_notebook_source_shows_a_quiz_answer(notebook):
    cells = json.loads(notebook.read_text())["cells"]
    sources = "\n".join("".join(c["source"]) for c in cells)
    assert "Question(" not in sources
    assert f'chapter_quiz("{notebook.name[:2]}")' in sources


def test_every_quiz_file_belongs_to_a_chapter():
    assert sorted(p.stem for p in QUIZ_DIR.glob("*.json")) == CHAPTERS


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_every_chapter_asks_a_predict_question_right_before_the_cell_that_answers_it(notebook):
    chapter = notebook.name[:2]
    predict = load_questions(chapter, "predict")
    assert predict, "one predict-then-run question per chapter"
    code = [("".join(c["source"])) for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"]
    for i in range(len(predict)):
        asked = [k for k, source in enumerate(code) if f'chapter_quiz("{chapter}", "predict", {i})' in source]
        assert len(asked) == 1, f"predict question {i} is asked {len(asked)} times"
        assert asked[0] + 1 < len(code) and "chapter_quiz" not in code[asked[0] + 1], "a code cell must follow"


def test_where_the_answer_is_shown_gives_nothing_away():
    """Guessing the same position every time must not pay: the data files list most answers second."""
    positions = [
        shown_order(q).index(q.options[q.answer])
        for chapter in CHAPTERS
        for part in ("quiz", "predict")
        for q in load_questions(chapter, part)
    ]
    counts = [positions.count(k) for k in range(4)]
    assert min(counts) > 0 and max(counts) <= 0.4 * len(positions), counts


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_saved_quiz_widgets_show_the_questions_in_the_data_file(notebook):
    """The widget state stored with a notebook is what a reader sees before running it; after a change to
    a quiz file the notebook must be re-executed, or the stored quiz shows options that no longer exist."""
    state = json.loads(notebook.read_text())["metadata"]["widgets"]["application/vnd.jupyter.widget-state+json"][
        "state"
    ]
    saved = sorted(m["state"]["_options_labels"] for m in state.values() if m["model_name"] == "RadioButtonsModel")
    chapter = notebook.name[:2]
    expected = sorted(shown_order(q) for part in ("quiz", "predict") for q in load_questions(chapter, part))
    assert saved == expected
