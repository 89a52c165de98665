"""Your engine: the parts you have finished in exercises/, plugged into a real LLM.

    from nanocourse import my_llm
    llm = my_llm()            # prints which parts are yours and which are nanoengine's

Each part enters the engine through its own seam (a Protocol beside the engine's implementation,
listed in LLM's docstring). A part is yours once its chapter's graded tasks all pass; until then
nanoengine's own part serves, so the course runs from the first chapter.

Everything here reads your file as it is on disk now: an edit takes effect at the next call, with no
kernel restart (a plain `import exercises.ch04_hash_chains` would keep the first version it loaded).
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib
import importlib.util
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from nanocourse.grading import GRADED, ROOT, Scorecard, TaskResult, chapter_files, chapter_module, grade
from nanoengine.attention import triton_available

EXERCISES = ROOT / "exercises"


@dataclass(frozen=True, slots=True)
class Part:
    """One mechanism the learner builds: where it lives in exercises/ and which LLM argument takes it."""

    chapter: str
    title: str
    module: str  # exercises/<module>.py
    name: str  # the class or function in that module
    argument: str  # the LLM(...) keyword its seam is
    instantiate: bool = False  # pass an instance (an attention backend) rather than the class
    also: tuple[tuple[str, str], ...] = ()  # more (name, LLM keyword) pairs of the same module that go in with it


PARTS = (
    Part("02", "block table and slot mapping", "ch02_paging", "BlockTable", "block_table_cls"),
    Part("03", "paged-attention kernels", "ch03_triton", "TritonBackend", "attention_backend", instantiate=True),
    Part("04", "block hash", "ch04_hash_chains", "hash_block_tokens", "hash_block_tokens"),
    Part("05", "free-block queue", "ch05_free_queue", "FreeKVCacheBlockQueue", "free_queue_cls"),
    Part("06", "block pool", "ch06_prefix_caching", "BlockPool", "block_pool"),
    # vLLM's split: the KV cache manager is thin over one single-type manager per KV cache group; chapter 06's
    # learner writes both it and the full-attention one, and they go into the engine together.
    Part(
        "06",
        "KV cache manager",
        "ch06_prefix_caching",
        "KVCacheManager",
        "kv_cache_manager_cls",
        also=(("FullAttentionManager", "full_attention_manager_cls"),),
    ),
    Part("07", "scheduler", "ch07_scheduler", "Scheduler", "scheduler_cls"),
    # Chapter 13's Scheduler extends chapter 07's (yours once 07 is finished, nanoengine's until then:
    # nanocourse/builds_on.py), so where it serves it is the whole scheduler, and it takes 07's place.
    Part(
        "13",
        "speculative decoding",
        "ch13_spec_decode",
        "NgramProposer",
        "proposer_cls",
        also=(("rejection_sample", "rejection_sampler"), ("Scheduler", "scheduler_cls")),
    ),
)


# The chapters whose graded code builds on another's: chapter 13's Scheduler extends chapter 07's once chapter 07
# passes its grade, so 13's grade depends on 07's file and grade too, and 07 is graded before it.
BUILDS_ON = {"13": ("07",)}


def exercise_path(module: str, root: Path = EXERCISES) -> Path:
    return root / f"{module}.py"


def load_exercise(module: str, root: Path = EXERCISES) -> ModuleType:
    """exercises/<module>.py as it is on disk now, executed afresh.

    The new module replaces `exercises.<module>` in sys.modules, and the package's attribute, so code that
    imports it later (`import exercises.<module>` as well as `from exercises import <module>`) sees the same version.
    """
    path = exercise_path(module, root)
    name = f"{root.name}.{module}"
    spec = importlib.util.spec_from_file_location(name, path)
    fresh = importlib.util.module_from_spec(spec)
    sys.modules[name] = fresh
    spec.loader.exec_module(fresh)
    # An import finds the module in sys.modules and binds nothing on the package: bind it here, importing the
    # repository's own package (exercises/, solutions/) first so that a later import does not replace it.
    package = sys.modules.get(root.name) or (importlib.import_module(root.name) if root.parent == ROOT else None)
    if package is not None:
        setattr(package, module, fresh)
    return fresh


def mine_or_worked(module: str, probe: Callable[[ModuleType], object]) -> tuple[ModuleType, str]:
    """(module, whose): your exercises/<module>.py as it is now if probe(module) runs without
    NotImplementedError, else the worked solution. For the cells that run your code when it is ready."""
    mine = load_exercise(module)
    try:
        probe(mine)
    except NotImplementedError:
        return importlib.import_module(f"solutions.{module}"), "the worked solution's"
    return mine, "your"


def stubs_left(module: str, root: Path = EXERCISES) -> list[str]:
    """Functions and methods of the file whose body (past the docstring) still only raises
    NotImplementedError. Read from the source, so nothing is run."""
    tree = ast.parse(exercise_path(module, root).read_text())
    left = []

    def visit(node, prefix=""):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and _only_raises(child):
                left.append(prefix + child.name)

    visit(tree)
    return left


def _only_raises(fn: ast.FunctionDef) -> bool:
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    exc = body[0].exc
    exc = exc.func if isinstance(exc, ast.Call) else exc
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"


_GRADES: dict[str, Scorecard] = {}


def grades_dir() -> Path:
    """Where scorecards are kept between kernels: beside the unpacked model, in the user's cache."""
    from nanoengine.model.loader import cache_root

    return cache_root() / "grades"


