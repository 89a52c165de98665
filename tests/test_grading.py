"""The graded exercises are honest: every task passes on the solutions and on the engine, every task
fails on the untouched stubs, and stubs and solutions have the same signatures."""

import importlib
import inspect

import pytest

from nanoengine.course.grading import GRADED, grade

CHAPTERS = sorted({p.name.split("_")[1][2:] for p in GRADED.glob("test_ch*_*.py")})
MODULES = sorted(p.stem for p in (GRADED.parents[1] / "solutions").glob("ch*.py"))


def test_scorecard_shows_each_task_and_why_it_failed():
    card = grade(CHAPTERS[0], "exercises")
    text = repr(card)
    assert text.startswith(f"Chapter {CHAPTERS[0]} (exercises): 0/{len(card)} tasks pass")
    assert text.count("✗") == len(card) and "not implemented yet" in text


def test_every_chapter_module_has_a_graded_suite():
    assert CHAPTERS and MODULES
    assert sorted(m[2:4] for m in MODULES) == CHAPTERS


@pytest.mark.parametrize("chapter", CHAPTERS)
@pytest.mark.parametrize("impl", ["solutions", "nanoengine"])
def test_every_task_passes(chapter, impl):
    results = grade(chapter, impl)
    assert results, "no graded task ran"
    assert [r.task for r in results if not r.passed] == [], [r.message for r in results if not r.passed]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_task_fails_on_the_stubs(chapter):
    results = grade(chapter, "exercises")
    assert results and [r.task for r in results if r.passed] == []
    ids = [r.task for r in results]
    assert len(ids) == len(set(ids)), "task ids must be unique"


@pytest.mark.parametrize("module", MODULES)
def test_stub_and_solution_signatures_match(module):
    stub, solution = (importlib.import_module(f"{pkg}.{module}") for pkg in ("exercises", "solutions"))
    public = lambda m: {n: o for n, o in vars(m).items()  # noqa: E731
                        if not n.startswith("_") and callable(o) and getattr(o, "__module__", None) == m.__name__}
    assert public(stub).keys() == public(solution).keys()
    for name, obj in public(stub).items():
        assert inspect.signature(obj) == inspect.signature(public(solution)[name]), name
