"""Ctrl-C for training loops: a flag the loop checks between steps, instead of an exception.

Python turns SIGINT into `KeyboardInterrupt`, raised wherever the main thread happens to be.
In a JAX program that is often a garbage-collection callback of XLA, where the exception is
printed as "Exception ignored in ..." and lost, so the run goes on; elsewhere it may land in
the middle of a checkpoint save. `InterruptFlag` replaces the handler while it is active: the
first SIGINT only sets `requested`, and the program stops at the next point it chooses (between
two steps, after saving). A second SIGINT ends the process at once, with the conventional
exit status 130 (128 + SIGINT).

Example:
    >>> with InterruptFlag() as interrupt:
    ...     for step in range(steps):
    ...         if interrupt.requested:
    ...             save(step)
    ...             break
    ...         train_one_step()
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130, what shells report for a program stopped by Ctrl-C

# Hidden hook for tests. `_MODOPT_TEST_INTERRUPT_AT=<point>` makes the program send SIGINT to
# itself when it reaches `interrupt_point(<point>, ...)`; `<point>:parent` makes it print
# `waiting for SIGINT at <point>` on stderr and wait (up to a minute) for another process to
# send one. Either way the signal goes through the real handler; no test depends on sleeps.
TEST_HOOK = "_MODOPT_TEST_INTERRUPT_AT"


def _abort() -> None:
    os.write(2, b"interrupted again: stopping at once, without saving\n")
    os._exit(EXIT_INTERRUPTED)


class InterruptFlag:
    """While active (a context manager), SIGINT sets `requested` instead of raising.

    Arguments:
        on_second: called on the second SIGINT; the default writes one line to stderr and ends
            the process at once with exit status 130 (nothing more is saved).

    The previous handler is restored on exit. Python handles signals only in the main thread;
    used from another thread, or where SIGINT is ignored, the flag is inactive and never set.
    """

    def __init__(self, on_second: Callable[[], Any] = _abort):
        self.on_second = on_second
        self.requested = False
        self._previous: Any = None
        self._installed = False

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            self.on_second()
        self.requested = True

    def __enter__(self) -> InterruptFlag:
        self.requested = False
        # A SIGINT ignored by whoever started the program (a background job of a shell) stays
        # ignored, as Python itself does at start-up.
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self._installed:
            # `None` means a handler installed from outside Python: the default is the closest.
            signal.signal(signal.SIGINT, signal.SIG_DFL if self._previous is None else self._previous)
            self._installed = False


def interrupt_point(name: str, interrupt: InterruptFlag) -> None:
    """Where tests can interrupt the program (see `TEST_HOOK`); nothing unless asked."""
    point, _, mode = os.environ.get(TEST_HOOK, "").partition(":")
    if not name or point != name:
        return
    if mode == "parent":
        print(f"waiting for SIGINT at {name}", file=sys.stderr, flush=True)
        deadline = time.monotonic() + 60
        while not interrupt.requested and time.monotonic() < deadline:
            time.sleep(0.01)
    else:
        os.kill(os.getpid(), signal.SIGINT)
        # The handler runs between bytecodes of the main thread; make sure it has before returning.
        deadline = time.monotonic() + 10
        while interrupt._installed and not interrupt.requested and time.monotonic() < deadline:
            time.sleep(0.001)
