"""Where Triton cannot be installed, %%needs_triton cells replay the outputs stored in the notebook."""

import json

import pytest

from nanocourse import cloud, stored_outputs

pytestmark = pytest.mark.triton

NOTEBOOKS = ["03_paged_attention_triton.ipynb", "10_your_engine.ipynb", "11_on_a_gpu.ipynb"]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_every_marked_cell_has_clean_stored_outputs(name):
    path = stored_outputs.NOTEBOOKS / name
    cells = json.loads(path.read_text())["cells"]
    marked = [c for c in cells if c["cell_type"] == "code" and "".join(c["source"]).startswith("%%needs_triton\n")]
    stored = stored_outputs._stored_outputs(path)
    assert marked and len(stored) == len(marked), "two marked cells with the same body would shadow each other"
    for outputs in stored.values():
        assert all(o["output_type"] != "error" for o in outputs), "a stored error would be replayed as the lesson"
    checked = [c for c in marked if "# NBVAL_CHECK_OUTPUT" in "".join(c["source"])]
    assert all(c["outputs"] for c in checked), "a checked cell must have stored outputs to replay"
    # The cloud set-up cell comes first and does nothing here; the chapter's own first code cell follows it.
    first = "".join(next(c for c in cells if c["cell_type"] == "code" and c["id"] != cloud.SETUP_CELL_ID)["source"])
    assert f'stored_outputs.enable("{name}")' in first, "the first code cell registers the magic for this file"


def test_replay_drops_widget_views_and_keeps_text(capsys, monkeypatch):
    shown = []
    monkeypatch.setattr(stored_outputs, "display", lambda data, raw, metadata: shown.append(data))
    stored_outputs.replay(
        [
            {"output_type": "stream", "name": "stdout", "text": ["a table\n", "row\n"]},
            {
                "output_type": "display_data",
                "metadata": {},
                "data": {"text/plain": ["KernelLab(...)"], stored_outputs.WIDGET_VIEW: {"model_id": "x"}},
            },
        ]
    )
    assert capsys.readouterr().out == "a table\nrow\n"
    assert shown == [{"text/plain": "KernelLab(...)"}]
