"""Graded suites run against one implementation, chosen by NANOENGINE_IMPL:
"exercises" (the learner's stubs, default), "solutions", "nanoengine" (the engine itself), or a
folder of chapter modules (tests/test_grading.py grades seeded-bug variants of the solutions that way).

A graded test module names its chapter module (CHAPTER = "ch04_hash_chains") and, for the
"nanoengine" mode, where each task lives in the engine (NANOENGINE = {"name": object}).
"""

import importlib
import importlib.util
import os
from types import SimpleNamespace

import pytest

IMPL = os.environ.get("NANOENGINE_IMPL", "exercises")


def pytest_configure(config):
    config.addinivalue_line("markers", "task(id, title): a graded task with a stable id")


@pytest.fixture(scope="module")
def impl(request):
    module = request.module
    if IMPL == "nanoengine":
        return SimpleNamespace(**module.NANOENGINE)
    if os.path.isdir(IMPL):
        path = os.path.join(IMPL, f"{module.CHAPTER}.py")
        spec = importlib.util.spec_from_file_location(f"graded_variant.{module.CHAPTER}", path)
        variant = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(variant)
        return variant
    return importlib.import_module(f"{IMPL}.{module.CHAPTER}")
