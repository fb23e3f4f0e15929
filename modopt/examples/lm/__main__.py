"""`python -m modopt.examples.lm`: see `modopt.examples.lm.job`."""

from __future__ import annotations

import os
import sys


def _cpu_devices(argv: list[str]) -> None:
    """With `--mesh DxM` and no accelerator, this process simulates its share of the mesh's
    devices on the CPU: the flag must be set before jax is imported."""
    if "--mesh" not in argv or os.environ.get("JAX_PLATFORMS", "cpu") != "cpu":
        return
    try:
        shape = [int(n) for n in argv[argv.index("--mesh") + 1].lower().split("x")]
        processes = int(argv[argv.index("--processes") + 1]) if "--processes" in argv else 1
    except (IndexError, ValueError):
        return  # the job's argument parser says what is wrong
    count = max(1, shape[0] * (shape[1] if len(shape) > 1 else 1) // processes)
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}"


if __name__ == "__main__":
    _cpu_devices(sys.argv[1:])
    from modopt.examples._interrupts import exit_with
    from modopt.examples.lm.job import main

    exit_with(main())
