"""Ctrl-C for training loops: a flag the loop checks between steps, instead of an exception.

Python turns SIGINT into `KeyboardInterrupt`, raised wherever the main thread happens to be.
In a JAX program that is often a garbage-collection callback of XLA, where the exception is
printed as "Exception ignored in ..." and lost, so the run goes on; elsewhere it may land in
the middle of a checkpoint save. `InterruptFlag` replaces the handler while it is active: the
first SIGINT only sets `requested`, and the program stops at the next point it chooses (between
two steps, after saving). A second SIGINT ends the process at once, with the conventional
exit status 130 (128 + SIGINT). `exit_with(main())` ends such a program: a Ctrl-C while it
exits (while JAX and Orbax clean up) ends it at once, without a traceback from the clean-up.

Example:
    >>> with InterruptFlag() as interrupt:
    ...     for step in range(steps):
    ...         if interrupt.requested:
    ...             save(step)
    ...             break
    ...         train_one_step()
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130, what shells report for a program stopped by Ctrl-C

# Hidden hook for tests. `_MODOPT_TEST_INTERRUPT_AT=<point>` makes the program send SIGINT to
# itself when it reaches `interrupt_point(<point>, ...)`; `<point>:parent` makes it print
# `waiting for SIGINT at <point>` on stderr and wait (up to a minute) for another process to
# send one. Either way the signal goes through the real handler; no test depends on sleeps.
# Several points are separated by commas; the point `exit` is an `atexit` callback, run as the
# program exits, where JAX's clean-up runs.
TEST_HOOK = "_MODOPT_TEST_INTERRUPT_AT"


def report(message: str) -> None:
    """Writes `message` to stderr on a line of its own: on a terminal, the line where the
    cursor is may hold a progress bar or the `^C` the terminal echoed."""
    newline = "\n" if _is_terminal(sys.stderr) else ""
    print(f"{newline}{message}", file=sys.stderr, flush=True)


def _is_terminal(stream: Any) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no stream, or a closed one
        return False


def _abort() -> None:
    newline = b"\n" if os.isatty(2) else b""
    os.write(2, newline + b"interrupted again: stopping at once, without saving\n")
    os._exit(EXIT_INTERRUPTED)


def exit_with(status: int) -> NoReturn:
    """Exits the program with `status` (`sys.exit`), and makes a Ctrl-C from now on end it at
    once with that status.

    After `main` returns, Python still runs the clean-up that JAX, Orbax and others registered
    with `atexit`; a SIGINT there would raise `KeyboardInterrupt` inside it, and Python would
    print its traceback. Everything of the run is saved by then, so the process just ends
    (output flushed), quietly. Where SIGINT is ignored, or off the main thread, nothing changes.
    """

    def handle(signum: int, frame: Any) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, ValueError, OSError):
                pass
        os._exit(status)

    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, handle)
    sys.exit(status)


def _interrupt_at_exit() -> None:
    """The test hook's point `exit`: a SIGINT handled inside an `atexit` callback."""
    os.kill(os.getpid(), signal.SIGINT)
    deadline = time.monotonic() + 10  # the handler runs between bytecodes of this loop
    while time.monotonic() < deadline:
        time.sleep(0.001)


def _hook_points() -> dict[str, str]:
    """The test hook's points, each with its mode (`""` or `"parent"`)."""
    entries = [entry.partition(":") for entry in os.environ.get(TEST_HOOK, "").split(",") if entry]
    return {point: mode for point, _, mode in entries}


if "exit" in _hook_points():
    atexit.register(_interrupt_at_exit)


class InterruptFlag:
    """While active (a context manager), SIGINT sets `requested` instead of raising.

    Arguments:
        on_second: called on the second SIGINT; the default writes one line to stderr and ends
            the process at once with exit status 130 (nothing more is saved).
        terminate: SIGTERM (how cloud TPU and GPU schedulers preempt a job) sets the flag too,
            once; `signal_number` then says which came first.

    The previous handlers are restored on exit. Python handles signals only in the main thread;
    used from another thread, or where SIGINT is ignored, the flag is inactive and never set.
    """

    def __init__(self, on_second: Callable[[], Any] = _abort, *, terminate: bool = False):
        self.on_second = on_second
        self.requested = False
        self.signal_number: int | None = None
        self._signals = (signal.SIGINT, signal.SIGTERM) if terminate else (signal.SIGINT,)
        self._previous: dict[int, Any] = {}
        self._installed = False

    @property
    def exit_status(self) -> int:
        """128 plus the number of the signal that set the flag (130 for SIGINT, 143 for SIGTERM)."""
        return 128 + (self.signal_number or signal.SIGINT)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            if signum == signal.SIGINT:
                self.on_second()
            return
        self.requested, self.signal_number = True, signum

    def __enter__(self) -> InterruptFlag:
        self.requested, self.signal_number = False, None
        # A SIGINT ignored by whoever started the program (a background job of a shell) stays
        # ignored, as Python itself does at start-up.
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            self._previous = {number: signal.signal(number, self._handle) for number in self._signals}
            self._installed = True
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self._installed:
            # `None` means a handler installed from outside Python: the default is the closest.
            for number, previous in self._previous.items():
                signal.signal(number, signal.SIG_DFL if previous is None else previous)
            self._installed = False


def interrupt_point(name: str, interrupt: InterruptFlag) -> None:
    """Where tests can interrupt the program (see `TEST_HOOK`); nothing unless asked."""
    points = _hook_points()
    if not name or name not in points:
        return
    mode = points[name]
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
