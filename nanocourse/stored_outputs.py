"""Chapters where Triton cannot be installed (macOS, Windows): cells that need it show their stored outputs.

`enable("03_paged_attention_triton.ipynb")` in a notebook's first cell registers the cell magic
`%%needs_triton`. With Triton installed, a cell that starts with it runs as usual. Without Triton,
it does not run: the outputs saved in the notebook file from a Linux run (text, tables, figures) are
shown again in its place, so the chapter still reads top to bottom and its torch cells still run.

Invariants: a cell is matched to its stored outputs by its exact source, so an edited cell has none
and says so; widget views are dropped (their models would not exist in this kernel) and their text
fallback is shown.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from IPython import get_ipython
from IPython.display import display

from nanoengine.attention import triton_available

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
MAGIC = "needs_triton"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def enable(notebook: str) -> bool:
    """Register %%needs_triton for this notebook's cells; True when Triton is installed."""
    available = triton_available()
    stored = {} if available else _stored_outputs(NOTEBOOKS / notebook)

    def needs_triton(line: str, cell: str) -> None:
        if available:
            get_ipython().run_cell(cell).raise_error()  # a failing cell fails here too, as without the magic
        elif (outputs := stored.get(cell.rstrip("\n"))) is None:
            print(
                "This cell needs Triton and has no stored output (was it edited?). Triton publishes wheels "
                "for Linux only: run the chapter on Linux, WSL or a cloud notebook to execute it."
            )
        else:
            replay(outputs)

    get_ipython().register_magic_function(needs_triton, "cell", MAGIC)
    if not available:
        print(
            "Triton is not installed here (it publishes wheels for Linux only). Cells marked %%needs_triton "
            "show the outputs stored from a Linux run; the torch cells run as usual."
        )
    return available


def _stored_outputs(path: Path) -> dict[str, list[dict]]:
    """{cell body after the magic line: its stored outputs} for every %%needs_triton cell (IPython hands
    a magic the body with a final newline that the file may lack, so both sides drop it)."""
    cells = json.loads(path.read_text())["cells"]
    found = {}
    for cell in cells:
        source = "".join(cell["source"])
        first, _, body = source.partition("\n")
        if cell["cell_type"] == "code" and first.strip() == f"%%{MAGIC}":
            found[body.rstrip("\n")] = cell.get("outputs", [])
    return found


def replay(outputs: list[dict]) -> None:
    for out in outputs:
        kind = out["output_type"]
        if kind == "stream":
            (sys.stderr if out["name"] == "stderr" else sys.stdout).write("".join(out["text"]))
        elif kind in ("display_data", "execute_result"):
            data = {
                mime: "".join(v) if isinstance(v, list) else v for mime, v in out["data"].items() if mime != WIDGET_VIEW
            }
            display(data, raw=True, metadata=out.get("metadata") or None)
