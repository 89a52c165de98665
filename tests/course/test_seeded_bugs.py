"""Every graded task rejects at least two seeded bugs (nanocourse/bugs/): each bug, written into a copy of the
worked solution, must fail the task it targets. Apart from test_grading.py so that the two sweeps, minutes each,
run on different workers."""

import pytest

from nanocourse.grading import GRADED, chapter_tasks, grade, seeded_bugs
from tests.course.test_grading import MODULES, _importable


@pytest.fixture(scope="module")
def bug_results(tmp_path_factory) -> list:
    """Every chapter's seeded bugs, graded in one process: each variant runs only the task it targets."""
    root = tmp_path_factory.mktemp("bugs")
    for module in MODULES:
        source = (GRADED.parents[1] / "solutions" / f"{module}.py").read_text()
        for k, (task, mistake, old, new) in enumerate(seeded_bugs(module)):
            assert source.count(old) == 1, f"{module}, {mistake}: the text to replace must occur once in the solution"
            folder = root / f"{module[:4]}_bug{k:02d}"
            folder.mkdir()
            (folder / f"{module}.py").write_text(source.replace(old, new))
            (folder / "TASK").write_text(task)
    return grade("all", str(root))


@pytest.mark.parametrize("module", MODULES)
def test_every_task_rejects_two_seeded_bugs(bug_results, module):
    _importable(module)
    bugs = seeded_bugs(module)
    caught = {r.variant for r in bug_results if not r.passed and "not implemented" not in r.message}
    missed = [
        f"{task} {mistake}" for k, (task, mistake, _, _) in enumerate(bugs) if f"{module[:4]}_bug{k:02d}" not in caught
    ]
    assert missed == [], f"seeded bugs that pass their task: {missed}"
    per_task = {task: sum(b[0] == task for b in bugs) for task, _ in chapter_tasks(module[2:4])}
    assert all(n >= 2 for n in per_task.values()), f"every task needs two seeded bugs: {per_task}"
