"""interrupt_after(): Jupyter's Interrupt button, on a timer, for cells that show what an interrupt does."""

from __future__ import annotations

import _thread
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def interrupt_after(seconds: float) -> Iterator[None]:
    """Raise KeyboardInterrupt in this thread after `seconds`, wherever it is, as the Interrupt button's
    SIGINT does, then print the exception's notes and let the cell go on. The body must outlast the timer."""
    timer = threading.Timer(seconds, _thread.interrupt_main)
    timer.start()
    try:
        yield
    except KeyboardInterrupt as interrupt:
        print("KeyboardInterrupt.", *getattr(interrupt, "__notes__", []))
    finally:
        timer.cancel()
        timer.join()
