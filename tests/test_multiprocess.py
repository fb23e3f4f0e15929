"""Multi-process training, the way TPU pods run: one `jax.distributed` run of 2 local processes.

Each process has 2 CPU devices and gloo collectives; the global mesh ("data", "model") of shape
(2, 2) has "data" across the processes. The work is in `multiprocess_worker.py`. Two launches
of the pair share every check (each launch costs two JAX start-ups):

1. `train`: sharded and ZeRO-1 steps against the unsharded step; a straight run written out
   as the reference; the same run saving every step with `CheckpointManager` from both
   processes (one writer lock, held by process 0, refreshed by its heartbeat; a second
   manager refused in both processes); process 1 killed while saving step 4.
2. `resume`: a restart of both, as a pod restarts every host: restores step 3 (bit-exact, on
   two layouts), takes the dead run's lock over, trains to step 6: bit-exact on the straight run.

Between the two, this process restores the checkpoint alone, on one device; after them, it runs
the example of docs/api/pods.md, which resumes what the example saved in the `resume` launch. Every wait has a
timeout, after which every process of the pair is killed and the test fails with their output.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="gloo collectives and SIGKILL are POSIX")

WORKER = os.path.join(os.path.dirname(__file__), "multiprocess_worker.py")
TIMEOUT = 240  # seconds for one launch of the pair (about 30 on an idle 2-core machine)


def worker_env(cache=None) -> dict[str, str]:
    """The workers choose their device count (a forced count from outside would contradict it);
    `cache`: a persistent compilation cache (the second launch compiles what the first did).
    LLVM's optimizations off: every comparison is between programs compiled by the workers, all
    with these flags (the restore in this process compares saved arrays only)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    if cache is not None:
        env.update(
            JAX_COMPILATION_CACHE_DIR=str(cache),
            JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
            JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        )
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    env["XLA_FLAGS"] = " ".join([*flags, "--xla_backend_optimization_level=0"])
    return env


def launch(case: str, directory, *, grace: float) -> tuple[list[int], list[str]]:
    """Runs `case` in 2 worker processes: their exit statuses and outputs."""
    from modopt.examples._processes import ProcessGroup

    logs = [open(directory / f"{case}_{i}.log", "w+") for i in range(2)]  # noqa: SIM115 - closed below
    group = ProcessGroup(
        lambda i, address: [sys.executable, WORKER, case, str(i), "2", address, str(directory)],
        2,
        outputs=logs,
        env=worker_env(directory / "jax_cache"),
    )
    try:
        statuses = group.wait(TIMEOUT, grace=grace)
    except TimeoutError as error:
        pytest.fail(f"`{case}` (2 processes): {error}")
    finally:
        group.close()
        outputs = []
        for log in logs:
            log.seek(0)
            outputs.append(log.read())
            log.close()
    return statuses, outputs


