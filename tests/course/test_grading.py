"""The graded exercises are honest: every task passes on the solutions and on the engine, every task
fails on the untouched stubs with NotImplementedError, every task rejects at least two seeded bugs
(nanocourse/bugs/), and stubs and solutions have the same public functions, classes and method signatures."""

import ast
import importlib
import inspect
import json
import re

import pytest

from nanocourse.grading import BUGS, GRADED, Scorecard, grade
from nanoengine.attention import triton_available

CHAPTERS = sorted({p.name.split("_")[1][2:] for p in GRADED.glob("test_ch*_*.py")})
MODULES = sorted(p.stem for p in (GRADED.parents[1] / "solutions").glob("ch*.py"))


@pytest.fixture(scope="module")
def cards() -> dict:
    """The whole course graded once per implementation, each in one process (tens of processes would
    cost minutes of interpreter and model start-up)."""
    return {impl: grade("all", impl) for impl in ("solutions", "nanoengine", "exercises")}


def _chapter(card, chapter: str) -> list:
    if chapter in card.skipped:  # chapter 03 where Triton is not installed: the scorecard says why
        pytest.skip(f"chapter {chapter}'s graded suite was skipped: {card.skipped[chapter]}")
    return [r for r in card if r.task.split(".")[0] == chapter]


def _importable(module: str) -> None:
    if module == "ch03_triton" and not triton_available():
        pytest.skip("chapter 03's exercises import triton, which is not installed (Linux-only wheels)")


@pytest.mark.triton
def test_chapter_03_is_graded_where_triton_is_and_skipped_with_its_reason_where_not():
    """CI's no-triton pass runs this instead of the whole course's cards, which take minutes."""
    if triton_available():
        pytest.skip("with Triton, chapter 03 is graded with the whole course (test_every_task_passes)")
    card = grade("03", "solutions")
    assert list(card) == [] and "Triton" in card.skipped["03"], repr(card)
    assert repr(card).startswith("Chapter 03 (solutions): skipped: ")


def test_scorecard_shows_each_task_and_why_it_failed(cards):
    card = cards["exercises"]
    text = repr(card)
    assert text.startswith(f"The course (exercises): 0/{len(card)} tasks pass")
    assert text.count("✗") == len(card) and "not implemented yet" in text
    assert all(f"Chapter {ch}: skipped: " in text for ch in card.skipped)
    assert f"Chapter {CHAPTERS[0]}: 0/{len(_chapter(card, CHAPTERS[0]))} tasks pass" in text


def test_every_chapter_module_has_a_graded_suite_and_seeded_bugs():
    assert CHAPTERS and MODULES
    assert sorted(m[2:4] for m in MODULES) == CHAPTERS
    assert sorted(p.stem for p in BUGS.glob("ch*.py")) == MODULES


@pytest.mark.parametrize("chapter", CHAPTERS)
@pytest.mark.parametrize("impl", ["solutions", "nanoengine"])
def test_every_task_passes(cards, chapter, impl):
    results = _chapter(cards[impl], chapter)
    assert results, "no graded task ran"
    assert [r.task for r in results if not r.passed] == [], [r.message for r in results if not r.passed]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_task_fails_on_the_stubs_with_not_implemented(cards, chapter):
    results = _chapter(cards["exercises"], chapter)
    assert results and [r.task for r in results if r.passed] == []
    assert all("not implemented yet" in r.message for r in results), [r.message for r in results]
    ids = [r.task for r in results]
    assert len(ids) == len(set(ids)), "task ids must be unique"


def _public(module) -> dict:
    return {
        n: o
        for n, o in vars(module).items()
        if not n.startswith("_") and callable(o) and getattr(o, "__module__", None) == module.__name__
    }


def _methods(cls) -> dict:
    """The public methods (and __init__) a class defines itself."""
    return {n: o for n, o in vars(cls).items() if callable(o) and (not n.startswith("_") or n == "__init__")}


@pytest.mark.parametrize("module", MODULES)
def test_stub_and_solution_signatures_match(module):
    _importable(module)
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


