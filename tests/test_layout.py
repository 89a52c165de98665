"""The repository's boundaries: the engine alone in nanoengine/ (laid out as vLLM v1), the course in nanocourse/,
an import graph with no cycle, and every module importable where Triton is not (CI's no-triton pass)."""

import ast
import importlib
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COURSE_ONLY = ("nanocourse", "ipywidgets", "matplotlib", "jupyterlab", "ipykernel", "IPython")
# vLLM 0.33's file for each engine file (vllm/v1/ dropped): a learner who knows one tree finds the other's file.
VLLM_PATHS = {
    "core/block_pool.py": "vllm/v1/core/block_pool.py",
    "core/kv_cache_utils.py": "vllm/v1/core/kv_cache_utils.py",
    "core/kv_cache_manager.py": "vllm/v1/core/kv_cache_manager.py",
    "core/kv_cache_coordinator.py": "vllm/v1/core/kv_cache_coordinator.py",
    "core/single_type_kv_cache_manager.py": "vllm/v1/core/single_type_kv_cache_manager.py",
    "core/sched/scheduler.py": "vllm/v1/core/sched/scheduler.py",
    "core/sched/output.py": "vllm/v1/core/sched/output.py",
    "core/sched/interface.py": "vllm/v1/core/sched/interface.py",
    "core/sched/request_queue.py": "vllm/v1/core/sched/request_queue.py",
    "kv_cache_interface.py": "vllm/v1/kv_cache_interface.py",
    "request.py": "vllm/v1/request.py",
    "worker/model_runner.py": "vllm/v1/worker/gpu_model_runner.py",
    "worker/outputs.py": "vllm/v1/outputs.py",
    "worker/block_table.py": "vllm/v1/worker/block_table.py",
    "sample/sampler.py": "vllm/v1/sample/sampler.py",
    "sample/rejection_sampler.py": "vllm/v1/sample/rejection_sampler.py",
    "spec_decode/ngram_proposer.py": "vllm/v1/spec_decode/ngram_proposer.py",
    "engine/llm_engine.py": "vllm/v1/engine/llm_engine.py",
    "engine/detokenizer.py": "vllm/v1/engine/detokenizer.py",
    "engine/async_llm.py": "vllm/v1/engine/async_llm.py",
    "metrics/stats.py": "vllm/v1/metrics/stats.py",
    "metrics/loggers.py": "vllm/v1/metrics/loggers.py",
    "entrypoints/openai/api_server.py": "vllm/entrypoints/openai/api_server.py",
    "entrypoints/llm.py": "vllm/entrypoints/llm.py",
    "engine/arg_utils.py": "vllm/engine/arg_utils.py",
    "config/model.py": "vllm/config/model.py",
    "config/cache.py": "vllm/config/cache.py",
    "config/scheduler.py": "vllm/config/scheduler.py",
    "config/speculative.py": "vllm/config/speculative.py",
    "config/engine.py": "vllm/config/vllm.py",
    "worker/worker.py": "vllm/v1/worker/gpu_worker.py",
    "sampling_params.py": "vllm/sampling_params.py",
    "outputs.py": "vllm/outputs.py",
    "benchmarks/datasets.py": "vllm/benchmarks/datasets.py",
}
# Words of the course, not of the engine: nanoengine/ describes the engine (nanocourse/ teaches it).
COURSE_WORDS = re.compile(r"chapter|learner|course|notebook", re.IGNORECASE)


def _modules(package: str) -> list[str]:
    root = importlib.import_module(package)
    return [package] + [m.name for m in pkgutil.walk_packages(root.__path__, package + ".")]


def _imports(module: str) -> set[str]:
    """The modules `module` imports, at any depth of its source (lazy imports inside functions count)."""
    spec = importlib.util.find_spec(module)
    tree = ast.parse(Path(spec.origin).read_text())
    package = module if spec.submodule_search_locations else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return found


