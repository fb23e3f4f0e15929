"""Checkpoints with `modopt.integrations.orbax`: round trips, bit-exact resume, bad cases.

Resuming across meshes (8 devices to 4 and 1) is in `test_sharded.py`.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import pages
from modopt.integrations.orbax import CheckpointError, CheckpointManager

import modopt


def make_model():
    return eqx.nn.MLP(8, 3, 16, 1, key=jax.random.key(0))


def make_params():
    """A matrix Adafactor factors (both dims >= 128), a vector and a scalar."""
    keys = jax.random.split(jax.random.key(0), 3)
    return {
        "big": jax.random.normal(keys[0], (128, 136)),
        "vector": jax.random.normal(keys[1], (5,)),
        "scalar": jax.random.normal(keys[2], ()),
    }


def grads_at(step, params):
    keys = jax.random.split(jax.random.fold_in(jax.random.key(1), step), len(params))
    return {name: jax.random.normal(k, p.shape, p.dtype) for k, (name, p) in zip(keys, sorted(params.items()))}


def bitwise_equal(a, b):
    """Same structure, and every array leaf equal bit for bit (dtype included)."""
    if jax.tree.structure(a) != jax.tree.structure(b):
        return False
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        if eqx.is_array(x) or eqx.is_array(y):
            x, y = np.asarray(x), np.asarray(y)
            if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
                return False
        elif x != y:
            return False
    return True


OPTIMIZERS = {
    "adam": lambda: modopt.adam(1e-2),
    "sgd_momentum": lambda: modopt.sgd(1e-2, momentum=0.9),
    "adafactor": lambda: modopt.adafactor(1e-2),
    "chain_schedule_clip": lambda: modopt.chain(
        modopt.clip_by_global_norm(1.0),
        modopt.adamw(modopt.warmup_cosine_decay_schedule(0.0, 1e-2, 2, 10), weight_decay=1e-3),
    ),
}


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_resume_is_bit_exact(name, tmp_path):
    """N steps straight equal k steps, save, restore into fresh objects, N - k steps."""
    total, k = 6, 3
    step = jax.jit(lambda p, o, g: o.step(p, g))

    params, optimizer = make_params(), modopt.Optimizer(OPTIMIZERS[name](), make_params())
    straight = None
    for i in range(total):
        params, optimizer = step(params, optimizer, grads_at(i, params))
        if i == k - 1:
            with CheckpointManager(tmp_path) as manager:
                manager.save(k, params=params, optimizer=optimizer)
    straight = (params, optimizer)

    fresh_params = jax.tree.map(jnp.zeros_like, make_params())
    fresh = modopt.Optimizer(OPTIMIZERS[name](), fresh_params)
    with CheckpointManager(tmp_path) as manager:
        assert manager.latest_step() == k
        restored = manager.restore(params=fresh_params, optimizer=fresh)
    params, optimizer = restored["params"], restored["optimizer"]
    for i in range(k, total):
        params, optimizer = step(params, optimizer, grads_at(i, params))
    assert bitwise_equal((params, optimizer), straight)


def test_round_trip_of_models_states_and_extra_pytrees(tmp_path):
    from flax.training import train_state

    model = make_model()  # non-array leaves: activation functions, static fields
    optimizer = modopt.Optimizer(modopt.adamw(3e-3), model)
    state = train_state.TrainState.create(apply_fn=None, params=make_params(), tx=modopt.sgd(0.1, momentum=0.9))
    extra = {
        "key": jax.random.key(7),
        "loader_position": 1234,
        "best_loss": 0.25,
        "empty": jnp.zeros((0, 4)),
        "histogram": np.arange(6, dtype=np.int64),
        "bf16": jnp.ones((3,), jnp.bfloat16),
    }
    with CheckpointManager(tmp_path, max_to_keep=2) as manager:
        assert manager.save(1, model=model, optimizer=optimizer, state=state, extra=extra)
        manager.wait_until_finished()
        restored = manager.restore(model=model, optimizer=optimizer, state=state, extra=extra)
        only_extra = manager.restore(extra=extra)  # a subset of the items: the others are not read
    assert only_extra.keys() == {"extra"} and only_extra["extra"]["loader_position"] == 1234
    assert bitwise_equal(restored["model"], model)
    assert bitwise_equal(restored["optimizer"], optimizer)
    assert bitwise_equal(restored["state"].params, state.params)
    assert bitwise_equal(restored["state"].opt_state, state.opt_state)
    out = restored["extra"]
    assert jax.random.key_impl(out["key"]) == jax.random.key_impl(extra["key"])
    assert np.array_equal(jax.random.key_data(out["key"]), jax.random.key_data(extra["key"]))
    assert out["loader_position"] == 1234 and type(out["loader_position"]) is int
    assert out["best_loss"] == 0.25
    assert out["empty"].shape == (0, 4) and out["empty"].dtype == jnp.float32
    assert isinstance(out["histogram"], np.ndarray) and np.array_equal(out["histogram"], extra["histogram"])
    assert out["bf16"].dtype == jnp.bfloat16
    # Hyperparameters stay weakly typed, so bf16 updates stay bf16 and nothing retraces.
    assert restored["optimizer"].tx.learning_rate.weak_type


def test_abstract_targets(tmp_path):
    params = make_params()
    optimizer = modopt.Optimizer(modopt.adam(1e-3), params)
    with CheckpointManager(tmp_path) as manager:
        manager.save(0, params=params, optimizer=optimizer)
    abstract_params = jax.eval_shape(make_params)
    abstract_optimizer = eqx.filter_eval_shape(modopt.Optimizer, modopt.adam(1e-3), abstract_params)
    with CheckpointManager(tmp_path) as manager:
        restored = manager.restore(params=abstract_params, optimizer=abstract_optimizer)
    assert bitwise_equal(restored["params"], params)
    assert bitwise_equal(restored["optimizer"], optimizer)


def test_record_is_readable(tmp_path):
    import json

    optimizer = modopt.Optimizer(modopt.adam(1e-3, b1=0.8), make_params())
    with CheckpointManager(tmp_path) as manager:
        manager.save(12, optimizer=optimizer)
    record = json.loads((tmp_path / "12" / "modopt" / "metadata").read_text())
    assert record["modopt_version"] == modopt.__version__ and record["step"] == 12
    summary = record["items"]["optimizer"]["summary"]
    assert summary["transform"].startswith("Adam(learning_rate=0.001, b1=0.8")
    assert summary["hyperparameters"]["b1"] == 0.8
    leaves = {leaf["path"]: leaf for leaf in record["items"]["optimizer"]["leaves"]}
    mu = leaves[".state[0].mu['big']"]
    assert mu["shape"] == [128, 136] and mu["dtype"] == "float32" and len(mu["checksum"]) == 16


def test_steps_interval_max_to_keep_and_relative_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    params = make_params()
    with CheckpointManager("runs/ckpt", max_to_keep=2, save_interval_steps=2) as manager:
        written = [manager.save(step, params=params) for step in range(7)]
        manager.wait_until_finished()
        assert written == [True, False, True, False, True, False, True]
        assert manager.all_steps() == [4, 6] and manager.latest_step() == 6
    monkeypatch.chdir(os.path.dirname(tmp_path))  # the directory was fixed at construction
    with CheckpointManager(tmp_path / "runs" / "ckpt") as manager:
        assert bitwise_equal(manager.restore(params=params)["params"], params)


def test_numpy_data_python_numbers_and_strings_round_trip_exactly(tmp_path):
    """NumPy data keeps its dtype and type, 64-bit too while JAX's 64-bit types are off (an
    `np.int64(2**40)` data-loader position once came back as `Array(0, int32)`); Python ints of
    any size, floats (NaN and infinities too), strings and lists of strings come back as saved."""
    assert not jax.config.jax_enable_x64
    loader = {
        "position": np.int64(2**40 + 3),
        "seed": np.uint64(2**64 - 1),
        "rate": np.float64(0.1),
        "flag": np.bool_(True),
        "order": np.array([2**40, -(2**62), 7], np.int64),
        "weights": np.array([0.1, 1e-300]),
        "none_yet": np.zeros((0, 2), np.int64),
        "count": 2**70,
        "loss": float("nan"),
        "best": float("-inf"),
        "name": "run-1",
        "files": ["a.tfrecord", "b.tfrecord"],
    }
    zeros = {
        "position": np.int64(0),
        "seed": np.uint64(0),
        "rate": np.float64(0),
        "flag": np.bool_(False),
        "order": np.zeros(3, np.int64),
        "weights": np.zeros(2),
        "none_yet": np.zeros((0, 2), np.int64),
        "count": 0,
        "loss": 0.0,
        "best": 0.0,
        "name": "",
        "files": ["", ""],
    }
    with CheckpointManager(tmp_path) as manager:
        manager.save(1, loader=loader, on_device={"x": jnp.arange(6.0)}, on_host={"x": np.arange(6.0, dtype=np.float32)})
        manager.wait_until_finished()
        restored = manager.restore(loader=zeros)["loader"]
        other = manager.restore(
            loader={**zeros, "position": 0, "rate": 0.0, "order": jax.ShapeDtypeStruct((3,), np.int64)},
            on_device={"x": np.zeros(6, np.float32)},  # device data read into NumPy, host data onto a device
            on_host={"x": jnp.zeros(6)},
        )
    for name, value in loader.items():
        assert type(restored[name]) is type(value), name
        if isinstance(value, np.ndarray):
            assert restored[name].dtype == value.dtype and np.array_equal(restored[name], value), name
        elif name != "loss":
            assert restored[name] == value, name
    assert math.isnan(restored["loss"])
    # Into a Python number, 64-bit NumPy data that JAX cannot hold is a Python number, exact.
    assert other["loader"]["position"] == 2**40 + 3 and type(other["loader"]["position"]) is int
    assert other["loader"]["rate"] == 0.1 and type(other["loader"]["rate"]) is float
    # An abstract target of such a dtype is read as NumPy.
    assert isinstance(other["loader"]["order"], np.ndarray) and np.array_equal(other["loader"]["order"], loader["order"])
    assert isinstance(other["on_device"]["x"], np.ndarray) and np.array_equal(other["on_device"]["x"], np.arange(6.0))
    assert isinstance(other["on_host"]["x"], jax.Array) and np.array_equal(other["on_host"]["x"], np.arange(6.0))


def test_code_in_a_model_comes_from_the_target(tmp_path):
    """A function in a field of a module (an activation) is code: not written, taken from the
    target, as Equinox's serialisation does."""
    model = make_model()
    other = eqx.nn.MLP(8, 3, 16, 1, activation=jax.nn.tanh, key=jax.random.key(1))
    with CheckpointManager(tmp_path) as manager:
        manager.save(1, model=model)
        restored = manager.restore(model=other)["model"]
    assert restored.activation is other.activation is not model.activation
    assert bitwise_equal(eqx.filter(restored, eqx.is_array), eqx.filter(model, eqx.is_array))


