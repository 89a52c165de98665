"""The graded exercises are honest: every task passes on the solutions and on the engine, every task
fails on the untouched stubs with NotImplementedError, every task rejects at least two seeded bugs
(tests/bugs/), and stubs and solutions have the same public functions, classes and method signatures."""

import importlib
import inspect
import runpy

import pytest

from nanoengine.course.grading import GRADED, grade

CHAPTERS = sorted({p.name.split("_")[1][2:] for p in GRADED.glob("test_ch*_*.py")})
MODULES = sorted(p.stem for p in (GRADED.parents[1] / "solutions").glob("ch*.py"))
BUGS = GRADED.parent / "bugs"


def test_scorecard_shows_each_task_and_why_it_failed():
    card = grade(CHAPTERS[0], "exercises")
    text = repr(card)
    assert text.startswith(f"Chapter {CHAPTERS[0]} (exercises): 0/{len(card)} tasks pass")
    assert text.count("✗") == len(card) and "not implemented yet" in text


def test_every_chapter_module_has_a_graded_suite_and_seeded_bugs():
    assert CHAPTERS and MODULES
    assert sorted(m[2:4] for m in MODULES) == CHAPTERS
    assert sorted(p.stem for p in BUGS.glob("ch*.py")) == MODULES


@pytest.mark.parametrize("chapter", CHAPTERS)
@pytest.mark.parametrize("impl", ["solutions", "nanoengine"])
def test_every_task_passes(chapter, impl):
    results = grade(chapter, impl)
    assert results, "no graded task ran"
    assert [r.task for r in results if not r.passed] == [], [r.message for r in results if not r.passed]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_task_fails_on_the_stubs_with_not_implemented(chapter):
    results = grade(chapter, "exercises")
    assert results and [r.task for r in results if r.passed] == []
    assert all("not implemented yet" in r.message for r in results), [r.message for r in results]
    ids = [r.task for r in results]
    assert len(ids) == len(set(ids)), "task ids must be unique"


@pytest.mark.parametrize("module", MODULES)
def test_every_task_rejects_two_seeded_bugs(module, tmp_path):
    chapter = module[2:4]
    source = (GRADED.parents[1] / "solutions" / f"{module}.py").read_text()
    bugs = runpy.run_path(str(BUGS / f"{module}.py"))["BUGS"]
    for k, (task, mistake, old, new) in enumerate(bugs):
        assert source.count(old) == 1, f"{mistake}: the text to replace must occur once in the solution"
        folder = tmp_path / f"bug{k:02d}"
        folder.mkdir()
        (folder / f"{module}.py").write_text(source.replace(old, new))
        (folder / "TASK").write_text(task)
    results = grade(chapter, str(tmp_path))
    caught = {r.variant for r in results if not r.passed and "not implemented" not in r.message}
    missed = [f"{task} {mistake}" for k, (task, mistake, _, _) in enumerate(bugs) if f"bug{k:02d}" not in caught]
    assert missed == [], f"seeded bugs that pass their task: {missed}"
    tasks = {r.task for r in grade(chapter, "solutions")}
    per_task = {t: sum(b[0] == t for b in bugs) for t in tasks}
    assert all(n >= 2 for n in per_task.values()), f"every task needs two seeded bugs: {per_task}"


def _public(module) -> dict:
    return {n: o for n, o in vars(module).items()
            if not n.startswith("_") and callable(o) and getattr(o, "__module__", None) == module.__name__}


def _methods(cls) -> dict:
    """The public methods (and __init__) a class defines itself."""
    return {n: o for n, o in vars(cls).items() if callable(o) and (not n.startswith("_") or n == "__init__")}


@pytest.mark.parametrize("module", MODULES)
def test_stub_and_solution_signatures_match(module):
    stub, solution = (importlib.import_module(f"{pkg}.{module}") for pkg in ("exercises", "solutions"))
    assert _public(stub).keys() == _public(solution).keys()
    for name, obj in _public(stub).items():
        other = _public(solution)[name]
        if inspect.isclass(obj):
            assert _methods(obj).keys() == _methods(other).keys(), name
            for method, fn in _methods(obj).items():
                assert inspect.signature(fn) == inspect.signature(_methods(other)[method]), f"{name}.{method}"
        else:
            assert inspect.signature(obj) == inspect.signature(other), name