def test_engine_files_sit_where_vllm_keeps_theirs():
    missing = [ours for ours in VLLM_PATHS if not (ROOT / "nanoengine" / ours).is_file()]
    assert missing == [], f"engine files missing from their vLLM-mirroring place: {missing}"


def test_no_engine_module_imports_the_course_or_its_libraries():
    offenders = {m: sorted(i for i in _imports(m) if i.split(".")[0] in COURSE_ONLY) for m in _modules("nanoengine")}
    assert {m: i for m, i in offenders.items() if i} == {}


def test_importing_the_engine_pulls_in_no_course_library():
    code = (
        "import sys, nanoengine, nanoengine.entrypoints.llm; "
        f"print([m for m in sys.modules if m.split('.')[0] in {COURSE_ONLY!r}])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"`import nanoengine` imported {out.strip()}"


def test_no_engine_file_speaks_of_the_course():
    """Code, comments and strings alike: the engine's docstrings state its contracts, its errors what the
    caller did wrong, neither in chapters, learners, the course or notebooks."""
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted((ROOT / "nanoengine").rglob("*"))
        if path.is_file() and path.suffix in (".py", ".pyi", ".md", ".txt", ".json", ".toml", ".cfg")
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if COURSE_WORDS.search(line)
    ]
    assert offenders == [], "course words in the engine:\n" + "\n".join(offenders)


def test_bench_does_not_import_the_course():
    """bench/ measures the engine: its datasets come from nanoengine.benchmarks, never from nanocourse."""
    offenders = []
    for path in sorted((ROOT / "bench").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            offenders += [
                f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names if n.split(".")[0] == "nanocourse"
            ]
    assert offenders == [], f"bench/ imports the course: {offenders}"


def test_the_engine_import_graph_has_no_cycle():
    modules = set(_modules("nanoengine"))
    graph = {m: {i for i in _imports(m) if i in modules and i != m} for m in modules}
    state: dict[str, int] = {}

    def visit(m, path):
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                pytest.fail(f"import cycle: {' -> '.join(path[path.index(n) :] + [n])}")
            if n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(modules):
        if m not in state:
            visit(m, [m])


@pytest.mark.triton
def test_every_module_imports_where_triton_may_be_missing():
    """Under CI's no-triton pass (tests/no_triton) only the kernel modules may fail, and they must say why."""
    kernels = {"nanoengine.attention.triton_backend", "nanoengine.attention.triton_kernels", "nanocourse.kernel_lab"}
    for module in _modules("nanoengine") + _modules("nanocourse"):
        if module.startswith(("nanocourse.graded", "nanocourse.bugs")):
            continue
        if module in kernels:
            try:
                importlib.import_module(module)
            except ImportError as e:
                assert "triton" in str(e).lower(), f"{module}: {e}"
            continue
        importlib.import_module(module)


def _private_names_defined_in(package: Path) -> set[str]:
    """Every _name the package defines: functions, classes, module globals and attributes set on self or cls."""
    names = set().union(*(_names_defined_in_tree(ast.parse(p.read_text())) for p in package.rglob("*.py")))
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_no_code_outside_the_engine_uses_its_private_names():
    """The course, the benchmarks, the exercises, the solutions and the tests reach the engine through its public
    names: a private one may change without notice. A name the file defines itself is its own."""
    engine = _private_names_defined_in(ROOT / "nanoengine")
    offenders = []
    for folder in ("nanocourse", "bench", "exercises", "solutions", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            own = _names_defined_in_tree(tree)
            for node in ast.walk(tree):
                used = []
                if isinstance(node, ast.Attribute) and node.attr in engine - own:
                    used = [node.attr]
                elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nanoengine"):
                    used = [a.name for a in node.names if a.name in engine]
                offenders += [f"{path.relative_to(ROOT)}:{node.lineno}: {name}" for name in used]
    assert offenders == [], "engine-private names used outside the engine:\n" + "\n".join(offenders)


def _names_defined_in_tree(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            names.add(node.attr)  # set here, not only read: a subclass reading its base's private is caught
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names
