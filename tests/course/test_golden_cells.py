"""The notebooks' golden-output cells: compared on the CPU, where their outputs were recorded; run but not
compared on CUDA (conftest.py at the repository's root)."""

import importlib.util
import json
from collections import defaultdict
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("notebook_rules", ROOT / "conftest.py")
rules = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rules)


class NotebookCell:
    """What the hook reads of nbval's IPyNbCell."""

    def __init__(self, path: Path, cell: dict):
        self.path, self.cell, self.markers = path, cell, []
        self.options = defaultdict(bool, check=True)

    def add_marker(self, marker):
        self.markers.append(marker)


def _cells(tags):
    nb = ROOT / "notebooks" / "00_tour.ipynb"
    return [
        NotebookCell(nb, {"cell_type": "code", "source": "# NBVAL_CHECK_OUTPUT\n", "metadata": {"tags": t}})
        for t in tags
    ]


@pytest.mark.parametrize("cuda, compared", [(False, [True, True]), (True, [False, True])])
def test_golden_cells_are_compared_only_where_they_were_recorded(monkeypatch, cuda, compared):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    items = _cells([[rules.GOLDEN_TAG], []])
    rules.pytest_collection_modifyitems(None, items)
    assert [item.options["check"] for item in items] == compared


def test_every_golden_cell_is_a_checked_one():
    """The tag only narrows where a checked cell is compared; on an unchecked cell it would mean nothing."""
    golden = [
        (nb.name, cell.get("id"))
        for nb in sorted((ROOT / "notebooks").glob("*.ipynb"))
        for cell in json.loads(nb.read_text())["cells"]
        if rules.GOLDEN_TAG in cell.get("metadata", {}).get("tags", ())
    ]
    assert golden, "no cell is tagged: the GPU pass would compare the model's CPU text"
    unchecked = [
        (name, cid)
        for name, cid in golden
        if "NBVAL_CHECK_OUTPUT"
        not in "".join(
            next(c for c in json.loads((ROOT / "notebooks" / name).read_text())["cells"] if c.get("id") == cid)[
                "source"
            ]
        )
    ]
    assert not unchecked, f"tagged {rules.GOLDEN_TAG!r} but not marked # NBVAL_CHECK_OUTPUT: {unchecked}"