def shown(outputs: list[str]) -> str:
    return "\n".join(f"--- process {i} ---\n{out[-4000:]}" for i, out in enumerate(outputs))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Both launches and the restore in this process; what each printed (or the failure)."""
    from multiprocess_worker import KILLED_AT

    directory = tmp_path_factory.mktemp("multiprocess")
    checkpoints = directory / "checkpoints"
    results = {"directory": directory}

    statuses, outputs = launch("train", directory, grace=1.0)
    results["train"] = outputs
    # Process 1 kills itself (SIGKILL) in the middle of saving; process 0, waiting for it in
    # Orbax's commit barrier, is then killed as a pod's scheduler would.
    assert statuses[1] == -9 and "killed while saving step 4" in outputs[1], f"{statuses}\n{shown(outputs)}"
    results["after kill"] = sorted(os.listdir(checkpoints))
    results["restored here"] = restore_in_this_process(checkpoints, KILLED_AT - 1, directory)

    statuses, outputs = launch("resume", directory, grace=5.0)
    results["resume"] = outputs
    assert statuses == [0, 0], f"{statuses}\n{shown(outputs)}"
    results["pod here"] = pod_example_in_this_process(directory / "pod")
    yield results
    shutil.rmtree(directory, ignore_errors=True)


def restore_in_this_process(checkpoints, step: int, directory) -> str:
    """The step saved by 2 processes on 4 devices, ZeRO-1, restored by 1 process on 1 device."""
    import jax
    from multiprocess_worker import make_params, make_tx, reference

    import modopt
    from modopt.integrations.orbax import CheckpointManager

    params = jax.tree.map(jax.numpy.asarray, make_params())
    with CheckpointManager(checkpoints) as manager:
        restored = manager.restore(step, params=params, optimizer=modopt.Optimizer(make_tx(), params))
    leaves = [np.asarray(x) for x in jax.tree.leaves((restored["params"], restored["optimizer"]))]
    expected = reference(step, str(directory))
    assert len(leaves) == len(expected)
    for i, (a, b) in enumerate(zip(leaves, expected)):
        assert a.dtype == b.dtype and np.array_equal(a, b), f"leaf {i} of step {step} restored in 1 process differs"
    return f"ok step {step} restored in 1 process, bit-exact"


def pod_example_in_this_process(directory) -> tuple[dict, str]:
    """The pods page's example, run again as `pod.py 0 1`: it resumes the checkpoint its run in
    2 processes saved; its variables and output."""
    from multiprocess_worker import run_pod_example

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        namespace = run_pod_example(str(directory))
    return namespace, out.getvalue()


def lines(outputs: list[str], what: str) -> list[str]:
    """The `ok` lines starting with `what`, one per process."""
    return [line for out in outputs for line in out.splitlines() if line.startswith(f"ok {what}")]


def test_sharded_step_over_two_processes_equals_unsharded(run):
    """The step on a mesh spanning 2 processes equals the step on one device (float tolerance)."""
    assert len(lines(run["train"], "sharded step equals the unsharded step")) == 2, shown(run["train"])


def test_zero1_state_split_across_processes(run):
    """ZeRO-1 over the axis that spans the processes: each holds about half the moments; same steps."""
    assert len(lines(run["train"], "zero1 step equals the unsharded step")) == 2, shown(run["train"])


def test_writer_lock_and_heartbeat_with_two_processes(run):
    """Both processes save through one lock of process 0's, refreshed; a second manager's save
    raises in both processes (a process going on alone would wait for the other forever)."""
    assert len(lines(run["train"], "one writer lock, held by process 0")) == 2, shown(run["train"])
    assert len(lines(run["train"], "a second manager's save is refused in every process")) == 2, shown(run["train"])


def test_save_killed_in_one_process_keeps_the_previous_step(run):
    """Process 1 killed mid-save: steps 1 to 3 complete, step 4 never committed, the lock left behind."""
    assert len(lines(run["train"], "steps [1, 2, 3] saved")) == 2, shown(run["train"])
    assert [name for name in run["after kill"] if name.isdigit()] == ["1", "2", "3"], run["after kill"]
    assert "modopt-writer.lock" in run["after kill"]
    assert any(re.fullmatch(r"4\.orbax-checkpoint-tmp.*", name) for name in run["after kill"]), run["after kill"]


def test_restore_in_one_process(run):
    assert run["restored here"] == "ok step 3 restored in 1 process, bit-exact"


def test_restart_in_two_processes_resumes_bit_exact(run):
    """Restored in 2 processes (onto ZeRO-1 and plain layouts), the lock taken over from the dead
    run, trained on: the straight run's parameters and optimizer, bit for bit."""
    assert len(lines(run["resume"], "step 3 restored in 2 processes, bit-exact")) == 2, shown(run["resume"])
    assert len(lines(run["resume"], "resumed at step 3, the lock taken over")) == 2, shown(run["resume"])


