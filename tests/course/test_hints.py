"""Hints a learner opens on purpose (nanocourse.hints): every chapter that has them lists them and shows each one,
and a wrong chapter or number says what exists."""

import re
from pathlib import Path

import pytest

from nanocourse import hint
from nanocourse.hints import HINTS_DIR, chapter_hints

CHAPTERS = sorted(p.stem for p in HINTS_DIR.glob("*.md"))


def test_chapter_07_has_hints():
    assert "07" in CHAPTERS


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_a_chapters_hints_list_and_open_one_at_a_time(chapter):
    hints = chapter_hints(chapter)
    assert len(hints) >= 3, "hints go from a nudge to close-to-code: at least three steps"
    listing = str(hint(chapter))
    assert all(f"{h.number}. {h.title}" in listing for h in hints)
    assert all(h.text not in listing for h in hints), "the list shows titles only, not the hints themselves"
    first = hint(int(chapter), 1)
    # "hint 1", never "Hint 13.1": a hint's number must not read as a task id (hint 4 may be task 13.2's)
    assert str(first).startswith(f"Chapter {chapter}, hint 1: {hints[0].title}") and hints[0].text in str(first)
    assert first._repr_markdown_().startswith(f"**Chapter {chapter}, hint 1:")


def test_a_wrong_chapter_or_number_says_what_exists():
    with pytest.raises(ValueError, match="hints 1 to"):
        hint("07", 0)
    with pytest.raises(ValueError, match="chapters with hints: .*07"):
        hint("99")


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_attribute_a_hint_names_is_one_the_worked_solution_uses(chapter):
    """A hint that says `self.head` where the grader reads `self.fake_free_list_head` sends the learner to a failure."""
    solution = next((HINTS_DIR.parents[1] / "solutions").glob(f"ch{chapter}_*.py")).read_text()
    named = {n for h in chapter_hints(chapter) for n in re.findall(r"self\.([A-Za-z_]\w*)", h.text)}
    unknown = sorted(n for n in named if not re.search(rf"(self\.{n}\b|def {n}\b)", solution))
    assert unknown == [], (
        f"chapter {chapter}'s hints name self.{', self.'.join(unknown)}, which its worked solution "
        "never uses: the contract's names are the ones the grader reads"
    )


# ---------------------------------------------------------------------------------------------------------------
# The worked solutions stay out of the stubs, and out of every hint but the last of its exercise.
#
# A hint's title starts with its exercise: a task id and a name, then a colon ("06.2 free_blocks: what if a block
# is freed twice?"). An exercise's hints sit together, and only the last of them may hold code. A hint whose title
# starts otherwise speaks to the whole chapter and holds no code at all.

ROOT = HINTS_DIR.parents[1]
MIN_CHARS = 25  # shorter lines (`i += 1`, `return None`) are the same in any code and give nothing away
MIN_PART_CHARS = 30  # a line's right-hand side or condition: a tool's bare name (`KVCacheBlock(block_id=-1)`) is not
_LEAD = re.compile(r"^(?:return|yield|raise|assert|if|elif|while|else|not|await)\b\s*")
_ASSIGN = re.compile(r"^[^=()\[\]{}'\"]*?\s(?:[-+*/%|&]|//)?=\s")


def _exercise(title: str) -> str | None:
    """The exercise a hint belongs to ("06.2 free_blocks"), or None for a hint on the whole chapter."""
    match = re.match(r"(\d\d\.\d+[a-z]?\b[^:]*):", title)
    return match.group(1) if match else None


def _normalise(text: str) -> str:
    return " ".join(text.replace("`", " ").split())


def _solution_lines(source: str) -> list[str]:
    """The non-trivial lines of the solution's function bodies (docstrings and signatures left out: a stub
    repeats the signature on purpose), each normalised, with its right-hand side and its condition too, so that
    a hint that quotes `self.x.f(a, b)` out of `hits = self.x.f(a, b)` is caught."""
    import ast

    lines = source.splitlines()
    body_lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:]  # the docstring
            for stmt in body:
                body_lines.update(range(stmt.lineno, stmt.end_lineno + 1))
    found = []
    for number in sorted(body_lines):
        code = lines[number - 1].split("  #")[0]
        code = code.split("# ")[0] if code.lstrip().startswith("#") else code
        line = _normalise(code).rstrip(",:")
        parts = {_LEAD.sub("", line)}
        parts |= {_ASSIGN.sub("", part, count=1) for part in parts}
        found += [(line, line)] if len(line) >= MIN_CHARS else []
        found += [(line, part) for part in parts - {line} if len(part) >= MIN_PART_CHARS]
    return found


