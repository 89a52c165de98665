"""How a course widget shows itself: live in a running kernel, readable text in a saved notebook.

A widget view needs its model in the running kernel, so a notebook opened from disk (or reloaded)
cannot draw it until its cell runs again; what it shows meanwhile is the output's text form. That
text names the view, says what it shows and, where the view has a `text()` method, its current state.
"""

from __future__ import annotations

from IPython.display import display

RUN_AGAIN = "(A live widget: run this cell to use it. Until then a saved notebook shows this text.)"


def show_widget(widget, text: str) -> None:
    """Display `widget`, with `text` as the form a saved notebook keeps."""
    bundle = widget._repr_mimebundle_()
    bundle["text/plain"] = text
    display(bundle, raw=True)


def show_view(view) -> None:
    """A course view (an object with a `.widget`): its class, the first paragraph of its docstring, its
    `text()` when it has one, and how to bring it back to life."""
    summary = " ".join((type(view).__doc__ or "").strip().split("\n\n")[0].split())
    lines = [f"{type(view).__name__}: {summary}" if summary else type(view).__name__]
    if callable(getattr(view, "text", None)):
        lines.append(view.text())
    show_widget(view.widget, "\n".join([*lines, RUN_AGAIN]))
