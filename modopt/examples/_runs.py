"""What the example jobs share: ending early with a message, refusing a directory that holds
another run, and copies of the run's record for background saves."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

EXIT_SETTINGS = 2  # the checkpoint directory holds another run


class Stop(Exception):
    """Ends the job early with a message on stderr and an exit status (no traceback)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.message, self.status = message, status


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def check_settings(checkpoints: Any, settings: dict, names: dict, checkpoint_error: type[Exception]) -> None:
    """Refuses a directory that holds a run with other `settings` (or one this job cannot read);
    `names` says how each setting is given on the command line."""
    remedy = "use --fresh to start over there, or another --checkpoint-dir."
    try:
        saved = checkpoints.restore(settings=settings)["settings"]
    except checkpoint_error as error:
        raise Stop(f"{checkpoints.directory} holds a checkpoint of another kind ({error}); {remedy}", EXIT_SETTINGS) from None
    differ = [f"{names[name]} {saved[name]} there, {value} now" for name, value in settings.items() if saved[name] != value]
    if differ:
        raise Stop(f"{checkpoints.directory} holds a run with other settings ({'; '.join(differ)}); {remedy}", EXIT_SETTINGS)


def copied(run: dict) -> dict:
    """Saves are written in the background: arrays that the loop will not change."""
    import jax

    return jax.tree.map(lambda x: x.copy() if isinstance(x, np.ndarray) else x, run)
