"""No notebook imports the worked solutions: until a learner's part is written, a cell that needs one runs the
engine's own (a learner is one `??` away from any module a notebook imports)."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
IMPORTS_SOLUTIONS = re.compile(r"^\s*(from\s+solutions\b|import\s+solutions\b)", re.MULTILINE)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_notebook_imports_the_worked_solutions(path):
    cells = json.loads(path.read_text())["cells"]
    found = [
        i for i, c in enumerate(cells) if c["cell_type"] == "code" and IMPORTS_SOLUTIONS.search("".join(c["source"]))
    ]
    assert found == [], f"{path.name}: code cells {found} import solutions/; run the engine's own part instead"


def test_the_check_sees_an_import():
    assert IMPORTS_SOLUTIONS.search("x = 1\nfrom solutions import ch06_prefix_caching as worked\n")
    assert IMPORTS_SOLUTIONS.search("import solutions.ch03_triton\n")
    assert not IMPORTS_SOLUTIONS.search("# the worked solutions live in solutions/\n")