# ---- bad cases -----------------------------------------------------------------------------


def test_restoring_into_another_optimizer_or_model_names_the_path(tmp_path):
    model = make_model()
    with CheckpointManager(tmp_path) as manager:
        manager.save(3, model=model, optimizer=modopt.Optimizer(modopt.adam(1e-3), model))
        sgd = modopt.Optimizer(modopt.sgd(1e-3, momentum=0.9), model)
        with pytest.raises(CheckpointError) as error:
            manager.restore(optimizer=sgd)
        message = str(error.value)
        # A summary first (leaves paired by path, never by position), then the paths that differ.
        assert (
            "Cannot restore 'optimizer' from step 3 into this Optimizer: the checkpoint holds 17 leaves, the target 7 "
            "(by top-level part: .tx 7 against 2, .state 9 against 4); it holds an Optimizer of Adam, the target is an "
            "Optimizer of Sgd. Only in the checkpoint: .tx.b1.value, .tx.b1.complement, .tx.b2.value and 12 more; only "
            "in the target: .tx.momentum, .state[0].trace.layers[0].weight"
        ) in message
        assert "The checkpoint holds: Optimizer of Adam(learning_rate=0.001" in message
        assert "Nothing was restored." in message

        wider = eqx.nn.MLP(8, 3, 32, 1, key=jax.random.key(0))
        expected = (
            "Cannot restore 'model' from step 3 into this MLP: the checkpoint and the target have the same 6 leaves by "
            "path, 3 of them different: at .layers[0].weight the checkpoint has an array of shape (16, 8) and dtype "
            "float32, the target an array of shape (32, 8) and dtype float32; at .layers[0].bias"
        )
        with pytest.raises(CheckpointError, match=re.escape(expected)):
            manager.restore(model=wider)
        with pytest.raises(CheckpointError, match=re.escape("Step 3 has no item 'params'; it holds ['model', 'optimizer'].")):
            manager.restore(params=make_params())
        with pytest.raises(FileNotFoundError, match=re.escape("No checkpoint of step 4")):
            manager.restore(4, model=model)


