"""The transformer job (`python -m modopt.examples.lm`) and its time-to-result benchmark.

The job runs at its `micro` size (one block of width 32) for a few steps, in subprocesses: one
device, a 2 x 4 mesh (tensor parallelism with ZeRO-1, and FSDP) and 2 processes must give the
one-device losses and weights; an interrupted run (SIGINT through the job's test hook, SIGTERM
from here) must resume to the straight run's weights bit for bit; another run's settings and a
missed target are refused with their exit statuses. The benchmark's smoke run trains every
optimizer of the job a few steps and checks optax's runs coincide with modopt's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import equinox as eqx
import jax
import numpy as np
import pytest

from modopt.examples import _interrupts
from testing_signals import sigint_handled_in_children
from modopt.examples.lm import corpus, job
from modopt.examples.lm.model import make_model

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="signals to a process are POSIX")

STEPS, EVERY = 8, 4
ARGS = ["--size", "micro", "--steps", str(STEPS), "--eval-every", str(EVERY), "--target", "10"]
TIMEOUT = 300


# The job's processes share a persistent compilation cache: the interrupted, resumed and
# refused runs compile the one-device run's programs again otherwise.
CACHE = {}


@pytest.fixture(scope="module", autouse=True)
def compilation_cache(tmp_path_factory):
    CACHE["dir"] = str(tmp_path_factory.mktemp("jax_cache"))
    yield
    CACHE.clear()


def start(directory, *extra, hook="", wait=True):
    command = [sys.executable, "-m", "modopt.examples.lm", *ARGS, "--checkpoint-dir", str(directory), *extra]
    env = {**os.environ, _interrupts.TEST_HOOK: hook, "JAX_PLATFORMS": "cpu"}
    if "dir" in CACHE:
        env.update(
            JAX_COMPILATION_CACHE_DIR=CACHE["dir"],
            JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
            JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        )
    with sigint_handled_in_children():  # the job handles SIGINT and SIGTERM, however the tests were launched
        if not wait:
            return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, env=env)
    return done.returncode, done.stdout, done.stderr


def saved(directory, *extra):
    """The latest checkpoint's model (as NumPy arrays) and run record."""
    from modopt.integrations.orbax import CheckpointManager

    args = job.parse_args([*ARGS, *extra])
    model = make_model(corpus.load().vocab_size, "micro", args.seed)
    with CheckpointManager(directory) as checkpoints:
        restored = checkpoints.restore(model=model, run=job._new_run(args))
    arrays = [np.asarray(x, np.float32) for x in jax.tree.leaves(eqx.filter(restored["model"], eqx.is_array))]
    return arrays, jax.tree.map(np.asarray, restored["run"])


def assert_same_run(ours, reference):
    """The same validation losses and weights up to float32 rounding of another summation order
    (sharded matrix products, the gradient's sum over devices), which 8 steps of AdamW at
    learning rates <= 3e-3 keep far below 1e-5."""
    (weights, run), (reference_weights, reference_run) = saved(ours), saved(reference)
    np.testing.assert_allclose(run["history"]["validation_loss"], reference_run["history"]["validation_loss"], rtol=1e-5)
    for a, b in zip(weights, reference_weights):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    directory = tmp_path_factory.mktemp("lm") / "straight"
    status, out, err = start(directory)
    assert status == 0, f"{out}\n{err}"
    return directory, out


def test_one_device_run_trains_records_and_plots(straight):
    directory, out = straight
    weights, run = saved(directory)
    history = run["history"]
    assert int(run["step"]) == STEPS and list(history["step"]) == [EVERY, STEPS]
    # Bits per character start near log2(65) = 6.0 for a uniform guess and fall.
    assert history["validation_loss"][-1] < history["validation_loss"][0] < np.log(65) + 0.1
    assert (directory / job.PLOT).exists()
    assert "bits per character after 8 steps" in out


@pytest.mark.parametrize("layout", [["--mesh", "2x4", "--zero"], ["--mesh", "2x4", "--layout", "fsdp"]], ids=["tp+zero1", "fsdp"])
def test_a_mesh_gives_the_one_device_run(straight, tmp_path, layout):
    status, out, err = start(tmp_path / "mesh", *layout)
    assert status == 0, f"{out}\n{err}"
    assert_same_run(tmp_path / "mesh", straight[0])


def test_two_processes_give_the_one_device_run(straight, tmp_path):
    status, out, err = start(tmp_path / "two", "--processes", "2", "--mesh", "2x2", "--zero")
    assert status == 0, f"{out}\n{err}"
    assert_same_run(tmp_path / "two", straight[0])


def test_sigint_mid_run_saves_and_the_rerun_ends_bit_for_bit(straight, tmp_path):
    status, out, err = start(tmp_path / "cut", hook="mid-interval")
    assert status == 130, f"{out}\n{err}"
    assert "saved; the same command resumes from there" in err
    status, out, err = start(tmp_path / "cut")
    assert status == 0 and "resuming at step" in out, f"{out}\n{err}"
    (one, one_run), (ours, our_run) = saved(straight[0]), saved(tmp_path / "cut")
    for a, b in zip(ours, one):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(our_run["history"]["train_loss"], one_run["history"]["train_loss"])


def test_sigterm_saves_like_ctrl_c_and_exits_143(tmp_path):
    process = start(tmp_path / "term", hook="mid-interval:parent", wait=False)
    try:
        line = process.stderr.readline()
        assert "waiting for SIGINT at mid-interval" in line, line
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=TIMEOUT)
    finally:
        process.kill()
    assert process.returncode == 143, f"{out}\n{err}"
    assert "saved; the same command resumes from there" in err
    _, run = saved(tmp_path / "term")
    assert 0 < int(run["step"]) < STEPS


def test_other_settings_and_a_missed_target_are_refused(straight):
    directory, _ = straight
    status, _, err = start(directory, "--optimizer", "muon")
    assert status == 2 and "--optimizer adamw there, muon now" in err, err
    status, out, err = start(directory, "--target", "0.5")  # the finished run, judged again
    assert status == 1 and "complete" in out and "above the target 0.5" in err, f"{out}\n{err}"


def test_time_to_result_smoke_run_trains_every_optimizer_and_optax_coincides(tmp_path):
    """In a process of its own, with a time limit: a program that never finishes (a deadlock
    in XLA's CPU runtime, as batched LAPACK calls inside the run's nested scans once did) fails
    this test instead of stopping the suite."""
    import json

    benchmark = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "time_to_result.py")
    command = [sys.executable, benchmark, "--size", "micro", "--steps", "4", "--eval-every", "2", "--smoke", "--out", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    report = json.loads((tmp_path / "time_to_result.json").read_text())
    sys.path.insert(0, os.path.dirname(benchmark))
    try:
        import time_to_result
    finally:
        sys.path.pop(0)
    results = report["results"]
    expected = set(time_to_result.OPTIMIZERS) | set(time_to_result.VARIANTS) | {f"{n} (optax)" for n in time_to_result.OPTAX}
    assert set(results) == expected
    for label, row in results.items():
        curve = row["runs"][0]["curve"]
        assert len(curve) == 2 and np.all(np.isfinite(curve)), (label, curve)
    for name in time_to_result.OPTAX:
        assert results[f"{name} (optax)"]["largest difference from modopt (bits)"] <= 1e-5, name
    assert (tmp_path / "time_to_result.txt").exists() and (tmp_path / "time_to_result.png").exists()
