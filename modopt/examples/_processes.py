"""Data-parallel training in several processes, the way TPU pods run: one process per host.

Each process runs the same program. `initialize` joins it to the others with
`jax.distributed.initialize`, after which `jax.devices()` lists the devices of every process
and a mesh over them spans processes. `DataParallel` places a model replicated on such a mesh
and assembles each process's rows of a batch into one global batch, so a jitted step sees the
same arrays as in a single process and XLA inserts the gradient all-reduce. `AgreedFlag` makes
Ctrl-C stop every process at the same step. `ProcessGroup` starts several processes of one
run on this machine (`launch` is the command-line form), which is how the main job runs with
`--processes 2`; on a pod each host starts its own process instead (`--process-id`).

Example (what `python -m modopt.examples.digits --processes 2` does):
    >>> group = ProcessGroup(lambda i, address: [sys.executable, "job.py", str(i), address], 2)
    >>> statuses = group.wait(timeout=600)  # a failure or a timeout ends every process
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

# How long the others may run on once one process has failed: they are waiting for it in a
# collective, which would never end.
GRACE_SECONDS = 5.0


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now (for the coordinator)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def initialize(coordinator: str, processes: int, process_id: int, timeout: int = 120) -> None:
    """Joins this process to a run of `processes` processes (before anything else uses JAX).

    On CPU the processes' collectives go through gloo (TCP); on GPU and TPU through their own
    interconnect. `timeout`: seconds to wait for the other processes to join.
    """
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=coordinator, num_processes=processes, process_id=process_id, initialization_timeout=timeout
    )


class DataParallel:
    """A one-axis mesh ("data") over every device of every process.

    The model and optimizer are replicated; a batch is split by rows over the devices. In a
    single process on one device nothing is placed: arrays stay as they are.
    """

    def __init__(self):
        import jax

        self.distributed = jax.device_count() > 1
        if self.distributed:
            from jax.sharding import NamedSharding
            from jax.sharding import PartitionSpec as P

            mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
            self.replicated, self.rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))

    def replicate(self, tree: Any) -> Any:
        """Every array of `tree` (the same numbers in every process) as a global array held by
        every device."""
        import equinox as eqx
        import jax

        if not self.distributed:
            return jax.tree.map(lambda x: jax.numpy.asarray(x) if isinstance(x, np.ndarray) else x, tree)
        arrays, rest = eqx.partition(tree, eqx.is_array)
        leaves, structure = jax.tree.flatten(arrays)
        keys = [jax.random.key_impl(x) if jax.numpy.issubdtype(x.dtype, jax.dtypes.prng_key) else None for x in leaves]
        # NumPy arrays and Python numbers given to a jitted function are taken as the same in
        # every process; a weakly typed scalar (a hyperparameter) stays weak as a Python number.
        host = [
            np.asarray(jax.random.key_data(x)) if key is not None
            else x.item() if x.ndim == 0 and x.weak_type
            else np.asarray(x)
            for x, key in zip(leaves, keys)
        ]
        placed = jax.jit(lambda xs: xs, out_shardings=self.replicated)(host)
        placed = [x if key is None else jax.random.wrap_key_data(x, impl=key) for x, key in zip(placed, keys)]
        return eqx.combine(structure.unflatten(placed), rest)

    def batch(self, *arrays: np.ndarray) -> tuple[Any, ...]:
        """The global batch `arrays` (the same rows in every process) as global arrays split
        over "data": each process gives its devices' rows only."""
        import jax

        if not self.distributed:
            return tuple(jax.numpy.asarray(x) for x in arrays)
        n = len(arrays[0])
        if n % jax.device_count():
            raise ValueError(f"A batch of {n} rows cannot be split evenly over {jax.device_count()} devices.")
        # The rows of this process's devices (contiguous: `make_mesh` lists a process's devices together).
        held = [index[0] for index in self.rows.addressable_devices_indices_map((n,)).values()]
        rows = slice(min(i.start for i in held), max(i.stop for i in held))
        return tuple(jax.make_array_from_process_local_data(self.rows, x[rows], x.shape) for x in arrays)


class AgreedFlag:
    """An interrupt flag (`_interrupts.InterruptFlag`) that every process reads the same.

    Ctrl-C reaches the processes at different moments; a process that stopped a step before
    the others would wait for them in a collective forever. `requested` is true in every
    process as soon as it is in one of them: it is a collective, so every process must read it
    at the same points of the program.
    """

    def __init__(self, flag: Any):
        self.flag = flag

    @property
    def requested(self) -> bool:
        from jax.experimental import multihost_utils

        return bool(np.any(multihost_utils.process_allgather(np.int32(self.flag.requested))))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.flag, name)


def agreed(flag: Any) -> Any:
    """`flag`, read the same by every process where there are several."""
    import jax

    return AgreedFlag(flag) if jax.process_count() > 1 else flag