def test_a_step_is_saved_once_and_in_increasing_order_unless_overwritten(tmp_path):
    ones, zeros = {"w": jnp.ones(3)}, {"w": jnp.zeros(3)}
    with CheckpointManager(tmp_path) as manager:
        assert manager.save(jnp.asarray(3), params=ones)  # an integer scalar array (a step count) is a step
        expected = f"save: step 3 already exists in {tmp_path}. Save under a later step, or pass overwrite=True to replace it."
        with pytest.raises(CheckpointError, match=re.escape(expected)):
            manager.save(3, params=zeros)  # while step 3 may still be being written
        assert manager.save(np.int64(5), params=ones)
        expected = (
            f"save: step 4 is before the latest step 5 in {tmp_path} (steps are saved in increasing order). Save under "
            "a later step, or pass overwrite=True to go back to step 4, deleting the steps [5]. Nothing was saved."
        )
        with pytest.raises(CheckpointError, match=re.escape(expected)):
            manager.save(4, params=zeros)
        manager.wait_until_finished()
        assert manager.all_steps() == [3, 5]
        assert float(manager.restore(3, params=zeros)["params"]["w"][0]) == 1.0  # the first data, kept
        assert manager.save(3, overwrite=True, params=zeros)  # goes back to step 3: step 5 is deleted
        manager.wait_until_finished()
        assert manager.all_steps() == [3]
        assert float(manager.restore(3, params=ones)["params"]["w"][0]) == 0.0
    # A save after `close()` once hung for minutes in Orbax's threads.
    with pytest.raises(ValueError, match=re.escape(f"save: this CheckpointManager of {tmp_path} is closed; make a new one")):
        manager.save(4, params=ones)
    assert manager.all_steps() == [3] and not (tmp_path / "modopt-writer.lock").exists()