def _imported_names(path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.asname or alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            names |= {alias.asname or alias.name for alias in node.names}
    return names


@pytest.mark.parametrize("module", MODULES)
def test_stubs_import_what_their_solutions_need(module):
    """A learner who pastes a worked function body into the stub must not meet a NameError."""
    root = GRADED.parents[1]
    missing = _imported_names(root / "solutions" / f"{module}.py") - _imported_names(
        root / "exercises" / f"{module}.py"
    )
    assert not missing, f"exercises/{module}.py lacks imports its solution uses: {sorted(missing)}"


def test_the_learners_grade_command_exits_0_with_open_tasks_and_strict_mode_does_not():
    from nanocourse.grading import main

    assert main(["00"]) == 0  # the stubs: every task open, a scorecard, no "Error 1" from make
    assert main(["00", "exercises", "--strict"]) == 1
    assert main(["00", "solutions", "--strict"]) == 0


def test_an_exception_from_the_learners_code_names_their_method(tmp_path):
    """A crash inside the learner's code says where: their method, file and line, not the grader's."""
    source = (GRADED.parents[1] / "solutions" / "ch05_free_queue.py").read_text()
    line = "        _link(block.prev_free_block, block.next_free_block)\n"
    assert source.count(line) == 1, "the probe edits one line of the worked solution's remove"
    (tmp_path / "ch05_free_queue.py").write_text(source.replace(line, "        {}[block.block_id]\n"))
    lineno = source[: source.index(line)].count("\n") + 1
    messages = {r.message for r in grade("05", str(tmp_path)) if not r.passed}
    assert (
        f"KeyError: 0, raised in your FreeKVCacheBlockQueue.remove (ch05_free_queue.py, line {lineno})" in messages
    ), messages


def test_no_graded_assert_is_bare():
    """A learner sees the first line of a failure: every assert in a graded suite says which rule broke."""
    bare = [
        f"{path.name}:{node.lineno}"
        for path in sorted(GRADED.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Assert) and node.msg is None
    ]
    assert bare == [], f"graded asserts without a message: {bare}"


def test_a_task_that_never_ends_fails_by_its_time_limit_naming_it(tmp_path, monkeypatch):
    """A loop that never ends fails its task with the task's id and the limit, and the grade goes on."""
    source = (GRADED.parents[1] / "solutions" / "ch07_scheduler.py").read_text()
    line = next(x for x in source.splitlines(keepends=True) if "return self.running.pop()" in x)
    (tmp_path / "ch07_scheduler.py").write_text(source.replace(line, "        while True:\n            pass\n"))
    monkeypatch.setenv("NANOENGINE_TASK_LIMIT", "3")
    results = {r.task: r for r in grade("07", str(tmp_path))}
    assert not results["07.4"].passed, results["07.4"]
    assert results["07.4"].message.startswith("TaskTimeLimit: task 07.4 ran past its time limit of 3 s"), results[
        "07.4"
    ].message
    assert results["07.1"].passed, "the other tasks still ran"


def test_first_stops_at_the_first_failing_task():
    card = grade("00", "exercises", first=True)
    ran = [r for r in card if r.message != "did not run"]
    assert len(ran) == 1 and not ran[0].passed and len(card) > 1, repr(card)


NOTEBOOKS = GRADED.parents[1] / "notebooks"
_GRADE_CELL = re.compile(r'grade\("(\d\d)"\)\s*$')


def _scorecard_cell(chapter: str) -> tuple[dict, str]:
    """The chapter's notebook's grade("NN") cell and the markdown above it (the chapter's task table)."""
    (path,) = NOTEBOOKS.glob(f"{chapter}_*.ipynb")
    cells = json.loads(path.read_text())["cells"]
    i = next(i for i, c in enumerate(cells) if c["cell_type"] == "code" and _GRADE_CELL.search("".join(c["source"])))
    table = "".join("".join(c["source"]) for c in cells[:i] if c["cell_type"] == "markdown")
    return cells[i], table


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_each_notebook_lists_and_shows_the_tasks_its_grader_has(cards, chapter):
    """A task added to a grader shows in the notebook's task table and its stored scorecard (on the stubs), so
    neither says 0/9 where the grader has ten tasks."""
    card = cards["exercises"]
    results = _chapter(card, chapter)
    cell, text = _scorecard_cell(chapter)
    ids = {r.task for r in results}
    table = set(re.findall(rf"^\| ({chapter}\.\w+(?:, {chapter}\.\w+)*) \|", text, flags=re.MULTILINE))
    listed = {one for row in table for one in row.split(", ")}
    assert listed == ids, f"notebook {chapter}'s task table lists {sorted(listed)}; its grader has {sorted(ids)}"
    (stored,) = ["".join(o["data"]["text/plain"]) for o in cell["outputs"] if o["output_type"] == "execute_result"]
    want = repr(Scorecard(chapter, "exercises", results, card.skipped, card.notes))
    assert stored == want, (
        f"notebook {chapter}'s stored scorecard is not what grading the stubs gives now; regenerate it:\n{stored}\n"
        f"---- now:\n{want}"
    )