def _grade_sources(chapter: str) -> list[Path]:
    """Your file, the chapter's graded tests, and those of every chapter it builds on (BUILDS_ON)."""
    module = chapter_module(chapter)
    earlier = [path for other in BUILDS_ON.get(chapter, ()) for path in _grade_sources(other)]
    return [exercise_path(module), *chapter_files(chapter), *earlier]


def _grade_key(chapter: str) -> str:
    """The content a chapter's grade depends on: _grade_sources and the graded tests' conftest."""
    sources = [*_grade_sources(chapter), GRADED / "conftest.py"]
    return hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()


def _cached_grade(chapter: str, key: str) -> Scorecard | None:
    if key in _GRADES:
        return _GRADES[key]
    path = grades_dir() / f"{key}.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    results = [TaskResult(**r) for r in data["results"]]
    card = _GRADES[key] = Scorecard(chapter, "exercises", results, data["skipped"], data.get("notes"))
    return card


# Seconds each chapter's graded suite takes on finished work, measured in one process on a 2-core CPU machine without
# a GPU (chapter 03's kernels then run in Triton's interpreter), and the process's start: what the first my_llm()
# call announces. Chapters not listed take a few seconds.
GRADE_SECONDS = {"02": 6, "03": 18, "04": 2, "05": 6, "06": 4, "07": 6, "12": 5, "13": 6}
GRADE_START_SECONDS = 4


