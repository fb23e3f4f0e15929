"""One process of a multi-process (multi-host style) run, started by `test_multiprocess.py`.

Usage: `python multiprocess_worker.py CASE PROCESS_ID PROCESSES ADDRESS DIRECTORY`. Each process
joins `jax.distributed` with the coordinator at ADDRESS (127.0.0.1:port), with 2 CPU devices of
its own and gloo collectives (`modopt.examples._processes.initialize`), so the global mesh
spans processes as it spans hosts on a pod: ("data", "model") of shape (PROCESSES, 2), "data"
across processes, "model" within one. Every check prints `ok <what>` on success; a failed
check raises (exit status 1).

Cases:
- `train`: the sharded and ZeRO-1 steps equal the unsharded step (computed in each process
  on one of its devices); the ZeRO-1 run of `STEPS` steps is written to `DIRECTORY` as the
  reference; the run again with a `CheckpointManager` saving every step from all processes
  (the writer lock is held once, by process 0, refreshed by its heartbeat; a second manager
  is refused in every process); process 1 is killed in the middle of saving step `KILLED_AT`
  (`SIGKILL` once its arrays are written, before the step is committed).
- `owners`: every matrix optimizer (the Muon family, Shampoo, SOAP, Kron), whose per-matrix
  work runs on one owner device per matrix (`modopt.sharding`'s owner scheme), gives the
  unsharded steps on the mesh spanning the processes, with and without ZeRO-1.
- `resume`: a restart, as a pod restarts every host: restores the latest step (target and
  saved hyperparameters, a Python number in the target), takes the writer lock over from the
  killed run, trains to `STEPS` with saves, and must end bit-exact on the reference; then runs
  the example of docs/api/pods.md.

Sharded loops block on their results every step (XLA's CPU collectives can deadlock on a
2-core machine when many steps are queued).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import modopt
from modopt.examples import _processes
from modopt.integrations import _lock
from modopt.integrations.orbax import CheckpointError, CheckpointManager
import testing_gc

testing_gc.collect_less()

START = time.monotonic()
# Set from the command line (`main`); importing this module (the test does, for the problem's
# definition) initializes nothing.
PROCESS_ID, PROCESSES, DIRECTORY = 0, 1, ""
STEPS = 6  # the whole run
KILLED_AT = 4  # the step whose save is killed (steps 1 to 3 are saved)
BATCH = 8  # global batch, split over "data"
SHAPES = {"w1": (16, 32), "b1": (32,), "w2": (32, 8), "scale": ()}
SPECS = {"w1": P(None, "model"), "b1": P("model"), "w2": P("model", None), "scale": P()}
TOLERANCE = 1e-5  # sharded against unsharded: the sums run in another order


def ok(message: str) -> None:
    """A check passed (the test looks for the line), with the time since the process started."""
    print(f"ok {message} ({time.monotonic() - START:.1f} s)", flush=True)


def log(message: str) -> None:
    print(f"[process {PROCESS_ID} at {time.monotonic() - START:.1f} s] {message}", flush=True)


def make_params() -> dict[str, np.ndarray]:
    """The same numbers in every process (a fixed seed)."""
    rng = np.random.default_rng(0)
    return {name: (rng.standard_normal(shape) / 4).astype(np.float32) for name, shape in SHAPES.items()}


def global_batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    """The global batch of a step; each process feeds its rows of it."""
    rng = np.random.default_rng([1, step])
    x = rng.standard_normal((BATCH, 16)).astype(np.float32)
    return x, np.sin(x[:, :8])


def loss_fn(params, x, y):
    hidden = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((params["scale"] * hidden @ params["w2"] - y) ** 2)


def make_tx():
    # A global norm and weight decay: reductions over every shard of every process.
    return modopt.chain(modopt.clip_by_global_norm(0.5), modopt.adamw(1e-2, weight_decay=1e-2))


def train_step(params, optimizer, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
    params, optimizer = optimizer.step(params, grads)
    return params, optimizer, loss


class Run:
    """The global mesh, the parameters' shardings, and how a process feeds its part of a batch."""

    def __init__(self):
        self.mesh = jax.make_mesh((PROCESSES, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
        self.shardings = {name: NamedSharding(self.mesh, spec) for name, spec in SPECS.items()}
        self.step = jax.jit(train_step, donate_argnums=(0, 1))

    def params(self) -> dict[str, jax.Array]:
        """Global arrays, each process filling in the shards on its devices."""
        full = make_params()
        return {
            name: jax.make_array_from_callback(full[name].shape, self.shardings[name], lambda index, a=full[name]: a[index])
            for name in full
        }

    def optimizer(self, params, zero: bool) -> modopt.Optimizer:
        return modopt.Optimizer(make_tx(), params, shardings=self.shardings, zero_axis="data" if zero else None)

    def batch(self, step: int) -> tuple[jax.Array, jax.Array]:
        """This process's rows of the global batch, assembled into global arrays over "data"."""
        rows = slice(PROCESS_ID * BATCH // PROCESSES, (PROCESS_ID + 1) * BATCH // PROCESSES)
        sharding = NamedSharding(self.mesh, P("data"))
        return tuple(jax.make_array_from_process_local_data(sharding, part[rows]) for part in global_batch(step))

    def train(self, params, optimizer, steps: range, after_step=None):
        for i in steps:
            params, optimizer, loss = self.step(params, optimizer, self.batch(i))
            jax.block_until_ready((params, optimizer))
            if after_step is not None:
                after_step(i + 1, params, optimizer)
        return params, optimizer


def gathered(tree) -> list[np.ndarray]:
    """Every array leaf of `tree`, whole, as NumPy (a collective: every process calls it).

    One compiled call replicates them all (`multihost_utils.process_allgather` compiles one
    per leaf)."""
    leaves = [x for x in jax.tree.leaves(tree) if isinstance(x, jax.Array)]
    mesh = leaves[0].sharding.mesh
    whole = jax.jit(lambda xs: xs, out_shardings=NamedSharding(mesh, P()))(leaves)
    return [np.asarray(x) for x in whole]


def unsharded_reference(steps: int, tx=None) -> tuple[dict, modopt.Optimizer]:
    """The same steps on one device of this process, from plain NumPy inputs: (params, optimizer)."""
    device = jax.local_devices()[0]
    params = jax.device_put(make_params(), device)
    optimizer = modopt.Optimizer(make_tx() if tx is None else tx, params)
    step = jax.jit(train_step)
    for i in range(steps):
        params, optimizer, _ = step(params, optimizer, jax.device_put(global_batch(i), device))
    return params, optimizer


def assert_leaves(ours: list, reference: list, what: str, tolerance: float | None) -> None:
    assert len(ours) == len(reference), f"{what}: {len(ours)} leaves, expected {len(reference)}"
    for i, (a, b) in enumerate(zip(ours, reference)):
        a, b = np.asarray(a), np.asarray(b)
        if tolerance is None:
            assert a.dtype == b.dtype and np.array_equal(a, b), f"{what}: leaf {i} differs (max {np.max(np.abs(a - b))})"
        else:
            np.testing.assert_allclose(a, b, rtol=tolerance, atol=tolerance, err_msg=f"{what}: leaf {i}")


def held_bytes(tree) -> int:
    """What this process's devices hold of `tree`'s arrays."""
    return sum(shard.data.nbytes for x in jax.tree.leaves(tree) if isinstance(x, jax.Array) for shard in x.addressable_shards)


def reference_path(step: int, directory: str = "") -> str:
    return os.path.join(directory or DIRECTORY, f"reference_{step}.npz")


def train() -> None:
    log("started")
    run = Run()
    devices = {d.process_index for d in run.mesh.devices[PROCESS_ID]}
    assert devices == {PROCESS_ID} and jax.device_count() == 2 * PROCESSES, (devices, jax.devices())

    # Sharded and ZeRO-1 steps equal the unsharded ones (parameters, state, count, hyperparameters).
    expected = [np.asarray(x) for x in jax.tree.leaves(unsharded_reference(3))]
    params = run.params()
    params, optimizer = run.train(params, run.optimizer(params, zero=False), range(3))
    assert_leaves(gathered((params, optimizer)), expected, "3 sharded steps", TOLERANCE)
    held = [held_bytes(optimizer.state)]
    ok("sharded step equals the unsharded step")

    # With ZeRO-1, the straight run: the reference of the resumed one.
    snapshots = {}

    def snapshot(step, params, optimizer):
        snapshots[step] = gathered((params, optimizer))

    params = run.params()
    params, optimizer = run.train(params, run.optimizer(params, zero=True), range(STEPS), after_step=snapshot)
    assert_leaves(snapshots[3], expected, "3 sharded steps with ZeRO-1", TOLERANCE)
    mu = optimizer.state[1][0].mu["w1"]  # adamw's first moment of w1, (16, 32)
    assert not mu.is_fully_addressable and mu.sharding.spec == P("data", "model"), mu.sharding
    held.append(held_bytes(optimizer.state))
    log(f"optimizer state held per process: {held[0]} bytes, {held[1]} with ZeRO-1")
    # ZeRO-1 over "data" (across processes): each process holds about half of the moments.
    assert held[1] < 0.6 * held[0], held
    ok("zero1 step equals the unsharded step, state split across processes")
    if PROCESS_ID == 0:
        for step, leaves in snapshots.items():
            np.savez(reference_path(step), *leaves)
    multihost_utils.sync_global_devices("references written")

    checkpoints(run)


def checkpoints(run: Run) -> None:
    """The same run saving every step from all processes, until process 1 is killed mid-save."""
    directory = os.path.join(DIRECTORY, "checkpoints")
    lock = os.path.join(directory, _lock.NAME)
    _lock.HEARTBEAT = 0.1  # refreshes every 0.1 s (10 s by default)
    pids = [int(p) for p in multihost_utils.process_allgather(np.int32(os.getpid()))]
    params = run.params()
    optimizer = run.optimizer(params, zero=True)
    manager = CheckpointManager(directory)

    def save(step, params, optimizer):
        if step == KILLED_AT:
            kill_mid_save(manager, step, params, optimizer)
        manager.save(step, params=params, optimizer=optimizer, progress={"step": optimizer.count})
        log(f"saved step {step}")
        if step == 1:
            lock_checks(manager, lock, pids)

    run.train(params, optimizer, range(STEPS), after_step=save)
    raise AssertionError("process 1 was not killed")


def lock_checks(manager: CheckpointManager, lock: str, pids: list[int]) -> None:
    """One lock for all processes, held by process 0 and refreshed; a second manager refused everywhere."""
    with open(lock) as file:
        owner = json.load(file)
    assert owner["pid"] == pids[0], (owner, pids)
    assert [name for name in os.listdir(os.path.dirname(lock)) if name.startswith(_lock.NAME)] == [_lock.NAME]
    first = os.stat(lock).st_mtime
    time.sleep(0.5)
    assert os.stat(lock).st_mtime > first, "the writer lock was not refreshed"
    # Process 0 refreshes it; no other process has a heartbeat.
    assert (_lock._thread is not None) == (PROCESS_ID == 0), _lock._thread
    multihost_utils.sync_global_devices("lock checked")
    ok("one writer lock, held by process 0, refreshed by its heartbeat")

    other = CheckpointManager(manager.directory)
    start = time.monotonic()
    try:
        other.save(100, x=np.zeros(3))
    except CheckpointError as error:
        assert "another CheckpointManager of this process" in str(error) or "process 0" in str(error), str(error)
    else:
        raise AssertionError("a second manager saved into a directory with a writer")
    finally:
        other.close()
    assert time.monotonic() - start < 10
    assert manager.all_steps() == [1], manager.all_steps()
    multihost_utils.sync_global_devices("second writer refused")
    ok("a second manager's save is refused in every process")


def kill_mid_save(manager: CheckpointManager, step: int, params, optimizer) -> None:
    """Saves `step`; process 1 kills itself once its arrays are written, before the commit."""
    from orbax.checkpoint._src.multihost import multihost

    manager.wait_until_finished()  # the steps before are complete
    ok(f"steps {manager.all_steps()} saved")
    if PROCESS_ID == 1:
        unique_key = multihost._unique_barrier_key  # every Orbax barrier's key goes through it

        def die_at_commit(key: str) -> str:
            if "async_write_complete" in key:  # this process's arrays are written
                log(f"killed while saving step {step}")
                os.kill(os.getpid(), signal.SIGKILL)
            return unique_key(key)

        multihost._unique_barrier_key = die_at_commit
    manager.save(step, params=params, optimizer=optimizer, progress={"step": optimizer.count})
    log(f"saving step {step}, waiting to be killed")
    print("waiting to be killed", flush=True)
    manager.wait_until_finished()  # process 0 never gets past this
    time.sleep(600)


def resume() -> None:
    """Restores the latest step (on the ZeRO-1 layout saved, and on the plain one), takes the lock
    over from the killed run, trains on with saves: bit-exact on the straight run."""
    run = Run()
    directory = os.path.join(DIRECTORY, "checkpoints")
    lock = os.path.join(directory, _lock.NAME)
    pids = [int(p) for p in multihost_utils.process_allgather(np.int32(os.getpid()))]
    with open(lock) as file:
        assert json.load(file)["pid"] not in pids  # left by the killed run
    manager = CheckpointManager(directory)
    latest = manager.latest_step()
    assert latest == KILLED_AT - 1, (latest, os.listdir(directory))
    expected = reference(latest)
    for zero in (False, True):
        params = run.params()
        optimizer = run.optimizer(params, zero)
        # A Python number in the target (as in a fresh Flax TrainState) takes the saved count;
        # the hyperparameters, weakly typed global scalars, come from either.
        policy = "saved" if zero else "target"
        restored = manager.restore(params=params, optimizer=optimizer, progress={"step": 0}, hyperparameters=policy)
        assert restored["optimizer"].tx.transforms[1].learning_rate.weak_type
        assert_leaves(gathered((restored["params"], restored["optimizer"])), expected, f"step {latest} (zero={zero})", None)
        for (path, a), b in zip(
            jax.tree_util.tree_leaves_with_path(restored["optimizer"]), jax.tree.leaves(optimizer)
        ):
            assert a.sharding.is_equivalent_to(b.sharding, a.ndim), (jax.tree_util.keystr(path), a.sharding, b.sharding)
        count = restored["progress"]["step"]
        assert count.weak_type and int(count) == latest, count
        # It goes with the global arrays into a jitted step (it is on no device in particular).
        assert int(jax.jit(lambda p, c: c + 0 * p["scale"].astype(jnp.int32))(restored["params"], count)) == latest
    ok(f"step {latest} restored in {PROCESSES} processes, bit-exact, on the ZeRO-1 and the plain layout")

    def save(step, params, optimizer):
        manager.save(step, params=params, optimizer=optimizer, progress={"step": optimizer.count})
        if step == latest + 1:
            with open(lock) as file:
                assert json.load(file)["pid"] == pids[0]
            manager.wait_until_finished()
            # What the killed save left is gone; the step is complete.
            assert not [name for name in os.listdir(directory) if "tmp" in name], os.listdir(directory)
            assert manager.all_steps()[-1] == step

    params, optimizer = run.train(restored["params"], restored["optimizer"], range(latest, STEPS), after_step=save)
    assert_leaves(gathered((params, optimizer)), reference(STEPS), f"step {STEPS} after resuming", None)
    manager.close()
    assert manager.all_steps() == list(range(1, STEPS + 1)), manager.all_steps()
    multihost_utils.sync_global_devices("closed")
    assert not os.path.exists(lock)
    ok(f"resumed at step {latest}, the lock taken over; step {STEPS} equals the straight run bit for bit")
    namespace = run_pod_example(os.path.join(DIRECTORY, "pod"))
    assert int(namespace["optimizer"].count) == 10 and namespace["model"].layers[0].weight.sharding.spec == P("model")
    ok("the pods page's example trains and saves in 2 processes")


def pod_example() -> str:
    """The Python block of `docs/api/pods.md`."""
    import re

    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "api", "pods.md")) as file:
        (block,) = re.findall(r"```python\n(.*?)```", file.read(), re.DOTALL)
    return block


def run_pod_example(directory: str) -> dict:
    """Runs the pods page's example as `pod.py PROCESS_ID PROCESSES` in `directory`, in this
    process (its `jax.distributed.initialize` is this run's: already done); its variables."""
    initialize, argv, cwd = jax.distributed.initialize, sys.argv, os.getcwd()

    def initialized(coordinator_address, num_processes, process_id):
        assert (num_processes, process_id) == (PROCESSES, PROCESS_ID)

    os.makedirs(directory, exist_ok=True)
    jax.distributed.initialize, sys.argv = initialized, ["pod.py", str(PROCESS_ID), str(PROCESSES)]
    os.chdir(directory)
    try:
        namespace: dict = {"__name__": "pod"}
        exec(compile(pod_example(), "docs/api/pods.md", "exec"), namespace)
    finally:
        jax.distributed.initialize, sys.argv = initialize, argv
        os.chdir(cwd)
    return namespace


# The matrix optimizers, each with refreshes inside the 3 steps; the tolerance of the registry's
# sharded checks (Newton-Schulz amplifies the rounding of sums taken in another order).
MATRIX_OPTIMIZERS = {
    "muon": (lambda: modopt.contrib.muon(0.02), 1e-3),
    "normuon": (lambda: modopt.normuon(0.02), 1e-3),
    "adamuon": (lambda: modopt.adamuon(0.02), 1e-3),
    # Its inverse roots iterate on ill-conditioned statistics: within 1e-3 of their largest entry,
    # as test_shampoo.py compares them with the reference.
    "shampoo": (lambda: modopt.shampoo(1e-2, block_size=8, start_preconditioning_step=1), 1e-3),
    "soap": (lambda: modopt.soap(3e-3, precondition_frequency=2), 2e-4),
    "kron": (lambda: modopt.kron(), 1e-5),
    # Its projections refreshed by SVD at steps 0 and 2, on their owners; rank 4 of 16 and 8.
    "galore": (lambda: modopt.contrib.galore(1e-2, rank=4, update_proj_gap=2), 1e-5),
}


def given_gradients(step: int) -> dict[str, np.ndarray]:
    """The same gradients in every process (a fixed seed per step)."""
    rng = np.random.default_rng([2, step])
    return {name: (rng.standard_normal(shape) / 4).astype(np.float32) for name, shape in SHAPES.items()}


def key_data(tree):
    """`tree` with typed PRNG keys (Kron's) as their key data."""
    is_key = lambda x: isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key)  # noqa: E731
    return jax.tree.map(lambda x: jax.random.key_data(x) if is_key(x) else x, tree)