# ---- one writer per directory ----------------------------------------------------------------


SMALL = {"w": jnp.arange(4.0)}


def test_one_writer_per_directory_and_any_number_of_readers(tmp_path):
    """Two managers saving into one directory once left a step that could not be read, and a
    manager opened to read deleted the files of a save in flight."""
    lock = tmp_path / "modopt-writer.lock"
    big = {"w": jnp.ones((2048, 1024))}
    writer = CheckpointManager(tmp_path)
    writer.save(1, params=big)  # written in the background
    reader = CheckpointManager(tmp_path)
    writer.wait_until_finished()
    assert reader.all_steps() == [1]  # readers see the writer's steps as they appear
    assert float(reader.restore(params=big)["params"]["w"][-1, -1]) == 1.0
    second = CheckpointManager(tmp_path)
    expected = (
        f"save: another CheckpointManager of this process writes to {tmp_path} (it holds {lock}). Two writers on one "
        "directory corrupt each other's steps: save through that manager, or close() it first. Nothing was saved."
    )
    with pytest.raises(CheckpointError, match=re.escape(expected)):
        second.save(2, params=SMALL)
    assert writer.save(2, params=SMALL)
    writer.close()
    assert not lock.exists()
    assert second.save(3, params=SMALL)  # the directory is free once its writer is closed
    second.close()
    reader.close()
    with CheckpointManager(tmp_path) as manager:
        assert manager.all_steps() == [1, 2, 3]
        assert bitwise_equal(manager.restore(params=SMALL)["params"], SMALL)


