"""A chapter that asks for a design keeps the sentences that answer its graded tasks in its reveal
(nanocourse/reveals/<chapter>.md, shown by reveal() only once the chapter passes): a learner reading the notebook
top to bottom (or converted to text), or the exercise file, never meets them, graded cell or not."""

import json
from pathlib import Path

import pytest

from nanocourse.reveals import reveal_text

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
            "Rolling back by the number of drafts rather than the rejected ones",
            "num_new_tokens + num_computed_tokens - num_tokens",
            "num_rejected = len(drafts) - (len(new_tokens) - 1)",
            "num_rejected = num_draft_tokens - num_accepted",
            "`u < p(d)`",
        ],
    ),
}


@pytest.mark.parametrize("chapter", sorted(ANSWERS))
def test_answers_live_in_the_reveal_only(chapter):
    module, answers = ANSWERS[chapter]
    notebook = next((ROOT / "notebooks").glob(f"{chapter}_*.ipynb"))
    text = "\n".join("".join(c["source"]) for c in json.loads(notebook.read_text())["cells"])
    shown = [a for a in answers if a in text]
    assert not shown, f"{notebook.name} states answers a learner meets before the chapter passes: {shown}"
    stub = (ROOT / "exercises" / f"{module}.py").read_text()
    assert not [a for a in answers if a in stub], f"exercises/{module}.py states an answer"
    lost = [a for a in answers if a not in reveal_text(chapter)]
    assert not lost, f"reveal('{chapter}') no longer teaches: {lost}"
