"""A course widget saved in a notebook reads as text until its cell runs again."""

import ipywidgets as widgets

from nanocourse import live


class Gauge:
    """A made-up view:
    one slider.

    More docstring that the saved text leaves out."""

    def __init__(self):
        self.widget = widgets.IntSlider(value=3)

    def text(self) -> str:
        return "level 3 of 10"


def test_a_saved_view_names_itself_shows_its_state_and_says_how_to_revive_it(monkeypatch):
    shown = []
    monkeypatch.setattr(live, "display", lambda bundle, raw: shown.append(bundle))
    live.show_view(Gauge())
    (bundle,) = shown
    assert bundle["text/plain"] == f"Gauge: A made-up view: one slider.\nlevel 3 of 10\n{live.RUN_AGAIN}"
    assert "application/vnd.jupyter.widget-view+json" in bundle, "the live view is still there for JupyterLab"
