"""The optimizers beyond optax on 8 simulated devices: train, save, restore onto other meshes.

Run by `test_beyond_optax_meshes.py` in a subprocess of its own (the device count must be set
before jax is imported): `python beyond_optax_mesh_worker.py DIRECTORY [NAME ...]`.

For each optimizer, a small network (a 16 x 32 and a 32 x 24 matrix, a 24 x 10 one whose 10
columns no 4- or 8-way axis divides, and a bias of 32) trains `K` steps on layout `A` and is
saved with `modopt.integrations.orbax` (all optimizers in one checkpoint), then trains on to `N`
steps: the run straight through. The checkpoint is restored onto two layouts, each target a
freshly created `Optimizer(tx, params, shardings=..., zero_axis=...)`, and trained from `K` to `N`:

- `A` again, a 2 x 4 ("data", "model") mesh with the matrices split over "model": the
  result equals the straight run bit for bit (the same compiled step serves both);
- `B`, a 4 x 2 ("fsdp", "tensor") mesh with the parameters split another way over "tensor"
  and ZeRO-1 over "fsdp" (`zero_axis="fsdp"`): state leaves that "fsdp" divides are split
  over it; the stacked statistics of SOAP, Shampoo and Kron lie on their owners;
- `C`, a 2 x 2 mesh of 4 of the devices (another device count), FSDP over "data";
- `one`, a single device without shardings: the state the owner scheme stacked, restored
  where nothing is split.

Every restored leaf (state, step count, hyperparameters; and the parameters) must lie where
`modopt.sharding.shardings` puts it on the target layout, before and after training, and on B
some state leaf must be split over "fsdp". On B the results equal the straight run within
`TOLERANCE[name]`: the meshes split the network's matrix products and the optimizers'
reductions (norms, Gram matrices, Newton-Schulz products) differently, so float32 sums are
added in another order, which changes results in their last bits at each step; see
`TOLERANCE` for how far each optimizer carries that.

Each step blocks on its result (queued sharded steps can deadlock XLA's CPU collectives on a
2-core machine). Prints `ok NAME LAYOUT` per optimizer and layout, or `FAIL NAME: reason`, and
exits non-zero if anything failed.
"""

from __future__ import annotations

import os
import sys
import time
import traceback

# LLVM's optimizations off: compiling is most of this check's time, and they take 40% of it.
# Every comparison is between runs of this process, compiled alike.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
)

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from modopt.integrations.orbax import CheckpointManager

import modopt
import testing_gc

testing_gc.collect_less()

K, N = 3, 6
SHAPES = {"w1": (16, 32), "b1": (32,), "w2": (32, 24), "w3": (24, 10)}
BATCH = 32

# Each optimizer with its defaults, except a learning rate where it has none, and the
# preconditioner refreshes of SOAP and Shampoo made frequent enough to fall on both sides
# of the save (Kron's default refreshes every step for its first hundreds).
OPTIMIZERS = {
    "soap": lambda: modopt.soap(3e-3, precondition_frequency=2),
    "shampoo": lambda: modopt.shampoo(1e-2, start_preconditioning_step=2, preconditioning_compute_steps=2),
    "kron": lambda: modopt.kron(),
    "adam_mini": lambda: modopt.adam_mini(1e-3),
    "mars": lambda: modopt.mars(3e-3),
    "laprop": lambda: modopt.laprop(1e-3),
    "normuon": lambda: modopt.normuon(0.02),
    "adamuon": lambda: modopt.adamuon(0.02),
    "muon": lambda: modopt.contrib.muon(0.02),
    "cautious_adamw": lambda: modopt.cautious(modopt.adamw(1e-3)),
}

# How far B may end from the straight run on A, in units of each leaf's largest magnitude.
# One reordered float32 sum differs in its last bits (eps = 1.2e-7 of the magnitudes summed);
# six steps of a few dozen such sums, carried through Adam's division by sqrt(nu) and
# Newton-Schulz's matrix products, stay within 1e-5 (~80 eps; up to 1.7e-6 was measured, by
# Shampoo, whose inverse fourth roots damp a change of the statistics rather than amplify
# it). SOAP's eigenbases are eigenvectors of the gradients' Gram matrices, which move by the
# change of the matrix over the gap between eigenvalues: with 32 examples and close eigenvalues
# the bases differed by up to 2.4e-5 of their largest entry; 2e-4 allows for that and no more
# (a misplaced or stale state leaf changes results by O(1)).
TOLERANCE = {name: 1e-5 for name in OPTIMIZERS} | {"soap": 2e-4}


