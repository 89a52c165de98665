"""The checkout the course runs in: its root holds exercises/ (the learner's files) and solutions/ (the worked
ones). They are folders of the checkout, not installed packages (top-level packages named `exercises` and
`solutions` in site-packages would clash with any other of those names), so the course finds them from its own
file: nanocourse/ sits in the checkout's root, and importing nanocourse puts that root first on sys.path. So a
notebook (whose kernel starts in notebooks/), a graded run and `python -m nanocourse.grading` import
`exercises.ch04_hash_chains` from the checkout; pytest finds it through the root's conftest.py as well.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEARNER_FOLDERS = ("exercises", "solutions")


class NoCheckoutError(ImportError):
    """nanocourse was installed from a wheel or a copy, away from the checkout whose folders the course reads."""


def in_checkout(root: Path = ROOT) -> bool:
    return all((root / folder / "__init__.py").is_file() for folder in LEARNER_FOLDERS)


def checkout_root(root: Path = ROOT) -> Path:
    """The checkout's root, or NoCheckoutError saying how to get one."""
    if not in_checkout(root):
        missing = ", ".join(f"{f}/" for f in LEARNER_FOLDERS if not (root / f / "__init__.py").is_file())
        raise NoCheckoutError(
            f"nanocourse ({Path(__file__).parent}) is not inside a checkout of the course: {root} has no {missing}. "
            "The learner's folders exercises/ and solutions/ are not installed with the package; clone the "
            "repository and install it from there (make setup, or pip install -e . in the clone)."
        )
    return root


def use_checkout(root: Path = ROOT) -> Path:
    """Put the checkout's root first on sys.path (once), so `exercises` and `solutions` import from it."""
    root = checkout_root(root)
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
        importlib.invalidate_caches()
    for name in LEARNER_FOLDERS:
        spec = importlib.util.find_spec(name)
        found = Path(spec.origin).parent if spec is not None and spec.origin else None
        if found != root / name:
            raise ImportError(
                f"`import {name}` finds {found}, not the checkout's {root / name}: another package named {name!r} "
                "comes first on sys.path (or was imported before nanocourse)"
            )
    return root
