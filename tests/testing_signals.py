"""Starting the example jobs from tests, however the test run itself was launched."""

from __future__ import annotations

import contextlib
import signal
import threading


@contextlib.contextmanager
def sigint_handled_in_children():
    """Processes started inside handle SIGINT as foreground programs do, however this one was
    launched. One started by a process that ignores SIGINT (a background job of a shell, `nohup
    ... &`) inherits the ignoring, and the job, like Python itself, then leaves it ignored; a
    handler, unlike an ignored signal, is reset to the default in a new program. (Not with
    `preexec_fn`, which runs Python in a forked copy of this multithreaded process.)"""
    ignored = threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
