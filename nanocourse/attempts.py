"""Which graded tasks the learner has tried with their own code: the record that opens a task's later hints.

Each chapter's stub asks for a design first, then a grade, and only then vLLM's function read beside yours. The
course keeps that order: grading your exercises (`make grade CH=06`, or grade("06") in a notebook) records every
task it tried with your code, and a task's "read vLLM" and code hints open once it has been tried
(nanocourse.hints). A try is a pass, or a failure other than the stub's NotImplementedError; a task that did not
run (a grade stopped at the first failure) is not one.

The record is a small JSON file, {"attempts": {task id: grades that tried it}}, kept out of git:
.nanocourse/progress.json in the checkout (a fresh clone starts afresh), or the file NANOCOURSE_PROGRESS names.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from nanocourse.checkout import ROOT

PROGRESS_ENV = "NANOCOURSE_PROGRESS"


def progress_path() -> Path:
    return Path(os.environ.get(PROGRESS_ENV) or ROOT / ".nanocourse" / "progress.json")


def attempts() -> dict[str, int]:
    """Task id -> how many grades tried it with the learner's code; {} before the first such grade.

    Raises ValueError naming the file if it is not a record this module wrote (delete it to start afresh)."""
    path = progress_path()
    if not path.exists():
        return {}
    try:
        record = json.loads(path.read_text())["attempts"]
        if not all(isinstance(k, str) and isinstance(v, int) for k, v in record.items()):
            raise TypeError
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ValueError(
            f"{path} is not the course's progress record; delete it (the hints it opened lock again until you "
            f"grade), or point {PROGRESS_ENV} at another file."
        ) from None
    return record


def record_attempts(tried: Iterable[str]) -> None:
    """Count one more try for each task id in `tried`; the file is written only when there is one."""
    tried = list(tried)
    if not tried:
        return
    record = attempts()
    for task in tried:
        record[task] = record.get(task, 0) + 1
    path = progress_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"attempts": dict(sorted(record.items()))}, indent=1) + "\n")
