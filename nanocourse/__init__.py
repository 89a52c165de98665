"""Course tooling: quizzes, the grader, the widgets each chapter uses to show engine state, the hints a
learner opens on purpose, the answers a chapter reveals once it passes (reveal), and my_llm(), the engine built
from the learner's own finished parts."""

from nanocourse.checkout import in_checkout, use_checkout
from nanocourse.hints import hint
from nanocourse.reveals import reveal

# exercises/ and solutions/ are the checkout's folders, not installed packages (nanocourse/checkout.py). Installed
# without a checkout, the course's own parts still import; what reads those folders says what is missing.
if in_checkout():
    use_checkout()


def my_llm(*args, **kwargs):
    """See nanocourse.my_engine.my_llm (imported on first use: it pulls in the whole engine)."""
    from nanocourse.my_engine import my_llm as build

    return build(*args, **kwargs)


def load_exercise(module: str):
    """See nanocourse.my_engine.load_exercise: exercises/<module>.py as it is on disk now."""
    from nanocourse.my_engine import load_exercise as load

    return load(module)


__all__ = ["hint", "load_exercise", "my_llm", "reveal"]