def write_lock(directory, *, host, pid, age=0.0):
    """A lock file as another manager leaves it, last refreshed `age` seconds ago."""
    path = directory / "modopt-writer.lock"
    path.write_text(json.dumps({"host": host, "pid": pid, "since": "2026-01-01T00:00:00+00:00", "token": "theirs"}))
    os.utime(path, (time.time() - age, time.time() - age))
    return path


def ended_process() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


@pytest.mark.parametrize("holder", ["running here", "ended here", "elsewhere", "elsewhere, silent for 2 min"])
def test_a_lock_of_another_process_refuses_the_save_unless_abandoned(tmp_path, holder):
    import socket

    here = socket.gethostname()
    host, pid, age = {
        "running here": (here, os.getppid(), 0.0),
        "ended here": (here, ended_process(), 0.0),
        "elsewhere": ("another-host", 4321, 5.0),
        "elsewhere, silent for 2 min": ("another-host", 4321, 120.0),
    }[holder]
    path = write_lock(tmp_path, host=host, pid=pid, age=age)
    with CheckpointManager(tmp_path) as manager:
        if holder in ("running here", "elsewhere"):
            expected = (
                f"save: another process writes to {tmp_path}: the lock {path} is held by process {pid} on host {host!r} "
                f"since 2026-01-01T00:00:00+00:00 (refreshed {age:.0f} s ago). Two writers on one directory corrupt "
                "each other's steps, so this manager does not write there"
            )
            with pytest.raises(CheckpointError, match=re.escape(expected)) as error:
                manager.save(1, params=SMALL)
            assert f"if you know that no process writes there, delete {path}. Nothing was saved." in str(error.value)
            assert manager.all_steps() == [] and json.loads(path.read_text())["token"] == "theirs"
        else:
            assert manager.save(1, params=SMALL)  # the abandoned lock is taken over
            assert json.loads(path.read_text())["pid"] == os.getpid()
    assert path.exists() == (holder in ("running here", "elsewhere"))


def test_the_writer_refreshes_its_lock_and_stops_when_another_takes_it(tmp_path):
    from modopt.integrations import _lock

    path = tmp_path / "modopt-writer.lock"
    manager = CheckpointManager(tmp_path)
    manager.save(1, params=SMALL)
    os.utime(path, (time.time() - 50, time.time() - 50))
    _lock.refresh()  # what the heartbeat thread does every few seconds
    assert time.time() - path.stat().st_mtime < 5
    path.unlink()  # deleted by hand while the writer runs: its next save takes the lock again
    assert manager.save(2, params=SMALL)
    assert json.loads(path.read_text())["pid"] == os.getpid()
    write_lock(tmp_path, host="another-host", pid=4321)  # taken over by a process that judged it abandoned
    expected = f"save: this CheckpointManager no longer writes to {tmp_path}: process 4321 on host 'another-host' holds its lock"
    with pytest.raises(CheckpointError, match=re.escape(expected)):
        manager.save(3, params=SMALL)
    manager.close()
    assert json.loads(path.read_text())["token"] == "theirs"  # closing leaves the other's lock alone
    assert manager.all_steps() == [1, 2]


def run_python(code: str, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout)


