"""Graded suites run against one implementation, chosen by NANOENGINE_IMPL:
"exercises" (the learner's stubs, default), "solutions", or "nanoengine" (the engine itself).

A graded test module names its chapter module (CHAPTER = "ch04_hash_chains") and, for the
"nanoengine" mode, where each task lives in the engine (NANOENGINE = {"name": object}).
"""

import importlib
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
    return importlib.import_module(f"{IMPL}.{module.CHAPTER}")