def owners() -> None:
    """Each matrix optimizer's step on the mesh spanning the processes equals it on one device,
    on the same gradients (from a sharded backward pass, SOAP's bases of rank-deficient statistics
    would differ at O(1) in their null space, on any mesh)."""
    log("started")
    run = Run()
    step = jax.jit(lambda params, optimizer, grads: optimizer.step(params, grads), donate_argnums=(0, 1))
    one_device_step = jax.jit(lambda params, optimizer, grads: optimizer.step(params, grads))  # compiled once per optimizer
    device = jax.local_devices()[0]
    for name, (make, tolerance) in MATRIX_OPTIMIZERS.items():
        params = jax.device_put(make_params(), device)
        one = (params, modopt.Optimizer(make(), params))
        for i in range(3):
            one = one_device_step(*one, jax.device_put(given_gradients(i), device))
        expected = [np.asarray(x) for x in jax.tree.leaves(key_data(one))]
        for zero in (False, True):
            params = run.params()
            sharded = (params, modopt.Optimizer(make(), params, shardings=run.shardings, zero_axis="data" if zero else None))
            for i in range(3):
                grads = {
                    k: jax.make_array_from_callback(v.shape, run.shardings[k], lambda index, a=v: a[index])
                    for k, v in given_gradients(i).items()
                }
                sharded = jax.block_until_ready(step(*sharded, grads))
            # The owner scheme's stacks are stored padded to a multiple of the 4 devices: compared
            # without their padding units (one device stores none).
            lengths = [x.shape[:1] for x in jax.tree.leaves(key_data(jax.eval_shape(modopt.sharding.unpadded, sharded[1])))]
            whole = gathered(key_data(sharded))
            whole = whole[: len(whole) - len(lengths)] + [x[: n[0]] if n else x for x, n in zip(whole[-len(lengths) :], lengths)]
            for i, (a, b) in enumerate(zip(whole, expected)):
                # In units of the leaf's largest entry: a sum's rounding scales with what it adds.
                scale = max(float(np.max(np.abs(b))), 1e-30) if b.size else 1.0
                worst = float(np.max(np.abs(a.astype(np.float64) - b))) / scale if b.size else 0.0
                assert a.shape == b.shape and worst <= tolerance, f"{name}, zero={zero}: leaf {i} off by {worst:.1e}"
        ok(f"owners: {name} on 2 processes equals one device")


def reference(step: int, directory: str = "") -> list[np.ndarray]:
    """The straight run's parameters and optimizer after `step` steps, leaf by leaf."""
    with np.load(reference_path(step, directory)) as saved:
        return [saved[f"arr_{i}"] for i in range(len(saved.files))]


CASES = {"train": train, "resume": resume, "owners": owners}


def main() -> None:
    global PROCESS_ID, PROCESSES, DIRECTORY
    case, PROCESS_ID, PROCESSES, address, DIRECTORY = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    jax.config.update("jax_num_cpu_devices", 2)  # before JAX starts its CPU backend
    _processes.initialize(address, PROCESSES, PROCESS_ID, timeout=60)
    CASES[case]()
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
