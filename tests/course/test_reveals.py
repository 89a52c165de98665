"""A chapter's answers (nanocourse.reveals) show only once its graded tasks pass on the learner's file: on the
untouched stubs, or with a task failing, reveal() names the open tasks and how to check them, and none of the
answers; a chapter that reveals keeps its answers out of its notebook."""

import json
from pathlib import Path

import pytest

from nanocourse import my_engine, reveal
from nanocourse.grading import Scorecard, TaskResult, chapter_tasks
from nanocourse.reveals import REVEALS_DIR, NotYet, Reveal, reveal_text

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = sorted(p.stem for p in REVEALS_DIR.glob("*.md"))


def _answer_lines(chapter: str) -> list[str]:
    """The reveal's lines long enough to be an answer rather than a heading or a table rule."""
    return [line.strip() for line in reveal_text(chapter).splitlines() if len(line.strip()) > 60]


def _card(chapter: str, failing: set[str]) -> Scorecard:
    results = [TaskResult(task, title, task not in failing, "") for task, title in chapter_tasks(chapter)]
    return Scorecard(chapter, "exercises", results)


def _shown(obj) -> str:
    return f"{obj}\n{obj._repr_markdown_()}"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_on_the_stubs_reveal_lists_every_task_and_shows_no_answer(chapter):
    shown = reveal(chapter)
    assert isinstance(shown, NotYet) and "still has stubs" in str(shown)
    assert [task for task, _ in shown.open_tasks] == [task for task, _ in chapter_tasks(chapter)]
    assert f"make grade CH={chapter}" in str(shown) and f'reveal("{chapter}")' in shown._repr_markdown_()
    assert not [line for line in _answer_lines(chapter) if line in _shown(shown)]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_the_answers_show_once_every_task_passes_and_not_while_one_fails(monkeypatch, chapter):
    monkeypatch.setattr(my_engine, "stubs_left", lambda module: [])
    last = chapter_tasks(chapter)[-1][0]
    monkeypatch.setattr(my_engine, "chapter_grade", lambda ch: _card(ch, {last}))
    shown = reveal(chapter)
    assert isinstance(shown, NotYet) and [task for task, _ in shown.open_tasks] == [last]
    assert not [line for line in _answer_lines(chapter) if line in _shown(shown)]
    monkeypatch.setattr(my_engine, "chapter_grade", lambda ch: _card(ch, set()))
    shown = reveal(int(chapter))
    assert isinstance(shown, Reveal) and shown._repr_markdown_() == reveal_text(chapter)


def test_reveal_reads_the_scorecard_my_llm_keeps_rather_than_grading_again(monkeypatch, tmp_path):
    """The pass is the one chapter_grade stores per file content (~/.cache/nanoengine/grades): a stored passing
    scorecard for the file as it is opens the reveal with no grading run."""
    monkeypatch.setattr(my_engine, "grades_dir", lambda: tmp_path)
    monkeypatch.setattr(my_engine, "_GRADES", {})
    monkeypatch.setattr(my_engine, "stubs_left", lambda module: [])
    monkeypatch.setattr(my_engine, "grade", lambda *a, **k: pytest.fail("graded again despite a stored scorecard"))
    card = _card("06", set())
    results = [{"task": r.task, "title": r.title, "passed": True, "message": "", "variant": ""} for r in card]
    (tmp_path / f"{my_engine._grade_key('06')}.json").write_text(json.dumps({"results": results, "skipped": {}}))
    assert isinstance(reveal("06"), Reveal)


def test_a_chapter_without_a_reveal_says_which_have_one():
    with pytest.raises(ValueError, match="nothing to reveal.*06"):
        reveal("04")


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_the_notebook_calls_reveal_and_keeps_the_answers_out(chapter):
    notebook = next((ROOT / "notebooks").glob(f"{chapter}_*.ipynb"))
    nb_cells = json.loads(notebook.read_text())["cells"]
    cells = ["".join(c["source"]) for c in nb_cells]
    assert any(c["cell_type"] == "code" and "".join(c["source"]).endswith(f'reveal("{chapter}")') for c in nb_cells)
    text = "\n".join(cells)
    leaked = [line for line in _answer_lines(chapter) if line in text]
    assert not leaked, f"{notebook.name} repeats its reveal's answers: {leaked[:3]}"