def _leaks(chapter: str, root: Path = ROOT) -> list[str]:
    """Every solution line of the chapter that its stub or a hint before its exercise's last one shows."""
    stub = next((root / "exercises").glob(f"ch{chapter}_*.py")).read_text()
    given = {line for line, _ in _solution_lines(stub)}  # code the stub hands the learner ready-made
    solution = [
        (line, part)
        for line, part in _solution_lines(next((root / "solutions").glob(f"ch{chapter}_*.py")).read_text())
        if line not in given
    ]
    texts = {"the stub": _normalise(stub)}
    hints_path = root / "nanocourse" / "hints" / f"{chapter}.md"
    if hints_path.exists():
        parts = re.split(r"^## (.+)$", hints_path.read_text(), flags=re.MULTILINE)[1:]
        titles, bodies = [t.strip() for t in parts[::2]], parts[1::2]
        exercises = [_exercise(t) for t in titles]
        for i, (exercise, body) in enumerate(zip(exercises, bodies)):
            last_of_exercise = exercise is not None and exercise not in exercises[i + 1 :]
            if not last_of_exercise:
                texts[f"hint {chapter}.{i + 1} ({titles[i]})"] = _normalise(body)
    leaks = []
    for where, text in texts.items():
        shown = sorted({line for line, candidate in solution if candidate in text})
        leaks += [f"chapter {chapter}, {where}: {line}" for line in shown]
    return leaks


SOLVED = sorted(p.name[2:4] for p in (ROOT / "solutions").glob("ch[0-9][0-9]_*.py"))


@pytest.mark.parametrize("chapter", SOLVED)
def test_no_stub_and_no_early_hint_shows_a_line_of_the_worked_solution(chapter):
    """The stub states a contract and the hints climb a ladder (a question, the idea, the vLLM lines to read);
    a line of the worked solution belongs only in the last hint of its exercise."""
    leaks = _leaks(chapter)
    assert leaks == [], f"{len(leaks)} solution line(s) shown too early:\n" + "\n".join(leaks)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_an_exercises_hints_sit_together(chapter):
    """A ladder is read in order: one exercise's hints are consecutive, so its last one is the code."""
    exercises = [e for e in map(_exercise, (h.title for h in chapter_hints(chapter))) if e]
    runs = [e for i, e in enumerate(exercises) if i == 0 or exercises[i - 1] != e]
    assert len(runs) == len(set(runs)), f"chapter {chapter}: an exercise's hints are split: {runs}"


def test_the_leak_check_catches_a_quoted_solution_line(tmp_path):
    """The check itself: a stub that quotes a solution line, and a hint that does before its exercise's last."""
    for folder in ("solutions", "exercises", "nanocourse/hints"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "solutions" / "ch99_x.py").write_text(
        "def f(xs):\n    '''Doc.'''\n    total = sum(x * x for x in xs if x > 0)  # squares\n    return total\n"
    )
    (tmp_path / "exercises" / "ch99_x.py").write_text("def f(xs):\n    '''Return sum(x * x for x in xs if x > 0).'''\n")
    (tmp_path / "nanocourse" / "hints" / "99.md").write_text(
        "## 99.1 f: a question\n\n`total = sum(x * x for x in xs if x > 0)`\n\n## 99.1 f: code\n\n"
        "`total = sum(x * x for x in xs if x > 0)`\n\n## Close to code: f\n\n`sum(x * x for x in xs if x > 0)`\n"
    )
    leaks = _leaks("99", tmp_path)
    assert len(leaks) == 3 and "the stub" in leaks[0] and "hint 99.1" in leaks[1] and "hint 99.3" in leaks[2], leaks


