"""The matrix optimizers on 8 simulated devices: communication, repeated work, state, numbers.

Run by `test_owners_mesh.py` in a subprocess (the device count is set before jax is imported):
`python owners_mesh_worker.py [--alone NAME,...] NAME [NAME ...]`. For each optimizer and each
layout of `benchmarks/pod.py`, it compiles the optimizer step of the benchmark's transformer (at
its smoke size), reads what the compiled program costs each device, and runs 2 steps beside the
one-device step on the same gradients.
Prints the benchmark's goals (`goals {json}`), one line per optimizer and layout
(`row {json}`) and one per optimizer stepped on its own (`alone {json}`), for the test.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

# The checks compare programs compiled here, alike; LLVM's optimizations only cost compile time.
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

import pod  # noqa: E402 (sets the device count before jax is imported)
import testing_gc  # noqa: E402

testing_gc.collect_less()

STEPS = 2
# Shampoo's reference rule merges a matrix of at most 4096 entries into a vector before cutting
# it into blocks: at the smoke size's width 64, each 64 x 64 matrix becomes 32 rank-one blocks
# with a 128 x 128 statistic each (seconds a step on one CPU device). At width 128, as on the
# full-size model, each attention matrix is one block; three layers make a stack of 38 blocks
# (40 stored on 8 devices: little padding).
# GaLore's rank (16) is an eighth of the width there, as in the benchmark; at width 64 its
# projections would be a quarter of each matrix, and move as much more.
SIZES = {"shampoo": dict(pod.SIZES["smoke"], width=128, layers=3), "galore": dict(pod.SIZES["smoke"], width=128)}


def on_its_own(name: str) -> float:
    """The transform stepped on its own (no `Optimizer`) under `jax.set_mesh`: the owner scheme
    does not know how the parameters lie, and gathers each whole before moving it. The largest
    relative difference of the parameters and the state after 2 steps (on the same gradients)
    from one device's."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    import modopt

    size = dict(SIZES.get(name, pod.SIZES["smoke"]), layers=1)  # one block: the same kinds of units, in short stacks
    mesh, spec_fn, _, _ = pod.layouts()["tp+zero1"]
    shapes = pod.model_shapes(size["layers"], size["width"], size["vocab"])
    shardings = jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), spec_fn(shapes), is_leaf=lambda x: isinstance(x, PartitionSpec))
    host = pod.make_params(shapes, 0)
    tx = pod.OPTIMIZERS[name][0]()

    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return modopt.apply_updates(params, updates), state

    with jax.set_mesh(mesh):
        sharded = jax.block_until_ready((jax.device_put(host, shardings), jax.jit(tx.init)(jax.device_put(host, shardings))))
        # Each step's results laid out as its arguments: the second step runs the first's program.
        step = jax.jit(step, out_shardings=jax.tree_util.tree_map(lambda x: x.sharding, sharded))
        for grads in pod._check_gradients(shapes, STEPS):
            sharded = jax.block_until_ready(step(*sharded, jax.device_put(grads, shardings)))
    # The `Optimizer`'s one-device steps (its state is the transform's).
    one = pod._one_device_steps(name, size["layers"], size["width"], size["vocab"], STEPS)
    return pod._relative_difference(sharded, one)


def main(names: list[str], alone: list[str], layouts: list[str]) -> None:
    print(f"goals {json.dumps(pod.GOALS)}", flush=True)
    for name in names:
        for layout in layouts:
            row = pod.measure(name, layout, SIZES.get(name, pod.SIZES["smoke"]), time_steps=False, check_steps=STEPS)
            print(f"row {json.dumps({'name': name, 'layout': layout, 'row': row})}", flush=True)
        if name in alone:
            print(f"alone {json.dumps({'name': name, 'difference': on_its_own(name)})}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("names", nargs="+")
    parser.add_argument("--alone", default="", help="comma-separated: the optimizers also stepped on their own")
    parser.add_argument("--layouts", default=",".join(pod.layouts()), help="comma-separated layouts of benchmarks/pod.py")
    args = parser.parse_args()
    main(args.names, args.alone.split(","), args.layouts.split(","))
