"""exercises/ and solutions/ are folders of the checkout, not installed packages: nanocourse finds them from its own
location (nanocourse/checkout.py) and says so clearly when it lies in no checkout."""

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from nanocourse import checkout

ROOT = Path(__file__).resolve().parents[2]


def test_only_the_engine_and_the_course_are_installed_packages():
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert find["include"] == ["nanoengine*", "nanocourse*"]


def test_the_course_finds_the_checkout_it_lies_in():
    assert checkout.checkout_root() == ROOT
    assert checkout.in_checkout()


def test_without_a_checkout_the_error_says_what_is_missing(tmp_path):
    (tmp_path / "solutions").mkdir()
    (tmp_path / "solutions" / "__init__.py").write_text("")
    assert not checkout.in_checkout(tmp_path)
    with pytest.raises(checkout.NoCheckoutError, match=r"has no exercises/\..*clone the repository"):
        checkout.checkout_root(tmp_path)


def test_a_notebook_kernel_imports_the_learner_folders_after_nanocourse():
    """A kernel starts in notebooks/, where nothing installed provides `exercises` or `solutions`: importing
    nanocourse puts the checkout's root on the path."""
    code = (
        "import importlib.util; before = [importlib.util.find_spec(n) for n in ('exercises', 'solutions')]; "
        "import nanocourse, exercises.ch04_hash_chains, solutions.ch05_free_queue; "
        "print(nanocourse.__file__, before == [None, None], exercises.ch04_hash_chains.__file__, "
        "solutions.ch05_free_queue.__file__)"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as a kernel starts: the venv alone
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT / "notebooks",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    course, nothing_before, stub, worked = proc.stdout.split()
    if not Path(course).is_relative_to(ROOT):
        pytest.skip(f"this venv's nanocourse is another checkout's ({course})")
    assert nothing_before == "True", "an installed package provides exercises or solutions"
    assert (stub, worked) == (
        str(ROOT / "exercises" / "ch04_hash_chains.py"),
        str(ROOT / "solutions" / "ch05_free_queue.py"),
    )
