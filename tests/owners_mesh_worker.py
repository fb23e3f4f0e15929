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


def main(names: list[str]) -> None:
    size = pod.SIZES["smoke"]
    print(f"goals {json.dumps(pod.GOALS)}", flush=True)
    for name in names:
        for layout in pod.layouts():
            row = pod.measure(name, layout, size, time_steps=False, check_steps=2)
            print(f"row {name} {layout} {json.dumps(row)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
