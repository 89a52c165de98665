"""Every chapter ends with a "nanoengine → vLLM 0.33" box: a table of the names and shapes that differ (rows that
answer a graded task's question wait in the chapter's reveal). Each row's
claims are pinned to lines of both code bases (tests/course/vllm_box_refs.py): the nanoengine side is checked on
every run, so a change to the engine that a box describes fails here until the box is re-read; the vLLM side is
checked where an unpacked vLLM 0.33 is at hand (VLLM_SRC=/path holding vllm/, e.g. from
`pip download vllm==0.33.0 --no-deps` and unzip)."""

import json
import os
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
ROWS = runpy.run_path(str(Path(__file__).with_name("vllm_box_refs.py")))["ROWS"]
HEADER = "| in nanoengine | in vLLM 0.33 | why they differ |"
VLLM_SRC = os.environ.get("VLLM_SRC")


def box(notebook: Path) -> str:
    cells = ["".join(c["source"]) for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "markdown"]
    boxes = [c for c in cells if c.startswith("### nanoengine → vLLM 0.33")]
    assert len(boxes) == 1, f"{notebook.name} must have one 'nanoengine → vLLM 0.33' box, has {len(boxes)}"
    return boxes[0]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_every_chapter_has_a_box_whose_rows_are_pinned(notebook):
    text = box(notebook)
    assert HEADER in text, f"{notebook.name}: the box's table starts with {HEADER}"
    # A long box may split its table under sub-headings: every table repeats the header, which is not a row.
    rows = [line for line in text.split(HEADER, 1)[1].splitlines() if line.startswith("| ") and line != HEADER]
    # Rows that answer a graded task's question wait in the chapter's reveal (nanocourse/reveals/NN.md).
    reveal = ROOT / "nanocourse" / "reveals" / f"{notebook.name[:2]}.md"
    if reveal.exists() and HEADER in reveal.read_text():
        tail = reveal.read_text().split(HEADER, 1)[1]
        rows += [line for line in tail.splitlines() if line.startswith("| ") and line != HEADER]
    pinned = [title for chapter, title, *_ in ROWS if chapter == notebook.name[:2]]
    assert len(rows) >= 3 and len(rows) == len(pinned), (
        f"{notebook.name}: {len(rows)} table rows, {len(pinned)} pinned in vllm_box_refs.py ({pinned}): every row "
        f"names the lines of both code bases it describes"
    )


def _line(root: Path, path: str, text: str, nth: int = 1) -> int | None:
    """The line where the nth occurrence of text starts (text may span lines), or None."""
    source, start = (root / path).read_text(), -1
    for _ in range(nth):
        start = source.find(text, start + 1)
        if start < 0:
            return None
    return source.count("\n", 0, start) + 1


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r[0]}-{r[1]}")
def test_the_nanoengine_side_of_each_row_still_holds(row):
    chapter, title, _, refs = row
    missing = [ref for ref in refs if _line(ROOT, *ref) is None]
    assert not missing, (
        f"chapter {chapter}'s box, row {title!r}: these lines are gone from nanoengine {missing}; "
        f"re-read the row against the code and update it and vllm_box_refs.py"
    )


@pytest.mark.skipif(
    not VLLM_SRC,
    reason="set VLLM_SRC to an unpacked vLLM 0.33 (a folder holding vllm/) to check the vLLM side of the boxes",
)
def test_the_vllm_side_of_every_row_holds_in_vllm_0_33():
    missing = [
        (chapter, title, ref)
        for chapter, title, refs, _ in ROWS
        for ref in refs
        if _line(Path(VLLM_SRC), ref[0].removeprefix("vllm/"), *ref[1:]) is None
    ]
    assert not missing, f"rows whose vLLM lines are not in vLLM 0.33 at {VLLM_SRC}: {missing}"
