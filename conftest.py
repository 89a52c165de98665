"""How pytest runs in this repository, wherever it collects: `make test`, `make test-no-triton`, or
bench/notebooks_cuda.py on a GPU, which collects notebooks/ alone. Mainly how it checks the chapter
notebooks under nbval."""

import functools
import json
import os
from pathlib import Path

import pytest
import torch

# Under pytest-xdist each worker has a core of its own; more threads would only contend, and OpenMP threads that
# spin-wait for a core the other worker holds run many times slower (chapter 13's
# live speed-up cell took 234 s instead of 41 s; make test 640 s instead of 444 s).
# What the tests start (notebook kernels, the CLI, graded runs) inherits the limit through the environment,
# whatever the shell had set.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
else:
    torch.set_num_threads(max(1, os.cpu_count() or 1))

# A cell tagged so prints what the embedded model computes on the CPU in fp32 (its text, logprobs, byte
# sizes, which parts run): the notebook's engines run there by default where there is no CUDA. On a GPU
# they run bf16 (fp16 before Ampere) and may pick other tokens, so the cell runs but is not compared, as
# the golden-text tests skip there (tests/conftest.py).
GOLDEN_TAG = "golden-output"


@functools.cache
def _has_triton_cells(notebook: Path) -> bool:
    return "%%needs_triton" in notebook.read_text()


def _is_golden(item) -> bool:
    cell = getattr(item, "cell", None)
    return cell is not None and GOLDEN_TAG in cell.get("metadata", {}).get("tags", ())


@pytest.hookimpl(tryfirst=True)  # before `-m triton` selects: the notebooks' cells carry no marker of their own
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.suffix != ".ipynb":
            continue
        # A notebook with %%needs_triton cells replays their stored outputs where Triton is missing.
        if _has_triton_cells(item.path):
            item.add_marker(pytest.mark.triton)
        if torch.cuda.is_available() and _is_golden(item):
            item.options["check"] = False


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Name the cells that ran uncompared (under xdist the workers collect, so read the notebooks here)."""
    if not torch.cuda.is_available():
        return
    paths = [Path(a.split("::")[0]) for a in config.args]
    notebooks = sorted({nb for p in paths for nb in ([p] if p.suffix == ".ipynb" else p.glob("**/*.ipynb"))})
    names = [
        f"{nb.stem} cell {i}"
        for nb in notebooks
        for i, cell in enumerate(json.loads(nb.read_text())["cells"])
        if GOLDEN_TAG in cell.get("metadata", {}).get("tags", ())
    ]
    if names:
        terminalreporter.write_line(
            f"{len(names)} cells tagged {GOLDEN_TAG!r} ran without comparing their output "
            f"(recorded with the embedded model on the CPU in fp32): {', '.join(names)}"
        )