def mesh_of(shape, names):
    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape))


def layouts():
    """name -> (mesh, the parameters' specs, the batch's spec, zero_axis)."""
    a = mesh_of((2, 4), ("data", "model"))
    b = mesh_of((4, 2), ("fsdp", "tensor"))
    c = jax.make_mesh((2, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2, devices=jax.devices()[:4])
    return {
        "A": (a, {"w1": P(None, "model"), "b1": P("model"), "w2": P("model", None), "w3": P("model", None)}, P("data"), None),
        "B": (b, {"w1": P("tensor", None), "b1": P(), "w2": P(None, "tensor"), "w3": P(None, "tensor")}, P("fsdp"), "fsdp"),
        "C": (c, {"w1": P("data", None), "b1": P("data"), "w2": P("data", None), "w3": P("data", None)}, P("data"), None),
        "one": (None, None, None, None),
    }


def named(mesh, specs):
    return {name: NamedSharding(mesh, spec) for name, spec in specs.items()}


def make_params():
    keys = jax.random.split(jax.random.key(0), len(SHAPES))
    return {name: jax.random.normal(k, shape) / np.sqrt(shape[0]) for k, (name, shape) in zip(keys, SHAPES.items())}


def make_batch(step):
    kx, ky = jax.random.split(jax.random.fold_in(jax.random.key(1), step))
    return jax.random.normal(kx, (BATCH, 16)), jax.random.normal(ky, (BATCH, 10))


def loss(params, x, y):
    hidden = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((jnp.tanh(hidden @ params["w2"]) @ params["w3"] - y) ** 2)


def train_step(params, optimizer, x, y):
    return optimizer.step(params, jax.grad(loss)(params, x, y))


class Run:
    """One layout: its shardings and a step compiled once for it."""

    def __init__(self, layout):
        self.mesh, specs, batch_spec, self.zero_axis = layout
        one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        self.params = one if self.mesh is None else named(self.mesh, specs)
        self.batch = one if self.mesh is None else NamedSharding(self.mesh, batch_spec)
        self.step = jax.jit(train_step)

    def start(self, tx):
        params = jax.device_put(make_params(), self.params)
        if self.mesh is None:
            return params, modopt.Optimizer(tx, params)
        return params, modopt.Optimizer(tx, params, shardings=self.params, zero_axis=self.zero_axis)

    def train(self, params, optimizer, steps):
        for i in steps:
            x, y = jax.device_put(make_batch(i), self.batch)
            params, optimizer = self.step(params, optimizer, x, y)
            jax.block_until_ready((params, optimizer))
        return params, optimizer

    def expected(self, optimizer):
        if self.mesh is None:  # every leaf on the one device
            return jax.tree_util.tree_map(lambda _: self.params, optimizer)
        return modopt.sharding.shardings(optimizer, self.params, zero_axis=self.zero_axis)


def flat(tree):
    return jax.tree_util.tree_flatten_with_path(tree)[0]


def assert_placed(tree, shardings, what):
    for (path, leaf), sharding in zip(flat(tree), jax.tree_util.tree_structure(tree).flatten_up_to(shardings)):
        assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim), (
            f"{what}{jax.tree_util.keystr(path)} is {leaf.sharding}, the target layout asks for {sharding}"
        )


def all_owned(optimizer, run) -> bool:
    """Whether every state leaf but scalars is a stack of the owner scheme (`OWNED`: SOAP's is,
    its moments included), which ZeRO-1 leaves as it is."""
    specs = jax.tree_util.tree_map(lambda s: s.spec, run.params)
    rules = jax.tree_util.tree_leaves(
        optimizer.tx.state_specs(optimizer.signature.params(), specs), is_leaf=lambda x: x is modopt.sharding.OWNED
    )
    leaves = jax.tree_util.tree_leaves(optimizer.state)
    return all(rule is modopt.sharding.OWNED or leaf.ndim == 0 for rule, leaf in zip(rules, leaves))


def numbers(leaf):
    if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        leaf = jax.random.key_data(leaf)
    return np.asarray(leaf)


