"""Load vLLM's real v1 core classes from its wheel, byte for byte, beside the project's stand-ins for what they
import, without installing anything.

A meta-path finder serves three kinds of `vllm.*` module while the files load: the real files (REAL_MODULES, read
from the wheel's zip and executed as they are), the stand-ins (nanocourse/graduation/standins.py's STANDINS), and
empty packages above them. Any other `vllm.*` import fails naming the module, so a new dependency is never
papered over. Once loaded, the modules leave sys.modules again (and the finder leaves sys.meta_path): the rest of
the process still finds no `vllm`. VllmModules.active() puts them back for the duration of a run, since a few
functions import lazily.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import linecache
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from nanocourse.graduation import standins
from nanocourse.graduation.wheel import read_sources

# The files issue 45 names: the block pool, the KV cache manager and its coordinator and single-type managers, the
# scheduler and its queues, the KV cache specs and the request.
COMPARED_MODULES = (
    "vllm.v1.core.kv_cache_utils",
    "vllm.v1.core.block_pool",
    "vllm.v1.core.single_type_kv_cache_manager",
    "vllm.v1.core.kv_cache_coordinator",
    "vllm.v1.core.kv_cache_manager",
    "vllm.v1.core.sched.interface",
    "vllm.v1.core.sched.output",
    "vllm.v1.core.sched.request_queue",
    "vllm.v1.core.sched.utils",
    "vllm.v1.core.sched.scheduler",
    "vllm.v1.core.sched.async_scheduler",
    "vllm.v1.kv_cache_interface",
    "vllm.v1.request",
)
# Small files of plain Python that those import, loaded real too (no stand-in to keep in step with them).
SUPPORT_MODULES = (
    "vllm.utils.math_utils",
    "vllm.v1.kv_cache_layout",
    "vllm.v1.kv_cache_spec_registry",
    "vllm.v1.hisparse.block_pool",
    "vllm.v1.core.kv_cache_metrics",
    "vllm.v1.attention.backends.registry",
    "vllm.v1.metrics.cache_hit_source",
    "vllm.v1.metrics.stats",
    "vllm.v1.outputs",
    "vllm.v1.core.encoder_cache_manager",
)
REAL_MODULES = COMPARED_MODULES + SUPPORT_MODULES


class MissingStandIn(ImportError):
    """A loaded vLLM file imports a module that is neither loaded real nor stood in for."""


class _WheelFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, sources: dict[str, tuple[str, bytes]]) -> None:
        self.sources = sources
        self.packages = {name.rsplit(".", i)[0] for name in [*sources, *standins.STANDINS] for i in range(1, 8)}
        self.packages = {p for p in self.packages if p == "vllm" or p.startswith("vllm.")}

    def find_spec(self, fullname, path, target=None):
        if fullname != "vllm" and not fullname.startswith("vllm."):
            return None
        if fullname in self.sources:
            origin = self.sources[fullname][0]
            spec = importlib.machinery.ModuleSpec(fullname, self, origin=f"{WHEEL_PREFIX}{origin}")
            spec.has_location = True
            if origin.endswith("__init__.py"):
                spec.submodule_search_locations = []
            return spec
        if fullname in standins.STANDINS or fullname in self.packages:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=fullname in self.packages)
        raise MissingStandIn(
            f"{fullname} is imported by a vLLM file the graduation run loads, and has no stand-in: add one to "
            "nanocourse/graduation/standins.py's STANDINS (checked against the wheel by tests/course/test_graduation.py)"
        )

    def create_module(self, spec):
        return None

    def exec_module(self, module: ModuleType) -> None:
        name = module.__name__
        if name in self.sources:
            path, source = self.sources[name]
            module.__file__ = f"{WHEEL_PREFIX}{path}"
            # Tracebacks and the run's reports quote vLLM's lines from the wheel's text.
            text = source.decode()
            linecache.cache[module.__file__] = (len(text), None, text.splitlines(True), module.__file__)
            exec(compile(source, module.__file__, "exec"), module.__dict__)  # noqa: S102 - running vLLM's own file is the point
        else:
            module.__dict__.update(standins.STANDINS.get(name, {}))
            if name == "vllm":
                module.envs = importlib.import_module("vllm.envs")


WHEEL_PREFIX = "vllm-0.33.0.whl!/"


def _vllm_names() -> list[str]:
    return [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]


@dataclass
class VllmModules:
    """vLLM's loaded modules by name, the sha256 of every real file loaded, and the finder that serves them."""

    modules: dict[str, ModuleType]
    file_sha256: dict[str, str]
    finder: _WheelFinder

    def __getitem__(self, name: str) -> ModuleType:
        return self.modules[name]

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """While the block runs, `vllm.*` imports find these modules and the finder (vLLM imports some modules
        inside functions); afterwards sys.modules and sys.meta_path are as before, keeping what was imported
        meanwhile for the next time. A process that already has a `vllm` of its own is refused."""
        if _vllm_names():
            raise RuntimeError("a `vllm` is already imported in this process: run the graduation in a fresh one")
        sys.modules.update(self.modules)
        sys.meta_path.insert(0, self.finder)
        try:
            yield
        finally:
            sys.meta_path.remove(self.finder)
            for name in _vllm_names():
                self.modules[name] = sys.modules.pop(name)


def load_vllm(wheel: Path) -> VllmModules:
    """Execute REAL_MODULES from the wheel, with the stand-ins for what they import; return them and their
    sha256. Leaves sys.modules and sys.meta_path as it found them."""
    sources = read_sources(wheel, list(REAL_MODULES))
    vllm = VllmModules(
        {}, {path: hashlib.sha256(source).hexdigest() for path, source in sources.values()}, _WheelFinder(sources)
    )
    with vllm.active():
        for name in REAL_MODULES:
            importlib.import_module(name)
    return vllm