class ProcessGroup:
    """Processes of one `jax.distributed` run on this machine, with a coordinator on 127.0.0.1.

    Arguments:
        command: `command(process_id, coordinator_address)` gives the command line of a process.
        processes: how many.
        outputs: per process, a file for its stdout and stderr, or `None` to share this
            process's (default: process 0 shares them, its stdout without gloo's "[Gloo] Rank 0
            is connected" line; the others write to temporary files, shown by `tails`).
        env: their environment (default: this process's).

    The processes run in sessions of their own, so that a Ctrl-C in a terminal reaches them
    once, through `interrupt`, rather than twice.
    """

    def __init__(
        self,
        command: Callable[[int, str], Sequence[str]],
        processes: int,
        *,
        outputs: Sequence[Any] | None = None,
        env: dict[str, str] | None = None,
    ):
        address = f"127.0.0.1:{free_port()}"
        self._temporary = []
        filtered = outputs is None
        if outputs is None:
            self._temporary = [tempfile.TemporaryFile("w+") for _ in range(processes - 1)]
            outputs = [None, *self._temporary]
        self.outputs = list(outputs)
        self.processes: list[subprocess.Popen] = []
        self._forwarding: threading.Thread | None = None
        try:
            for i in range(processes):
                out = self.outputs[i]
                stdout = subprocess.PIPE if filtered and i == 0 else out
                self.processes.append(
                    subprocess.Popen(
                        list(command(i, address)),
                        stdin=subprocess.DEVNULL,
                        stdout=stdout,
                        stderr=subprocess.STDOUT if out is not None else None,
                        env=env,
                        start_new_session=True,
                        text=True,
                    )
                )
                if stdout is subprocess.PIPE:
                    self._forwarding = threading.Thread(target=_forward, args=(self.processes[-1].stdout,), daemon=True)
                    self._forwarding.start()
        except BaseException:
            self.kill()
            raise

    def interrupt(self) -> None:
        """Sends SIGINT to every process still running."""
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)

    def kill(self) -> None:
        """Ends every process still running (SIGKILL) and waits for it."""
        for process in self.processes:
            if process.poll() is None:
                process.kill()
        for process in self.processes:
            process.wait()
        if self._forwarding is not None:
            self._forwarding.join(timeout=5)

    def wait(self, timeout: float | None = None, *, grace: float = GRACE_SECONDS) -> list[int]:
        """Waits for every process; their exit statuses (negative: killed by that signal).

        Once a process fails (a status other than 0 and 130, the status of a Ctrl-C), the
        others get `grace` seconds, then are killed. After `timeout` seconds, all are killed
        and `TimeoutError` is raised. Either way no process is left running.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        failed_at = None
        try:
            while True:
                statuses = [process.poll() for process in self.processes]
                if all(status is not None for status in statuses):
                    return statuses
                now = time.monotonic()
                if failed_at is None and any(status not in (None, 0, 130) for status in statuses):
                    failed_at = now
                if failed_at is not None and now - failed_at >= grace:
                    self.kill()
                    return [process.returncode for process in self.processes]
                if deadline is not None and now >= deadline:
                    self.kill()
                    raise TimeoutError(f"{len(self.processes)} processes did not finish in {timeout} s: {self.tails()}")
                time.sleep(0.05)
        except BaseException:
            self.kill()
            raise

    def tails(self, characters: int = 3000) -> str:
        """The end of what each process with an output file wrote."""
        parts = []
        for i, out in enumerate(self.outputs):
            if out is not None and hasattr(out, "seek"):
                out.flush()
                out.seek(0)
                parts.append(f"--- process {i} ---\n{out.read()[-characters:]}")
        return "\n".join(parts)

    def close(self) -> None:
        self.kill()
        for file in self._temporary:
            file.close()


def _forward(lines: Any) -> None:
    """Copies a process's output to this one's, but for gloo's line on connecting (printed by
    its C++ code, which Python cannot redirect)."""
    for line in lines:
        if not line.startswith("[Gloo] Rank"):
            sys.stdout.write(line)
            sys.stdout.flush()


def launch(module: str, argv: Sequence[str], processes: int, timeout: float | None = None) -> int:
    """Runs `python -m module *argv` as `processes` processes of one run on this machine; the exit
    status of process 0 (which alone prints). A Ctrl-C here reaches each process once; a second
    one, once more (each ends at once)."""
    group = ProcessGroup(
        lambda i, address: [
            sys.executable, "-m", module, *argv,
            "--processes", str(processes), "--process-id", str(i), "--coordinator", address,
        ],
        processes,
    )
    handlers = {}
    if _main_thread():
        handlers[signal.SIGINT] = signal.signal(signal.SIGINT, lambda *_: group.interrupt())
        handlers[signal.SIGTERM] = signal.signal(signal.SIGTERM, _terminated)  # ends the processes too
    try:
        statuses = group.wait(timeout)
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
        tails = group.tails()
        group.close()
    if any(status != statuses[0] for status in statuses[1:]):
        print(f"the processes ended with statuses {statuses}; the others' output:\n{tails}", file=sys.stderr)
        if statuses[0] == 0:
            return 1
    return statuses[0] if statuses[0] >= 0 else 128 - statuses[0]


def _terminated(*_: Any) -> None:
    raise SystemExit(128 + signal.SIGTERM)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN


def quiet_unless_first(process_id: int) -> Any:
    """A context in which the stdout of every process but 0 is discarded (process 0 prints)."""
    import contextlib

    if process_id == 0:
        return contextlib.nullcontext()
    return contextlib.redirect_stdout(open(os.devnull, "w"))  # noqa: SIM115 - closed with the process
