"""Every notebook, run from JupyterLab's Run menu in headless Chromium, as a learner runs it.

For each notebook: no cell ends in an error, every widget output is a live view (not "Error displaying
widget", "Loading widget…" or its text repr), one interaction per widget changes its view, every figure
is drawn, and the browser console stays free of errors. Each widget is saved as a screenshot.
"""

import os
from pathlib import Path

import pytest
from driver import REPO, NotebookPage, interact, live_view_problem

NOTEBOOKS = sorted(p.name for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_notebook_runs_live_in_jupyterlab(notebook, lab, page, shots):
    with NotebookPage(page, lab, notebook) as nb:
        nb.run_all()
        assert nb.errors() == []
        cells = nb.cells()
        unrun = [i for i, c in enumerate(cells) if c["type"] == "code" and c["count"] is None]
        assert unrun == [], f"cells never ran: {unrun}"

        images = nb.images()
        assert all(drawn for _, drawn in images), f"figures not drawn: {[c for c, d in images if not d]}"

        problems, actions = [], []
        for widget in nb.widgets():
            page.locator(widget.selector).wait_for(state="visible")
            problem = live_view_problem(page, widget)
            if problem:
                problems.append(f"cell {widget.cell} ({widget.label}) {problem}")
                continue
            actions.append(f"cell {widget.cell} {widget.label}: {interact(page, widget)}")
            page.locator(widget.selector).screenshot(
                path=os.path.join(shots, f"{Path(notebook).stem}_cell{widget.cell:02d}_{widget.label}.png")
            )
        assert problems == []
        assert nb.console_errors == [], "browser console errors"
        print("\n".join(actions))


def test_a_widget_whose_front_end_is_missing_fails_the_check(lab, page):
    """The checks themselves: a widget model that no front-end registers is reported, a live button is
    not, and a click that changes nothing fails the interaction check."""
    import nbformat

    cells = [
        nbformat.v4.new_code_cell(
            "import ipywidgets as widgets\n"
            "from traitlets import Unicode\n\n\n"
            "class Unregistered(widgets.DOMWidget):\n"
            "    _model_module = Unicode('no-such-front-end').tag(sync=True)\n"
            "    _model_name = Unicode('NoSuchModel').tag(sync=True)\n"
            "    _view_module = Unicode('no-such-front-end').tag(sync=True)\n"
            "    _view_name = Unicode('NoSuchView').tag(sync=True)\n\n\n"
            "display(Unregistered(), widgets.Button(description='fine'))"
        )
    ]
    (lab.root / "notebooks" / "broken_widget.ipynb").write_text(
        nbformat.writes(
            nbformat.v4.new_notebook(
                cells=cells,
                metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
            )
        )
    )
    with NotebookPage(page, lab, "broken_widget.ipynb") as nb:
        nb.run_all()
        broken, fine = nb.widgets()
        assert "error widget" in live_view_problem(page, broken, timeout_s=5)
        assert live_view_problem(page, fine) is None
        assert nb.console_errors, "a model with no front-end logs an error in the console"
        with pytest.raises(AssertionError, match="did not change"):
            interact(page, fine, timeout_s=3)  # no handler is attached to this button
