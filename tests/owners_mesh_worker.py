"""The matrix optimizers on 8 simulated devices: communication, repeated work, state, numbers.

Run by `test_owners_mesh.py` in a subprocess (the device count is set before jax is imported):
`python owners_mesh_worker.py NAME [NAME ...]`. For each optimizer and each layout of
`benchmarks/pod.py` (FSDP on a mesh of 8; tensor parallelism with ZeRO-1 on 2 x 4), it compiles
the optimizer step of the benchmark's transformer (at its smoke size), reads what the compiled
program costs each device, and runs 2 steps beside the one-device step on the same gradients.
Prints the benchmark's goals (`goals {json}`) and one line per optimizer and layout,
`row NAME LAYOUT {json}`, for the test to check.
"""

from __future__ import annotations

import json
import os
import sys

# The checks compare programs compiled here, alike; LLVM's optimizations only cost compile time.
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

import pod  # noqa: E402 (sets the device count before jax is imported)


def on_its_own(name: str) -> float:
    """The transform stepped on its own (no `Optimizer`) under `jax.set_mesh`, its gradients
    taken in the same jitted step: the owner scheme does not know how the parameters lie and
    gathers each whole before moving it. The largest relative difference of the parameters and
    the state after 2 steps from one device's."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    import modopt

    size = pod.SIZES["smoke"]
    mesh, spec_fn, _, batch_spec = pod.layouts()["tp+zero1"]
    shapes = pod.model_shapes(size["layers"], size["width"], size["vocab"])
    shardings = jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), spec_fn(shapes), is_leaf=lambda x: isinstance(x, PartitionSpec))
    host = pod.make_params(shapes, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (size["batch"], size["context"] + 1), 0, size["vocab"])
    tx = pod.OPTIMIZERS[name][0]()

    def step(params, state, tokens):
        updates, state = tx.update(jax.grad(pod.forward_loss)(params, tokens), state, params)
        return modopt.apply_updates(params, updates), state

    one = (host, tx.init(host))
    with jax.set_mesh(mesh):
        sharded = (jax.device_put(host, shardings), jax.jit(tx.init)(jax.device_put(host, shardings)))
        placed = jax.device_put(tokens, NamedSharding(mesh, batch_spec))
        for _ in range(2):
            one = jax.jit(step)(*one, tokens)
            sharded = jax.block_until_ready(jax.jit(step)(*sharded, placed))
    return pod._relative_difference(sharded, one)


def main(names: list[str]) -> None:
    size = pod.SIZES["smoke"]
    print(f"goals {json.dumps(pod.GOALS)}", flush=True)
    for name in names:
        for layout in pod.layouts():
            row = pod.measure(name, layout, size, time_steps=False, check_steps=2)
            print(f"row {name} {layout} {json.dumps(row)}", flush=True)
        if name != "adamw":
            print(f"alone {name} {on_its_own(name)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
