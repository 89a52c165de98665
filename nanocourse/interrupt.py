"""Jupyter's Interrupt button, on a timer, for cells (and tests) that show what an interrupt does."""

from __future__ import annotations

import _thread
import ctypes
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


def _interrupt(thread_id: int) -> None:
    """KeyboardInterrupt in that thread, wherever it is: through SIGINT's own path in the main thread, where
    a kernel runs its cells and the Interrupt button lands; as an asynchronous exception in another thread,
    or where SIGINT is ignored (a test worker that was handed SIG_IGN), since interrupt_main then does nothing."""
    if thread_id == threading.main_thread().ident and callable(signal.getsignal(signal.SIGINT)):
        _thread.interrupt_main()
    else:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(KeyboardInterrupt))


@contextmanager
def keyboard_interrupt_after(seconds: float) -> Iterator[None]:
    """Raise KeyboardInterrupt in this thread after `seconds`, unless the body has ended by then."""
    timer = threading.Timer(seconds, _interrupt, (threading.get_ident(),))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        try:
            timer.join()
        except KeyboardInterrupt:  # it fired just as the body ended: nothing was left to interrupt
            pass


@contextmanager
def interrupt_after(seconds: float) -> Iterator[None]:
    """keyboard_interrupt_after, then print the exception's notes and let the cell go on."""
    try:
        with keyboard_interrupt_after(seconds):
            yield
    except KeyboardInterrupt as interrupt:
        print("KeyboardInterrupt.", *getattr(interrupt, "__notes__", []))
