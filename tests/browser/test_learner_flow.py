"""A learner's edit to exercises/ reaches the notebook's next run, with no kernel restart.

Both flows start from the committed stubs in the server's copy of the checkout, run the cells the
exercise needs from the Run menu, write a worked solution into exercises/ as a learner would type it,
re-run cells and check that the same kernel now runs the learner's code. (test_notebooks.py runs every
cell of both chapters.)
"""

import ast
import re
import subprocess

import pytest
from driver import REPO, NotebookPage

from nanocourse import cloud
from nanocourse.my_engine import PARTS


def committed_stub(module: str) -> str:
    return subprocess.run(
        ["git", "show", f"HEAD:exercises/{module}.py"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout


def with_function_solved(stub: str, solution: str, name: str) -> str:
    """The stub file with one function's body replaced by the worked solution's."""

    def span(source):
        node = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name)
        return node.lineno - 1, node.end_lineno

    stub_lines, sol_lines = stub.splitlines(keepends=True), solution.splitlines(keepends=True)
    (a, b), (c, d) = span(stub), span(solution)
    return "".join(stub_lines[:a] + sol_lines[c:d] + stub_lines[b:])


def first_chapter_cell(nb: NotebookPage) -> int:
    """The chapter's own first code cell, its imports and model: the cloud set-up cell before it does nothing here."""
    return next(i for i, c in enumerate(nb.cells()) if c["type"] == "code" and c["source"] != cloud.setup_source())


def cell_index(nb: NotebookPage, pattern: str) -> int:
    matches = [i for i, c in enumerate(nb.cells()) if re.search(pattern, c["source"])]
    assert len(matches) == 1, f"{pattern!r} matches cells {matches}"
    return matches[0]


@pytest.fixture
def exercise(lab):
    """exercises/ch04_hash_chains.py in the server's copy, reset to the committed stub and restored after."""
    path = lab.root / "exercises" / "ch04_hash_chains.py"
    kept = path.read_text()
    path.write_text(committed_stub("ch04_hash_chains"))
    yield path
    path.write_text(kept)


def test_chapter_04_grades_and_runs_the_learners_hash_after_an_edit(lab, page, exercise):
    with NotebookPage(page, lab, "04_hash_chains.ipynb") as nb:
        prompts = cell_index(nb, r"(?m)^q1 = ")  # the two prompts the learner's hash serves
        grade, mine = cell_index(nb, r'grade\("04"\)'), cell_index(nb, r"mine_or_worked\(")
        for cell in (first_chapter_cell(nb), prompts, grade, mine):
            nb.run_cell(cell)
        assert nb.errors() == []
        assert "✗ 04.1" in nb.output_text(grade)
        assert "with the worked solution's hash" in nb.output_text(mine)

        solution = (REPO / "solutions" / "ch04_hash_chains.py").read_text()
        exercise.write_text(with_function_solved(exercise.read_text(), solution, "hash_block_tokens"))
        nb.run_cell(grade)
        card = nb.output_text(grade)
        assert "✓ 04.1 " in card and "✗ 04.2 " in card, card
        nb.run_cell(mine)
        assert "with your hash: second request reused 64 cached tokens" in nb.output_text(mine)
        assert (
            page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.id")
            == nb.kernel_id
        ), "the kernel was restarted"
        assert nb.errors() == []


def test_capstone_takes_a_finished_chapter_as_the_learners_part(lab, page, exercise):
    with NotebookPage(page, lab, "10_your_engine.ipynb") as nb:
        setup, yours = first_chapter_cell(nb), cell_index(nb, r"^yours = my_llm\(")
        nb.run_cell(setup)
        nb.run_cell(yours)
        assert f"Your engine: 0 of {len(PARTS)} parts are yours" in nb.output_text(yours)

        exercise.write_text((REPO / "solutions" / "ch04_hash_chains.py").read_text())
        nb.run_cell(yours, timeout_s=300)
        table = nb.output_text(yours)
        assert f"Your engine: 1 of {len(PARTS)} parts are yours" in table, table
        assert re.search(r"04  block hash +yours", table), table
        assert nb.errors() == []