def test_pods_page_example_in_two_processes_then_one(run):
    """The example of docs/api/pods.md trains 10 steps in 2 processes and saves; run again in one
    process, it resumes from that checkpoint: 10 steps more, a lower loss."""
    assert len(lines(run["resume"], "the pods page's example trains and saves in 2 processes")) == 2, shown(run["resume"])
    first = re.search(r"^step 10: loss ([0-9.]+)$", run["resume"][0], re.MULTILINE)
    namespace, out = run["pod here"]
    second = re.search(r"^step 20: loss ([0-9.]+)$", out, re.MULTILINE)
    assert first and second, (run["resume"][0][-2000:], out)
    assert int(namespace["optimizer"].count) == 20
    assert float(second.group(1)) < float(first.group(1))


def test_matrix_optimizers_on_owners_across_two_processes(tmp_path):
    """The Muon family, Shampoo, SOAP, Kron and GaLore on the (2, 2) mesh spanning 2 processes, with their
    per-matrix work on owner devices (with and without ZeRO-1 over the processes' axis): the
    unsharded steps, within the registry's tolerances."""
    from multiprocess_worker import MATRIX_OPTIMIZERS

    statuses, outputs = launch("owners", tmp_path, grace=5.0)
    assert statuses == [0, 0], f"{statuses}\n{shown(outputs)}"
    for name in MATRIX_OPTIMIZERS:
        assert len(lines(outputs, f"owners: {name} on 2 processes")) == 2, shown(outputs)


def test_main_job_in_two_processes_ends_as_in_one(tmp_path, monkeypatch):
    """`digits --processes 2` (data-parallel, each process one CPU device, half of each batch)
    ends as the run in one process: the same epoch lines, and final weights within 1e-6.

    Only the order of a sum differs: each process sums the gradient over its 32 rows and the
    all-reduce adds the two halves, where one process sums 64 rows. That changes a gradient by
    about one float32 rounding (1e-7 relative) per step; over 66 steps of Adam with learning
    rates <= 3e-3 the weights (|w| < 0.3) drift apart by ~5e-8 (measured), far below 1e-6, and
    the 4-digit losses and the accuracies printed do not move."""
    from modopt.examples import _processes, digits

    args = ["--epochs", "3", "--seed", "1"]
    out, two_out, two_err = io.StringIO(), io.StringIO(), io.StringIO()
    # Nothing here looks at the plot; the run in 2 processes still draws it (process 0).
    monkeypatch.setattr(digits, "plot_history", lambda history, path: None)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        status = digits.main([*args, "--checkpoint-dir", str(tmp_path / "one")])
    # What `digits --processes 2` does, from this process (no third JAX start-up), with a timeout.
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    with contextlib.redirect_stdout(two_out), contextlib.redirect_stderr(two_err):
        try:
            two_status = _processes.launch("modopt.examples.digits", [*args, "--checkpoint-dir", str(tmp_path / "two")], 2, TIMEOUT)
        except TimeoutError as error:
            pytest.fail(f"digits --processes 2: {error}")
    two_out = two_out.getvalue()
    assert two_status == status == 0, f"{two_status}, {status}\n{two_out}\n{two_err.getvalue()}"

    def epochs(text):
        return [line for line in text.splitlines() if line.startswith("epoch")]

    assert len(epochs(out.getvalue())) == 3 and epochs(two_out) == epochs(out.getvalue()), f"{out.getvalue()}\n{two_out}"
    assert "[Gloo]" not in two_out
    accuracy = re.compile(r"^test accuracy ([0-9.]+)%", re.MULTILINE)
    assert accuracy.search(two_out).group(1) == accuracy.search(out.getvalue()).group(1)
    weights = [final_weights(tmp_path / name) for name in ("one", "two")]
    for a, b in zip(*weights):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def final_weights(directory) -> list[np.ndarray]:
    """The model of the latest checkpoint (saved by 1 or by 2 processes), restored here."""
    import equinox as eqx
    import jax

    from modopt.examples import digits
    from modopt.integrations.orbax import CheckpointManager

    model, _ = digits._model_and_optimizer(1, 66)
    with CheckpointManager(directory) as manager:
        model = manager.restore(model=model)["model"]
    return [np.asarray(x) for x in jax.tree.leaves(eqx.filter(model, eqx.is_array))]