@pytest.mark.parametrize("chapter", ["04", "12"])
def test_the_list_of_hints_shows_titles_only_however_it_is_displayed(chapter):
    listing = hint(chapter)
    for shown in (str(listing), repr(listing), listing._repr_markdown_()):
        assert all(h.title in shown for h in listing.hints)
        assert not any(h.text in shown for h in listing.hints), "a hint's text is shown only when it is opened"


def test_chapter_07s_last_schedule_hint_is_the_worked_solutions_logic():
    """Hint 07.2's code is the worked schedule(), every non-trivial line of it: a learner who copies it passes 07.8
    (a hint that drops the Alone rule's drafts condition, or the drafting slots, sends them to a failure)."""
    import ast
    import textwrap

    source = (ROOT / "solutions" / "ch07_scheduler.py").read_text()
    schedule = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == "schedule")
    body = textwrap.dedent("\n".join(source.splitlines()[schedule.lineno - 1 : schedule.end_lineno]))
    last = [h for h in chapter_hints("07") if h.title.startswith("07.2 ")][-1]
    missing = [line for line, _ in _solution_lines(body) if line not in _normalise(last.text)]
    assert missing == [], "hint 07.2's code lacks these lines of the worked schedule():\n" + "\n".join(missing)


# ---------------------------------------------------------------------------------------------------------------
# The ladder keeps the stubs' order: design, grade, then read vLLM. An exercise's "read vLLM" and code hints, and
# its last one, open once a grade of the learner's own code has tried every task the hint names.


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_gated_hint_names_graded_tasks(chapter):
    """A hint whose title names the idea, vLLM or code is for an exercise, and its title names tasks the grader has:
    else its gate could never open (or would never close). Only an exercise's first rung, a question, is open."""
    from nanocourse.grading import chapter_tasks
    from nanocourse.hints import TITLE

    graded = {task for task, _ in chapter_tasks(chapter)}
    for h in chapter_hints(chapter):
        match = TITLE.match(h.title)
        if re.search(r"\b(vLLM|code)\b", h.title):
            assert match, f"hint {chapter}.{h.number} ({h.title!r}) names no task: '<ids> <subject>: ...'"
        if match and re.search(r"\b(idea|vLLM|code)\b", match["rung"]):
            assert h.gated, f"hint {chapter}.{h.number} ({h.title!r}) names the idea, vLLM or code yet is not gated"
        unknown = [task for task in h.tasks if task not in graded]
        assert unknown == [], f"hint {chapter}.{h.number} ({h.title!r}) names {unknown}, which no grader has"
    last = {exercise: h for h in chapter_hints(chapter) if (exercise := _exercise(h.title))}
    assert all(h.gated for h in last.values()), "an exercise's last hint, the one that may hold code, is gated"


def test_a_read_vllm_hint_opens_after_a_try_of_its_tasks(tmp_path, monkeypatch):
    from nanocourse.attempts import attempts, record_attempts
    from nanocourse.hints import LockedHint

    monkeypatch.setenv("NANOCOURSE_PROGRESS", str(tmp_path / "progress.json"))
    hints = chapter_hints("06")
    question = next(h for h in hints if h.title.startswith("06.2 free_blocks:"))
    read = next(h for h in hints if h.title == "06.2 free_blocks: read vLLM")
    both = next(h for h in hints if h.title.startswith("06.8, 06.2, 06.2b ") and h.gated)
    assert not question.gated and hint("06", question.number) == question, "a question rung is always open"
    locked = hint("06", read.number)
    assert isinstance(locked, LockedHint) and read.text not in str(locked) + locked._repr_markdown_()
    assert "06.2" in str(locked) and "make grade CH=06" in str(locked)
    assert f'hint("06", {read.number}, stuck=True)'.replace('"', "'") in str(locked)
    assert "(locked: grade 06.2 first)" in str(hint("06"))
    assert hint("06", read.number, stuck=True) == read, "stuck=True opens it: a choice, never an accident"
    record_attempts(["06.2", "06.1"])
    assert attempts() == {"06.1": 1, "06.2": 1}
    assert hint("06", read.number) == read and "locked: grade 06.2 first" not in str(hint("06"))
    assert isinstance(hint("06", both.number), LockedHint), "a hint for 06.8, 06.2 and 06.2b waits for all three"
    assert list(hint("06", both.number).untried) == ["06.8", "06.2b"]
    record_attempts(["06.8", "06.2b", "06.2"])
    assert hint("06", both.number) == both and attempts()["06.2"] == 2


