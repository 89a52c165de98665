"""Python without Triton, as on macOS or Windows, where triton has no wheels: `import triton` fails and
importlib.util.find_spec("triton") is None. CI's second pass puts this folder on PYTHONPATH (the
grader's subprocesses inherit it) and runs the suite again."""

import sys

sys.modules["triton"] = None
