"""One writer per checkpoint directory: a lock file held while a `CheckpointManager` writes.

Two managers saving into one directory corrupt each other's steps (the second finds the
first's step half written, or deletes its temporary files), so the first save of a manager
makes it the directory's writer: it creates `<directory>/modopt-writer.lock`, a JSON file
naming its host, process and start time, and holds it until `close()` (or the end of the
program). A thread of the holding process refreshes the file's modification time every
`HEARTBEAT` seconds. Reading a directory needs no lock: any number of managers may restore
from it while one writes.

A save that finds the file held by another manager raises `CheckpointError`, unless its holder
is gone, when the file is taken over:

- on the same host, when the process it names no longer runs (or is this process, and no
  manager here holds it: a previous process of the same id left it);
- on any host, when it has not been refreshed for `STALE_AFTER` seconds (a machine that
  crashed or was preempted).

So a run that crashed, or that restarts on another machine after a preemption, resumes
writing without anyone deleting the file; and a person who knows that no process writes
there may delete it. In a multi-process (multi-host) run, process 0 holds the lock for all
(and refreshes it), and tells every process whether to save or to raise.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import threading
import time
import uuid

import jax
import numpy as np

from ._records import CheckpointError

NAME = "modopt-writer.lock"
HEARTBEAT = 10.0
STALE_AFTER = 60.0

_HOST = socket.gethostname()
_held: dict[str, str] = {}  # path -> token, for the locks this process holds
_guard = threading.Lock()
_thread: threading.Thread | None = None


class WriterLock:
    """The writer lock of one manager's directory, taken on its first save."""

    def __init__(self, directory: str):
        self.directory = directory
        self.path = os.path.join(directory, NAME)
        self.token: str | None = None

    def acquire(self) -> bool:
        """Makes this manager the directory's writer; whether it just became it (it was not before).

        Raises `CheckpointError` where another writer holds the directory, or took it over
        from this manager (judging it abandoned: this process was stopped for minutes).

        With several processes (`jax.distributed`), process 0 holds the lock for all and every
        process gets its outcome: all go on saving, or all raise. (A process that went on alone
        would wait in Orbax's collectives for the others, forever.)
        """
        if jax.process_count() == 1:
            return self._acquire()
        outcome, message = _BECAME, ""
        if jax.process_index() == 0:
            try:
                outcome = _BECAME if self._acquire() else _STILL
            except CheckpointError as error:
                outcome, message = _REFUSED, str(error)
        outcome, message = _from_process_0(outcome, message)
        if outcome == _REFUSED:
            raise CheckpointError(message)
        if jax.process_index() != 0:
            self.token = ""  # held, by process 0
        return outcome == _BECAME

    def _acquire(self) -> bool:
        if self.token:
            return self._check()
        token = uuid.uuid4().hex
        for _ in range(5):
            if _create(self.path, token):
                break
            owner, age = _read(self.path)
            if owner is None:
                continue  # released in between: try again
            if not _abandoned(owner, age):
                raise CheckpointError(_held_message(self.directory, self.path, owner, age))
            _replace(self.path, token)
            break
        else:
            raise CheckpointError(f"save: could not take the writer lock {self.path}; try again. Nothing was saved.")
        owner, age = _read(self.path)
        if not owner or owner.get("token") != token:
            # Another manager took the abandoned lock at the same moment.
            raise CheckpointError(_held_message(self.directory, self.path, owner, age))
        self.token = token
        _hold(self.path, token)
        return True

    def _check(self) -> bool:
        """Still the writer: `False`; else raises."""
        owner, _ = _read(self.path)
        if owner is None and _create(self.path, self.token):  # deleted by hand while this manager writes
            return False
        if owner is not None and owner.get("token") == self.token:
            return False
        owner, _ = _read(self.path)
        self.release()
        who = f"process {owner.get('pid')} on host {owner.get('host')!r}" if owner else "another writer"
        raise CheckpointError(
            f"save: this CheckpointManager no longer writes to {self.directory}: {who} holds its lock {self.path} "
            f"now (the lock was deleted, or taken over as abandoned after {STALE_AFTER:.0f} s without a refresh: was "
            "this process stopped?). Two writers on one directory corrupt each other's steps, so this manager stops "
            "writing there. Nothing was saved."
        )

    def release(self) -> None:
        """Gives the directory up (after the saves in flight are written)."""
        token, self.token = self.token, None
        if not token:
            return
        with _guard:
            if _held.get(self.path) == token:
                del _held[self.path]
        owner, _ = _read(self.path)
        if owner and owner.get("token") == token:
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass

    @property
    def held(self) -> bool:
        return self.token is not None


