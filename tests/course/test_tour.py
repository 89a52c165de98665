"""The course's maps (chapter 00's table and the README's) name every chapter notebook as it is titled, point
to engine files that exist, and say which chapters end with graded exercises as nanocourse/graded/ has them."""

import json
import re
from itertools import groupby
from pathlib import Path

import pytest

from nanocourse.grading import GRADED

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
README = (ROOT / "README.md").read_text()


def _source(notebook: Path) -> str:
    cells = json.loads(notebook.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


TOUR = _source(ROOT / "notebooks" / "00_tour.ipynb")
MAP = re.findall(r"(?m)^\| (\d\d) ([^|]+?) \| [^|]+ \| ([^|]+) \| [^|]+ \|$", TOUR)


def _title(notebook: Path) -> str:
    return re.match(r"# \d\d · (.+)", _source(notebook)).group(1)


def graded_sentence() -> str:
    """'Chapters 00 to 09, 12 and 13 end with graded exercises.', built from the graded suites."""
    chapters = sorted(int(p.name[7:9]) for p in GRADED.glob("test_ch*_*.py"))
    runs = [[ch for _, ch in run] for _, run in groupby(enumerate(chapters), lambda pair: pair[1] - pair[0])]
    # Three chapters or more in a row read as a range; one or two are named.
    parts = [
        item
        for run in runs
        for item in ([f"{run[0]:02d} to {run[-1]:02d}"] if len(run) > 2 else [f"{c:02d}" for c in run])
    ]
    listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"Chapters {listed} end with graded exercises."


@pytest.mark.parametrize("notebook", NOTEBOOKS[1:], ids=lambda p: p.stem)
def test_the_tours_map_names_each_chapter_by_its_title(notebook):
    rows = [title for number, title, _ in MAP if number == notebook.name[:2]]
    assert len(rows) == 1, f"chapter 00's map has {len(rows)} rows for chapter {notebook.name[:2]}, not one"
    assert _title(notebook).lower().startswith(rows[0].lower()), (
        f"chapter 00's map calls chapter {notebook.name[:2]} {rows[0]!r}; its notebook is titled {_title(notebook)!r}"
    )


def test_the_tours_map_points_to_engine_files_that_exist():
    paths = [p for _, _, cell in MAP for p in re.findall(r"`([^`]+)`", cell)]
    assert paths, "the map names no engine file"
    missing = [p for p in paths if not any((ROOT / base / p).exists() for base in ("nanoengine", "."))]
    assert missing == [], f"chapter 00's map names files that do not exist: {missing}"


def test_the_readme_lists_every_chapter_notebook():
    missing = [nb.stem for nb in NOTEBOOKS if f"| `{nb.stem}` |" not in README]
    assert missing == [], f"README's chapter table lacks {missing}"


@pytest.mark.parametrize("text", ["README.md", "00_tour.ipynb"])
def test_the_graded_chapters_are_named_as_the_grader_has_them(text):
    source = README if text == "README.md" else TOUR
    assert graded_sentence() in source, f"{text} should say {graded_sentence()!r}"