def test_save_killed_mid_write_leaves_the_previous_step(tmp_path):
    """A process SIGKILLed while its save is being written: the manager restores the previous
    complete step, and saving that step again works."""
    result = run_python(f"""
        import os, signal
        import jax.numpy as jnp
        from modopt.integrations.orbax import CheckpointManager
        manager = CheckpointManager({str(tmp_path)!r})
        manager.save(1, params={{"w": jnp.full((1024, 1024), 1.0)}})
        manager.wait_until_finished()
        manager.save(2, params={{"w": jnp.full((4096, 1024), 2.0)}})  # written in the background
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert result.returncode == -9, result.stderr[-3000:]
    assert (tmp_path / "modopt-writer.lock").exists()  # left by the killed writer, taken over by the next
    with CheckpointManager(tmp_path) as manager:
        assert manager.all_steps() == [1]
        restored = manager.restore(params={"w": jnp.zeros((1024, 1024))})["params"]["w"]
        assert float(restored[0, 0]) == 1.0
        manager.save(2, params={"w": jnp.full((8, 8), 2.0)})
        manager.wait_until_finished()
        assert manager.all_steps() == [1, 2]
        assert float(manager.restore(params={"w": jnp.zeros((8, 8))})["params"]["w"][0, 0]) == 2.0


def test_exit_without_close_still_completes_the_save(tmp_path):
    result = run_python(f"""
        import jax.numpy as jnp
        from modopt.integrations.orbax import CheckpointManager
        manager = CheckpointManager({str(tmp_path)!r})
        manager.save(5, params={{"w": jnp.full((2048, 1024), 5.0)}})
        # no wait_until_finished(), no close(): the program just ends
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    with CheckpointManager(tmp_path) as manager:
        assert manager.all_steps() == [5]
        assert float(manager.restore(params={"w": jnp.zeros((2048, 1024))})["params"]["w"][-1, -1]) == 5.0


def test_flipped_bytes_in_a_data_file_raise_a_checksum_error(tmp_path):
    params = {"w": jnp.arange(100_000, dtype=jnp.float32), "b": jnp.ones(3)}
    with CheckpointManager(tmp_path) as manager:
        manager.save(1, params=params)
    data_files = [
        os.path.join(root, name) for root, _, names in os.walk(tmp_path / "1" / "arrays") for name in names
    ]
    largest = max(data_files, key=os.path.getsize)
    data = bytearray(open(largest, "rb").read())
    for offset in range(len(data) // 2, len(data) // 2 + 4):
        data[offset] ^= 0xFF
    open(largest, "wb").write(bytes(data))
    with CheckpointManager(tmp_path) as manager:
        with pytest.raises(CheckpointError, match=re.escape("Checksum mismatch in 'params' at ['w'], step 1")):
            manager.restore(params=params)


@pytest.mark.parametrize("damage", ["missing", "garbled", "not-a-record"])
def test_missing_or_garbled_record_is_a_clear_error(tmp_path, damage):
    params = make_params()
    with CheckpointManager(tmp_path) as manager:
        manager.save(1, params=params)
    record = tmp_path / "1" / "modopt" / "metadata"
    if damage == "missing":
        shutil.rmtree(tmp_path / "1" / "modopt")
    elif damage == "garbled":
        record.write_text('{"format": 1, "items": {')
    else:
        record.write_text('{"hello": "world"}')
    with CheckpointManager(tmp_path) as manager:
        with pytest.raises(CheckpointError, match=r"The record of step 1 \(.*\) is (missing or )?garbled"):
            manager.restore(params=params)


def test_a_string_of_an_older_checkpoint_comes_from_the_target(tmp_path):
    """Checkpoints written before strings were saved mark them `static`: the target's string stays."""
    with CheckpointManager(tmp_path) as manager:
        manager.save(1, run={"name": "run-1", "step": 3})
    path = tmp_path / "1" / "modopt" / "metadata"
    record = json.loads(path.read_text())
    leaf = record["items"]["run"]["leaves"][0]
    assert leaf == {"path": "['name']", "kind": "value", "value": "run-1"}
    record["items"]["run"]["leaves"][0] = {"path": "['name']", "kind": "static"}
    path.write_text(json.dumps(record))
    with CheckpointManager(tmp_path) as manager:
        assert manager.restore(run={"name": "target", "step": 0})["run"] == {"name": "target", "step": 3}
        with pytest.raises(CheckpointError, match=re.escape("at ['name'] the checkpoint has code or another object")):
            manager.restore(run={"name": 0, "step": 0})


def test_import_modopt_does_not_import_orbax():
    result = run_python("""
        import sys, modopt
        assert "orbax" not in sys.modules and "orbax.checkpoint" not in sys.modules, "orbax imported"
        import modopt.integrations
        assert "orbax.checkpoint" not in sys.modules, "orbax imported by modopt.integrations"
    """)
    assert result.returncode == 0, result.stderr[-2000:]


def test_readme_checkpoint_example_runs(tmp_path, monkeypatch, capsys):
    section = pages.section("docs/guides/checkpoints.md", "Checkpoints")
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/guides/checkpoints.md", "exec"), {})
    assert "[50, 100] 100" in capsys.readouterr().out


def test_a_stack_read_with_other_padding_checks_against_the_array_saved():
    """A stack of the owner scheme saved with padding units (zeros) for one device count and
    read at another's length (cut, or zero-extended): its checksum as saved follows from what
    was read, on the host and on the device, and a stack of other units is not taken."""
    from modopt.integrations import _records

    units = jnp.asarray(np.random.default_rng(1).normal(size=(3, 4, 4)), jnp.float32)
    saved = jnp.concatenate([units, jnp.zeros((5, 4, 4))])  # 3 units padded for 8 devices
    expected = _records.checksums([saved])[0]
    for read in (units, saved[:4], jnp.concatenate([saved, jnp.zeros((2, 4, 4))])):  # 1, 4 and 10 devices
        assert _records.checksums([read], [8]) == [expected]
        on_device = jax.device_get(_records._checksums([read], rows=(8,)))[0]
        assert "{:08x}{:08x}".format(*map(int, on_device)) == expected
    corrupted = units.at[0, 0, 0].add(1.0)
    assert _records.checksums([corrupted], [8]) != [expected]

    leaf = lambda shape, units=None: _records.Leaf("['s']", "array", shape, "float32", units=units)  # noqa: E731
    assert _records.restacked(leaf((8, 4, 4), 3), leaf((4, 4, 4), 3))
    assert _records.restacked(leaf((8, 4, 4), 3), leaf((3, 4, 4)))  # onto one device
    assert _records.restacked(leaf((3, 4, 4)), leaf((8, 4, 4), 3))  # a checkpoint of one device
    assert not _records.restacked(leaf((8, 4, 4), 3), leaf((8, 4, 4), 5))  # other units
    assert not _records.restacked(leaf((8, 4, 4), 3), leaf((8, 4, 2), 3))
    assert not _records.restacked(leaf((8, 4, 4)), leaf((4, 4, 4)))  # not stacks: another shape


def test_host_and_device_checksums_are_the_same_numbers():
    """Small arrays are summed on the host, large and multi-host ones on their devices: the two
    must agree for every dtype, or a checkpoint written one way would fail to verify the other."""
    from modopt.integrations import _records

    rng = np.random.default_rng(0)
    arrays = [
        jnp.asarray(rng.normal(size=(37, 5)), jnp.float32),
        jnp.asarray(rng.normal(size=(4,)), jnp.bfloat16),
        jnp.asarray(rng.integers(-5, 5, size=(3, 3, 3)), jnp.int8),
        jnp.asarray(rng.normal(size=(6,)) + 1j, jnp.complex64),
        jnp.asarray(rng.random(7) > 0.5),
        jnp.zeros(()),
        jnp.asarray(rng.integers(0, 2**31, size=(1000,)), jnp.uint32),
        jax.random.key_data(jax.random.key(3)),
    ]
    with jax.enable_x64(True):
        arrays.append(jnp.asarray(rng.normal(size=(3, 2)), jnp.float64))
        for x in arrays:
            on_device = [int(v) for v in jax.device_get(_records._checksums([x]))[0]]
            on_host = list(_records._host_checksum(_records._host_words(np.asarray(x))))
            assert on_device == on_host, x.dtype
    big = jnp.arange(_records._HOST_ELEMENTS + 1, dtype=jnp.float32)  # summed on its device
    assert _records.checksums([big]) == ["{:08x}{:08x}".format(*_records._host_checksum(_records._host_words(np.asarray(big))))]