def compare(ours, straight, what, tolerance):
    """Leaf by leaf: bit for bit (`tolerance=None`), or every entry within `tolerance` times
    the leaf's largest magnitude (rounding errors scale with the numbers summed, not with the
    entry: a small entry of a large Gram matrix carries its large neighbours' rounding).
    Returns the largest difference found, in those units."""
    assert jax.tree_util.tree_structure(ours) == jax.tree_util.tree_structure(straight), what
    worst = 0.0
    for (path, a), b in zip(flat(ours), jax.tree_util.tree_leaves(straight)):
        a, b, where = numbers(a), numbers(b), f"{what}{jax.tree_util.keystr(path)}"
        if tolerance is None or not np.issubdtype(b.dtype, np.floating):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), f"{where} differs from the straight run"
            continue
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{a.shape}, straight {b.dtype}{b.shape}"
        if not b.size:
            continue
        scale = max(float(np.max(np.abs(b))), np.finfo(b.dtype).tiny)
        difference = float(np.max(np.abs(a.astype(np.float64) - b))) / scale
        assert difference <= tolerance, f"{where} differs from the straight run by {difference:.1e} of its largest entry"
        worst = max(worst, difference)
    return worst


def main(directory, names):
    layout = layouts()
    runs = {name: Run(layout[name]) for name in layout}
    origin = runs["A"]
    straight, items, failed = {}, {}, []
    for name in names:
        try:
            params, optimizer = origin.start(OPTIMIZERS[name]())
            params, optimizer = origin.train(params, optimizer, range(K))
            items[f"{name}_params"], items[f"{name}_optimizer"] = params, optimizer
            straight[name] = origin.train(params, optimizer, range(K, N))
        except Exception:  # noqa: BLE001 - reported per optimizer
            failed.append(name)
            print(f"FAIL {name}: training on A\n{traceback.format_exc()}", flush=True)
    with CheckpointManager(directory) as manager:
        manager.save(K, **items)
    names = [name for name in names if name not in failed]

    for target, run in runs.items():
        with CheckpointManager(directory) as manager:
            like = {}
            for name in names:
                like[f"{name}_params"], like[f"{name}_optimizer"] = run.start(OPTIMIZERS[name]())
            # Blocked on, as every step (the sharded inits are, by `Optimizer`): programs with
            # collectives in flight at once can deadlock XLA's CPU runtime (DESIGN.md, Testing).
            restored = jax.block_until_ready(manager.restore(**like))
        for name in names:
            if name in failed:
                continue
            try:
                start = time.perf_counter()
                params, optimizer = restored[f"{name}_params"], restored[f"{name}_optimizer"]
                expected = run.expected(optimizer)
                placed_params = run.params if run.mesh is not None else jax.tree_util.tree_map(lambda _: run.params, params)
                assert_placed(params, placed_params, f"{name} on {target}: params")
                assert_placed(optimizer, expected, f"{name} on {target}: optimizer")
                assert int(optimizer.count) == K
                # A stack the owner scheme padded for A's 8 devices comes back padded for the
                # target's device count (or trimmed, on one device).
                saved = straight[name][1]
                for (path, leaf), padded, trimmed in zip(
                    flat(optimizer.state),
                    jax.tree_util.tree_leaves(saved.state),
                    jax.tree_util.tree_leaves(modopt.sharding.unpadded(saved).state),
                ):
                    if padded.shape != trimmed.shape:
                        length = modopt.sharding.padded_length(trimmed.shape[0], run.mesh)
                        assert leaf.shape[0] == length, f"{name} on {target}: state{jax.tree_util.keystr(path)} has {leaf.shape[0]} rows, not {length}"
                if run.zero_axis is not None and not all_owned(optimizer, run):
                    split = [s for s in jax.tree_util.tree_leaves(expected.state) if run.zero_axis in str(s.spec)]
                    assert split, f"{name}: no state leaf is split over {run.zero_axis!r} on {target}: ZeRO-1 is not in effect"
                params, optimizer = run.train(params, optimizer, range(K, N))
                assert_placed(optimizer, expected, f"{name} on {target} after training: optimizer")
                tolerance = None if target == "A" else TOLERANCE[name]
                worst = max(
                    compare(params, straight[name][0], f"{name} on {target}: params", tolerance),
                    # The owner scheme's stacks without their padding units (their number depends on the mesh).
                    compare(
                        modopt.sharding.unpadded(optimizer).state,
                        modopt.sharding.unpadded(straight[name][1]).state,
                        f"{name} on {target}: state",
                        tolerance,
                    ),
                )
                shown = "bit for bit" if tolerance is None else f"largest relative difference {worst:.1e}"
                print(f"ok {name} {target}: {shown} ({time.perf_counter() - start:.1f} s)", flush=True)
            except Exception:  # noqa: BLE001 - reported per optimizer
                failed.append(name)
                print(f"FAIL {name}: restored onto {target}\n{traceback.format_exc()}", flush=True)
    sys.stdout.flush()
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or list(OPTIMIZERS))
