"""A chapter that asks for a design states its answers only after its graded cell: a learner reading the notebook
top to bottom (or converted to text) meets each of them once the tasks it answers are graded, never before, and
the exercise file never states them. Chapters whose answers sit behind reveal() are test_reveals.py's."""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ANSWERS = {  # chapter -> (exercise module, sentences that answer a graded task)
    "12": (
        "ch12_hybrid",
        ["ceil((W - 1) / block_size)", "depends only on\nthe blocks just before `L`", "cdiv(window_size - 1"],
    ),
    "13": (
        "ch13_spec_decode",
        [
            "num_tokens_with_spec - num_computed_tokens",
            "only while every draft before it was right",
            "num_new_tokens + num_computed_tokens - num_tokens",
            "num_rejected = len(drafts) - (len(new_tokens) - 1)",
        ],
    ),
}


@pytest.mark.parametrize("chapter", sorted(ANSWERS))
def test_answers_come_after_the_graded_cell_and_only_there(chapter):
    module, answers = ANSWERS[chapter]
    notebook = next((ROOT / "notebooks").glob(f"{chapter}_*.ipynb"))
    cells = ["".join(c["source"]) for c in json.loads(notebook.read_text())["cells"]]
    graded = next(i for i, c in enumerate(cells) if f'grade("{chapter}")' in c)
    before, after = "\n".join(cells[:graded]), "\n".join(cells[graded + 1 :])
    early = [a for a in answers if a in before]
    assert not early, f"{notebook.name} states answers before its graded cell: {early}"
    lost = [a for a in answers if a not in after]
    assert not lost, f"{notebook.name} no longer teaches, after its graded cell: {lost}"
    stub = (ROOT / "exercises" / f"{module}.py").read_text()
    assert not [a for a in answers if a in stub], f"exercises/{module}.py states an answer"