def grading_estimate(chapters) -> int:
    """About how many seconds grading these chapters together takes (GRADE_SECONDS), rounded up to 5."""
    seconds = GRADE_START_SECONDS + sum(GRADE_SECONDS.get(chapter, 5) for chapter in chapters)
    return -(-seconds // 5) * 5


def chapter_grades(chapters) -> dict[str, Scorecard]:
    """Each chapter's scorecard for your files as they are now. Cached on their content, in memory and on disk,
    so asking again after no edit costs nothing, in a new kernel too; the chapters not cached yet are graded
    together, in one process, except that a chapter that builds on another one graded here (BUILDS_ON: 13 on 07)
    waits for a second process, which reads that grade from the cache rather than grading it again."""
    chapters = sorted(set(chapters))
    keys = {chapter: _grade_key(chapter) for chapter in chapters}
    todo = [chapter for chapter in chapters if _cached_grade(chapter, keys[chapter]) is None]
    if todo:
        print(
            f"Grading chapter{'s' if len(todo) > 1 else ''} {', '.join(todo)} on your files as they are now "
            f"(about {grading_estimate(todo)} s on a 2-core CPU, less on a GPU; again only after you edit them)...",
            flush=True,
        )
        later = [chapter for chapter in todo if set(BUILDS_ON.get(chapter, ())) & set(todo)]
        for batch in ([chapter for chapter in todo if chapter not in later], later):
            if batch:
                _grade_and_keep(batch, keys)
    return {chapter: _GRADES[keys[chapter]] for chapter in chapters}


def _grade_and_keep(chapters: list[str], keys: dict[str, str]) -> None:
    card = grade(",".join(chapters), "exercises")
    grades_dir().mkdir(parents=True, exist_ok=True)
    for chapter in chapters:
        results = [r for r in card if r.task.split(".")[0] == chapter]
        skipped = {chapter: card.skipped[chapter]} if chapter in card.skipped else {}
        notes = {chapter: card.notes[chapter]} if chapter in card.notes else {}
        _GRADES[keys[chapter]] = Scorecard(chapter, "exercises", results, skipped, notes)
        data = {"results": [dataclasses.asdict(r) for r in results], "skipped": skipped, "notes": notes}
        (grades_dir() / f"{keys[chapter]}.json").write_text(json.dumps(data))


def chapter_grade(chapter: str) -> Scorecard:
    """The chapter's scorecard for your files as they are now (see chapter_grades)."""
    return chapter_grades([chapter])[chapter]


@dataclass(frozen=True, slots=True)
class PartStatus:
    part: Part
    finished: bool  # its chapter passes
    used: bool  # it serves in the engine being built (a finished kernel part may sit out on a CPU)
    why: str  # what decided it, in words


SOURCES = {"exercises": EXERCISES, "solutions": ROOT / "solutions"}
_CPU_KERNELS = (
    "; on this CPU torch attention serves instead (the Triton interpreter would take "
    "minutes per request): use_kernels=True forces them"
)


def part_status(part: Part, source: str = "exercises", use_kernels: bool = False) -> PartStatus:
    """Finished when no stub is left in the chapter's file and every graded task of the chapter
    passes; a file with stubs left is not graded at all (the answer is already no), which keeps
    my_llm() instant on an untouched course. The worked solutions count as finished: CI grades them."""
    if part.instantiate and not triton_available():
        return PartStatus(
            part, False, False, "Triton is not installed (it publishes wheels for Linux only): torch attention serves"
        )
    if source == "solutions":
        finished, why = True, "the worked solution"
    elif left := stubs_left(part.module):
        own = [part.name, *(name for name, _ in part.also)]
        # This part's own stubs first, its main class's before the classes that go in with it.
        left.sort(key=lambda stub: next((i for i, name in enumerate(own) if stub.startswith(f"{name}.")), len(own)))
        return PartStatus(part, False, False, f"stubs left: {', '.join(left[:3])}{' …' if len(left) > 3 else ''}")
    else:
        card = chapter_grade(part.chapter)
        passed = sum(r.passed for r in card)
        finished = passed == len(card)
        why = (
            f"all {passed} graded tasks pass"
            if finished
            else f"{passed} of {len(card)} graded tasks pass (make grade CH={part.chapter})"
        )
    if finished and part.instantiate and not use_kernels:
        return PartStatus(part, True, False, why + _CPU_KERNELS)
    return PartStatus(part, finished, finished, why)


def my_parts(statuses: list[PartStatus], source: str = "exercises") -> dict[str, Any]:
    """The LLM keyword arguments that plug in every part the statuses say to use."""
    loaded: dict[str, ModuleType] = {}
    kwargs: dict[str, Any] = {}
    for status in statuses:
        if status.used:
            part = status.part
            if part.instantiate:
                # Kernels need Triton's interpreter on a CPU, chosen before triton is first imported.
                importlib.import_module("nanoengine.attention.triton_backend")
            if part.module not in loaded:
                loaded[part.module] = load_exercise(part.module, SOURCES[source])
            obj = getattr(loaded[part.module], part.name)
            kwargs[part.argument] = obj() if part.instantiate else obj
            # A later part at the same seam replaces an earlier one: chapter 13's Scheduler already extends
            # chapter 07's where 07 is finished (nanocourse/builds_on.py).
            kwargs.update((argument, getattr(loaded[part.module], name)) for name, argument in part.also)
    return kwargs


def parts_table(statuses: list[PartStatus], source: str = "exercises") -> str:
    """One row per part: whose it is and why; under chapter 13's row, the scheduler it extends (07's row says why
    chapter 07 is or is not finished)."""
    from nanocourse.builds_on import extends_line

    owner = "yours" if source == "exercises" else "worked"
    used = sum(s.used for s in statuses)
    title = "Your engine" if source == "exercises" else "The worked solutions' engine"
    lines = [f"{title}: {used} of {len(statuses)} parts are {owner}, the rest nanoengine's"]
    chapter_07 = next((s for s in statuses if s.part.chapter == "07"), None)
    for s in statuses:
        who = owner if s.used else "nanoengine's"
        lines.append(f"  {s.part.chapter}  {s.part.title:30} {who:13} {s.why}")
        if s.part.chapter == "13" and chapter_07 is not None:
            lines.append(f"{'':51}{extends_line(source, chapter_07.finished)}")
    return "\n".join(lines)


def my_llm(model=None, *, source: str = "exercises", use_kernels: bool | None = None, quiet: bool = False, **kwargs):
    """An LLM built from every part you have finished; nanoengine supplies the rest.

    source="solutions" builds the same engine from the worked solutions. Your Triton kernels serve
    only on a GPU unless use_kernels=True: on a CPU the interpreter runs them thousands of times
    slower than torch. Prints which parts are whose (quiet=True does not). Any LLM argument can be
    given too, and an explicit one wins over a part.
    """
    import torch

    from nanoengine.entrypoints.llm import LLM
    from nanoengine.errors import InvalidEngineArgumentError

    if source not in SOURCES:
        raise ValueError(f"source must be one of {sorted(SOURCES)}, got {source!r}")
    if use_kernels is None:
        use_kernels = torch.cuda.is_available()
    if source == "exercises":  # every finished file's chapter graded at once, in one process, before the table
        chapter_grades(
            p.chapter for p in PARTS if not stubs_left(p.module) and not (p.instantiate and not triton_available())
        )
    statuses = [part_status(p, source, use_kernels) for p in PARTS]
    if not quiet:
        print(parts_table(statuses, source))
    kwargs.setdefault("progress", False)
    parts = my_parts(statuses, source)
    try:
        return LLM(model, **{**parts, **kwargs})
    except InvalidEngineArgumentError as exc:
        if exc.parameter in parts and exc.parameter not in kwargs:
            exc.add_note(f"my_llm() plugged in this part; give my_llm(..., {exc.parameter}=None) to take the engine's.")
        raise


def seam_owners(llm) -> list[tuple[str, str, str]]:
    """(chapter, seam, who serves it) for each mechanism of an LLM, read off the engine's public
    attributes: the module and name of the class (or, for the hash, the function) at each seam."""
    from nanoengine.core import hash_block_tokens

    engine, kv = llm.engine, llm.engine.kv_cache_manager
    seams = [
        ("02", "BlockTableInterface", type(engine.runner.input_block_table[0])),
        ("03", "AttentionBackend", type(llm.backend)),
        ("04", "BlockTokensHasher", engine.hash_block_tokens or hash_block_tokens),
        ("05", "FreeBlockQueue", type(kv.block_pool.free_block_queue)),
        ("06", "BlockPoolInterface", type(kv.block_pool)),
        ("06", "KVCacheManagerInterface", type(kv)),
        ("07", "SchedulerInterface", type(engine.scheduler)),
        ("13", "rejection_sampler", engine.runner.rejection_sampler),
    ]
    if engine.proposer is not None:
        seams.append(("13", "NgramProposer", type(engine.proposer)))
    return [
        (chapter, seam, " on ".join(f"{o.__module__}.{o.__qualname__}" for o in _course_chain(obj)))
        for chapter, seam, obj in seams
    ]


def _course_chain(obj: Any) -> list[Any]:
    """obj, and for a course class the course classes it extends from the same folder, subclass first: chapter 13's
    Scheduler, then chapter 07's where it extends it."""
    top = obj.__module__.split(".")[0]
    if not isinstance(obj, type) or top == "nanoengine":
        return [obj]
    return [cls for cls in obj.__mro__ if cls.__module__.split(".")[0] == top]


__all__ = [
    "GRADED",
    "PARTS",
    "Part",
    "PartStatus",
    "chapter_grade",
    "chapter_grades",
    "grades_dir",
    "load_exercise",
    "mine_or_worked",
    "my_llm",
    "my_parts",
    "part_status",
    "parts_table",
    "seam_owners",
    "stubs_left",
]
