"""Graded suites run against one implementation, chosen by NANOENGINE_IMPL:
"exercises" (the learner's stubs, default), "solutions", "nanoengine" (the engine itself), a folder
holding one chapter module, or a folder of variants.

A graded test module names its chapter module (CHAPTER = "ch04_hash_chains") and, for the
"nanoengine" mode, where each task lives in the engine (NANOENGINE = {"name": object}).

Variants (tests/course/test_grading.py's seeded bugs): each subfolder holds a chapter module and a file TASK
naming the one task it must fail. Every test is parametrized over the variants, and only the named
task's tests run for each, so a whole chapter's bugs cost one process.
"""

import importlib
import importlib.util
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings

# Without CUDA the Triton kernels run in the interpreter, which must be chosen before triton is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

IMPL = os.environ.get("NANOENGINE_IMPL", "exercises")
VARIANTS = (
    {p.name: (p / "TASK").read_text().strip() for p in sorted(Path(IMPL).iterdir()) if (p / "TASK").exists()}
    if os.path.isdir(IMPL)
    else {}
)
# Every graded property test: the same examples on every run and machine (a learner's grade never changes by
# chance), no time limit per example (the Triton interpreter is slow), and one counterexample, the shortest.
settings.register_profile(
    "graded",
    deadline=None,
    database=None,
    derandomize=True,
    report_multiple_bugs=False,
    suppress_health_check=list(HealthCheck),
)
# A seeded bug has only to fail: no shrinking to the shortest example, which a learner reads.
settings.register_profile(
    "seeded-bugs", settings.get_profile("graded"), phases=[Phase.explicit, Phase.reuse, Phase.generate]
)
settings.load_profile("seeded-bugs" if VARIANTS else "graded")


def pytest_configure(config):
    config.addinivalue_line("markers", "task(id, title): a graded task with a stable id")


def pytest_generate_tests(metafunc):
    if VARIANTS and "impl" in metafunc.fixturenames:
        metafunc.parametrize("variant", list(VARIANTS), indirect=True, scope="module")


def pytest_collection_modifyitems(config, items):
    if not VARIANTS:
        return
    keep, drop = [], []
    for item in items:
        marker = item.get_closest_marker("task")
        variant = item.callspec.params.get("variant") if hasattr(item, "callspec") else None
        (keep if marker and VARIANTS.get(variant) == marker.args[0] else drop).append(item)
    config.hook.pytest_deselected(items=drop)
    items[:] = keep


@pytest.fixture(scope="module")
def variant(request):
    return getattr(request, "param", None)


def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def impl(request, variant):
    module = request.module
    if IMPL == "nanoengine":
        return SimpleNamespace(**module.NANOENGINE)
    if variant is not None:
        return _load(os.path.join(IMPL, variant, f"{module.CHAPTER}.py"), f"graded_{variant}.{module.CHAPTER}")
    if os.path.isdir(IMPL):
        return _load(os.path.join(IMPL, f"{module.CHAPTER}.py"), f"graded_variant.{module.CHAPTER}")
    return importlib.import_module(f"{IMPL}.{module.CHAPTER}")


@pytest.fixture(scope="session")
def llm():
    """One engine on the embedded model for the chapters that serve real prompts (08)."""
    from nanoengine import LLM

    return LLM(progress=False)