_BECAME, _STILL, _REFUSED = 0, 1, 2
_MESSAGE_BYTES = 4096


def _from_process_0(outcome: int, message: str) -> tuple[int, str]:
    """Process 0's outcome and message, in every process (a collective: all processes call it)."""
    from jax.experimental import multihost_utils

    text = np.zeros(_MESSAGE_BYTES, np.uint8)
    encoded = message.encode()[:_MESSAGE_BYTES]
    text[: len(encoded)] = np.frombuffer(encoded, np.uint8)
    outcome, text = multihost_utils.broadcast_one_to_all((np.int32(outcome), text))
    return int(outcome), bytes(np.asarray(text, np.uint8)).rstrip(b"\0").decode(errors="replace")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _content(token: str) -> dict:
    return {"host": _HOST, "pid": os.getpid(), "since": _now(), "token": token}


def _create(path: str, token: str) -> bool:
    """Creates the lock file, whole, unless it exists (a hard link is atomic, also on NFS)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = f"{path}.{token}"
    with open(temporary, "w") as file:
        json.dump(_content(token), file)
    try:
        os.link(temporary, path)
        return True
    except FileExistsError:
        return False
    finally:
        os.remove(temporary)


def _replace(path: str, token: str) -> None:
    temporary = f"{path}.{token}"
    with open(temporary, "w") as file:
        json.dump(_content(token), file)
    os.replace(temporary, path)


def _read(path: str) -> tuple[dict | None, float | None]:
    """The lock's content (`{}` if unreadable) and seconds since its last refresh; `(None, None)`
    if there is no lock."""
    try:
        age = time.time() - os.stat(path).st_mtime
    except FileNotFoundError:
        return None, None
    try:
        with open(path) as file:
            content = json.load(file)
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError):
        return {}, age
    return (content if isinstance(content, dict) else {}), age


def _abandoned(owner: dict, age: float) -> bool:
    """Whether the lock's holder is gone (else it may still be writing)."""
    if age > STALE_AFTER:
        return True
    if owner.get("host") == _HOST and isinstance(owner.get("pid"), int):
        if owner["pid"] != os.getpid():
            return not _running(owner["pid"])
        with _guard:  # this process: held by one of its managers, or left by an earlier process of its id
            return owner.get("token") not in _held.values()
    return False


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a process that has ended but not been waited for (a zombie) is not running
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _held_message(directory: str, path: str, owner: dict | None, age: float | None) -> str:
    if owner and owner.get("host") == _HOST and owner.get("pid") == os.getpid():
        return (
            f"save: another CheckpointManager of this process writes to {directory} (it holds {path}). Two writers "
            "on one directory corrupt each other's steps: save through that manager, or close() it first. "
            "Nothing was saved."
        )
    who = f"process {owner.get('pid')} on host {owner.get('host')!r} since {owner.get('since')}" if owner else "an unknown writer"
    refreshed = f" (refreshed {age:.0f} s ago)" if age is not None else ""
    return (
        f"save: another process writes to {directory}: the lock {path} is held by {who}{refreshed}. Two writers on "
        "one directory corrupt each other's steps, so this manager does not write there: stop the other writer, "
        "or save to another directory. A lock whose process has ended is taken over by the next save (on the same "
        f"host at once, from another host after {STALE_AFTER:.0f} s without a refresh); if you know that no process "
        f"writes there, delete {path}. Nothing was saved."
    )


def _hold(path: str, token: str) -> None:
    global _thread
    with _guard:
        _held[path] = token
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_heartbeat, name="modopt-writer-lock", daemon=True)
            _thread.start()


def _heartbeat() -> None:
    while True:
        time.sleep(HEARTBEAT)
        refresh()


def refresh() -> None:
    """Refreshes every lock this process still holds (one taken over is left alone: the next
    save of its manager raises)."""
    with _guard:
        held = dict(_held)
    for path, token in held.items():
        owner, _ = _read(path)
        if owner is not None and owner.get("token") == token:
            try:
                os.utime(path)
            except OSError:
                pass