def test_grading_records_only_tasks_tried_with_real_code():
    from nanocourse.grading import DID_NOT_RUN, NOT_IMPLEMENTED, TaskResult, tried_tasks

    results = [
        TaskResult("06.1", "a", True, ""),
        TaskResult("06.2", "b", False, "06.2: a double free must change nothing"),
        TaskResult("06.3", "c", False, NOT_IMPLEMENTED),
        TaskResult("06.3c", "d", False, DID_NOT_RUN),
        TaskResult("06.2", "b", True, ""),
    ]
    assert tried_tasks(results) == ["06.1", "06.2"]


def test_a_progress_file_the_course_did_not_write_says_what_to_do(tmp_path, monkeypatch):
    from nanocourse.attempts import attempts

    path = tmp_path / "progress.json"
    path.write_text("[1, 2]")
    monkeypatch.setenv("NANOCOURSE_PROGRESS", str(path))
    with pytest.raises(ValueError, match="not the course's progress record; delete it"):
        attempts()


# ---------------------------------------------------------------------------------------------------------------
# An exercise's last hint, where its code is a whole function body, passes the exercise's task when pasted as
# written: a hint that slices with -1 where the contract asks for ValueError sends the learner to a failure.

PASTE_CHECKED = ["06"]  # chapters whose last hints are checked this way; another joins once its hints pass


def _pasted_hint_variants(chapter: str) -> dict[str, tuple[str, str, str]]:
    """{exercise: (task, function, the solution with that function's body replaced by the hint's code)} for each
    exercise whose name is a function of the worked solution and whose last hint holds one code block that does not
    define that function itself (a hint spread over several methods, or a sketch in comments, is left out)."""
    import ast
    import textwrap

    source = next((ROOT / "solutions").glob(f"ch{chapter}_*.py")).read_text()
    functions = {n.name: n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)}
    last = {exercise: h for h in chapter_hints(chapter) if (exercise := _exercise(h.title))}
    variants = {}
    for exercise, h in last.items():
        task, _, name = exercise.partition(" ")
        blocks = re.findall(r"```python\n(.*?)```", h.text, flags=re.DOTALL)
        if name not in functions or len(blocks) != 1 or re.search(rf"^def {name}\b", blocks[0], re.MULTILINE):
            continue
        node = functions[name]
        body = node.body
        if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]  # the docstring stays
        lines = source.splitlines(keepends=True)
        indent = " " * body[0].col_offset
        pasted = textwrap.indent(blocks[0], indent, lambda line: bool(line.strip()))
        variants[exercise] = (
            task,
            name,
            "".join(lines[: body[0].lineno - 1]) + pasted + "".join(lines[node.end_lineno :]),
        )
    return variants


@pytest.mark.parametrize("chapter", PASTE_CHECKED)
def test_an_exercises_last_hint_pasted_as_written_passes_its_task(chapter, tmp_path):
    from nanocourse.grading import chapter_module, grade

    variants = _pasted_hint_variants(chapter)
    assert len(variants) >= 5, f"chapter {chapter}: too few whole-function hints found: {sorted(variants)}"
    for k, (task, _, text) in enumerate(variants.values()):
        folder = tmp_path / f"hint{k:02d}"
        folder.mkdir()
        (folder / f"{chapter_module(chapter)}.py").write_text(text)
        (folder / "TASK").write_text(task)
    results = grade(chapter, str(tmp_path))
    names = {f"hint{k:02d}": exercise for k, exercise in enumerate(variants)}
    failed = [f"{names[r.variant]}: {r.message.splitlines()[0]}" for r in results if not r.passed]
    ran = {names[r.variant] for r in results}
    assert failed == [] and ran == set(variants), f"last hints that fail their task as written: {failed}; ran {ran}"
