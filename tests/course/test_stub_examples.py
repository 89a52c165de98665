"""Every stub's `Example:` lines hold for its worked solution.

A task's docstring in exercises/*.py states its contract, then an example. The examples are prose around Python:
`f(...) == value` comparisons, often several separated by `;`, and some set-up (`t = BlockTable(4); t.add_row(...)`).
This test pulls out every piece that parses as Python, runs the set-up and evaluates each comparison in the worked
solution's namespace, and names the chapter, the task and the example that fails. A piece that needs names the text
defines only in words (`with a = ...`, "the pool above") is skipped, not failed.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from nanoengine.attention import triton_available

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted(p.stem for p in (ROOT / "exercises").glob("ch*.py"))
# Prose such as "[1, 2] (n = 3)" is tried as code too; Python warns about it before it fails or is skipped.
pytestmark = pytest.mark.filterwarnings("ignore::SyntaxWarning")
TASK = re.compile(r"Tasks? (\d\d\.\d+[a-z]?)")


def _examples(module: str) -> list[tuple[str, str]]:
    """(task, example text) for every `Example:` paragraph of the stub's docstrings."""
    tree = ast.parse((ROOT / "exercises" / f"{module}.py").read_text())
    found = []

    def visit(node, outer_task: str) -> None:
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(child) or ""
            task = (m.group(1) if (m := TASK.search(doc)) else outer_task) or "?"
            for match in re.finditer(r"Example:(.*?)(?:\n\s*\n|\Z)", doc, re.DOTALL):
                text = " ".join(line.strip() for line in match.group(1).splitlines())
                found.append((f"{task} ({child.name})", text))
            visit(child, task)

    visit(tree, "")
    return found


def _longest_code(fragment: str, mode: str) -> str | None:
    """The longest piece of `fragment`, from a word's start to any later point, that parses in `mode` ("eval":
    a comparison with == or !=; "exec": assignments and calls); None if none does."""
    starts = [m.start() for m in re.finditer(r"(?<![\w.])[A-Za-z_\[\(\{]", fragment)]
    for length in range(len(fragment), 0, -1):
        for start in starts:
            end = start + length
            if end > len(fragment):
                continue
            piece = fragment[start:end].strip().rstrip(".,:")
            if not piece or (end < len(fragment) and fragment[end - 1 : end + 1].isalnum()):
                continue
            try:
                tree = ast.parse(piece, mode=mode)
            except SyntaxError:
                continue
            body = tree.body
            if (
                mode == "eval"
                and isinstance(body, ast.Compare)
                and all(isinstance(op, ast.Eq | ast.NotEq) for op in body.ops)
            ):
                return piece
            if any(isinstance(n, ast.Compare) for n in ast.walk(tree)) and mode == "exec":
                continue  # "h = f(...) is 16 bytes": prose read as code
            statements = mode == "exec" and body and all(isinstance(s, ast.Assign | ast.Expr) for s in body)
            if statements and all(isinstance(s.value, ast.Call) for s in body if isinstance(s, ast.Expr)):
                return piece
    return None


def _checks(module: str) -> list[str]:
    """The failing examples of one chapter, each with its chapter, task and text."""
    solution = importlib.import_module(f"solutions.{module}")
    failures = []
    for task, text in _examples(module):
        namespace = dict(vars(solution))
        for fragment in text.split(";"):
            fragment = re.sub(r"^\s*(then|and|but|with|after)\b", "", fragment.strip())
            comparison = _longest_code(fragment, "eval")
            if comparison is None:
                setup = _longest_code(fragment, "exec")
                if setup is not None:
                    try:
                        exec(setup, namespace)  # noqa: S102  (the stub's own example, on the worked solution)
                    except Exception:  # noqa: BLE001  set-up that needs what the prose says in words: skip what follows
                        break
                continue
            try:
                holds = eval(comparison, namespace)
            except (NameError, AttributeError):  # names the text defines only in words
                continue
            except Exception as error:  # noqa: BLE001  any error is the example failing
                failures.append(f"chapter {module[2:4]}, task {task}: {comparison} raised {error!r}")
                continue
            if holds is not True:
                failures.append(f"chapter {module[2:4]}, task {task}: {comparison} does not hold")
    return failures


@pytest.mark.parametrize("module", MODULES)
def test_every_stub_example_holds_for_the_worked_solution(module):
    if module == "ch03_triton" and not triton_available():
        pytest.skip("chapter 03's solutions import triton, which is not installed")
    failures = _checks(module)
    assert failures == [], "stub examples the worked solution does not satisfy:\n" + "\n".join(failures)


def test_the_examples_are_read():
    """The parser finds the comparisons it is meant to check (a parser that finds none passes everything)."""
    checked = [
        _longest_code(fragment, "eval")
        for _, text in _examples("ch04_hash_chains") + _examples("ch07_scheduler") + _examples("ch02_paging")
        for fragment in text.split(";")
    ]
    assert 'num_cached_tokens([b"h0", b"h1", b"h2"], {b"h0", b"h2"}, 40, 16) == 16' in checked, checked
    assert "chunk_plan(150, 64, 24) == [24] * 6 + [6]" in checked, checked
    assert sum(c is not None for c in checked) >= 10, checked
