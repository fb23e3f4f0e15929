"""Step and compile times of the optimizers beyond optax, for `beyond_optax.py`.

Each contender is the optimizer's update on the parameters of the digits main job's MLP
(`modopt.examples.digits.make_model`), jitted and donated as in `bench.py`'s catalog (modopt's
transform as an argument, so a new learning rate does not retrace), with the gradient of the
job's loss on its first batch. Compile time: tracing, lowering and compiling a fresh jitted step
(median of `compile_repeats`, the contenders interleaved). Step time: the median over `repeats`
runs of `block` consecutive steps (interleaved, see `interleaved`), divided by `block`: with
`block` a multiple of every refresh interval (SOAP's and Shampoo's 10), each run holds the same
number of refreshes, so the time is the amortized step.

This module also runs as a script (`python benchmarks/_beyond_timing.py psgd '{"repeats": 3,
...}'`) under another Python environment, to time `psgd_jax.kron` (which needs an older optax)
against `modopt.kron` in one process; it prints the results as JSON on its last line.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # run as a script, or imported from the tests
    sys.path.insert(0, HERE)

import bench  # noqa: E402  (the jitted, donated steps)
from _beyond_training import OPTIMIZERS, SHAMPOO  # noqa: E402

from modopt.examples import digits  # noqa: E402

LEARNING_RATE = 1e-3  # the step time does not depend on it
PSGD_FAILED = "psgd-jax not measured"


def params_and_grads() -> tuple[dict, dict]:
    """The main job's MLP parameters (named by their path in the model) and the gradient of its
    loss on the job's first batch (seed 0)."""
    model = digits.make_model(0)
    x, y, _, _ = digits.load_data(0)
    idx = digits._order(0, 1, len(x))[: digits.BATCH_SIZE]
    grads = eqx.filter_grad(digits.loss_fn)(model, jnp.asarray(x[idx]), jnp.asarray(y[idx]))
    named = lambda tree: {  # noqa: E731
        jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(eqx.filter(tree, eqx.is_array))
    }
    return named(model), named(grads)


class Contender:
    """A jitted, donated step of one optimizer, compiled afresh by `compile()`; a call runs
    `block` steps, feeding the parameters and state back in."""

    def __init__(self, tx: Any, kind: str, params: dict, grads: dict, block: int):
        self.tx, self.kind, self.grads, self.block = tx, kind, grads, block
        self.params = jax.tree.map(jnp.copy, params)
        self.state = tx.init(self.params)
        self.step: Callable | None = None

    def compile(self) -> float:
        """Seconds to trace, lower and compile a new jitted step (nothing cached)."""
        start = time.perf_counter()
        if self.kind == "modopt":
            _, jitted = bench.modopt_step(self.tx)  # a new function: nothing is cached
            compiled = jitted.lower(self.tx, self.params, self.state, self.grads).compile()
            self.step = lambda params, state, grads: compiled(self.tx, params, state, grads)
        else:  # an optax-style transform (a reference)
            _, jitted = bench.optax_step(self.tx)
            self.step = jitted.lower(self.params, self.state, self.grads).compile()
        return time.perf_counter() - start

    def __call__(self, steps: int | None = None):
        for _ in range(self.block if steps is None else steps):
            self.params, self.state = self.step(self.params, self.state, self.grads)
        return self.params


def interleaved(contenders: dict[str, Contender], repeats: int) -> dict[str, float]:
    """Median seconds of a call (a block of steps) of each contender, interleaved (forward, then
    backward). Each timed block follows one untimed step of the same contender: a light step
    timed right after a heavy one (Kron's, SOAP's refresh) was up to 3 times slower here."""
    for contender in contenders.values():
        jax.block_until_ready(contender())  # warm-up
    times: dict[str, list[float]] = {name: [] for name in contenders}
    order = list(contenders.items())
    for repeat in range(repeats):
        for name, contender in order if repeat % 2 == 0 else reversed(order):
            jax.block_until_ready(contender(1))
            start = time.perf_counter()
            jax.block_until_ready(contender())
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def time_contenders(makers: dict[str, tuple[Callable[[], Any], str]], sizes: dict) -> dict:
    """`{name: {"compile_s", "step_s"}}` for each `name: (make transform, kind)`: compile times
    (median of `compile_repeats`, interleaved; the last compiled step is the one timed) and
    amortized step times (see the module's docstring)."""
    params, grads = params_and_grads()
    contenders = {name: Contender(make(), kind, params, grads, sizes["block"]) for name, (make, kind) in makers.items()}
    compiles: dict[str, list[float]] = {name: [] for name in contenders}
    order = list(contenders.items())
    for repeat in range(sizes["compile_repeats"]):
        for name, contender in order if repeat % 2 == 0 else reversed(order):
            compiles[name].append(contender.compile())
    steps = interleaved(contenders, sizes["repeats"])
    return {
        name: {"compile_s": statistics.median(compiles[name]), "step_s": steps[name] / sizes["block"]}
        for name in contenders
    }


@contextlib.contextmanager
def precondition_reference() -> Iterator[Any]:
    """`precondition.distributed_shampoo`, with the three `jax.tree_*` aliases it calls (removed
    from jax in 0.4.26; they were `jax.tree_util`'s functions) put back while it is used."""
    added = [name for name in ("tree_map", "tree_flatten", "tree_unflatten") if not hasattr(jax, name)]
    for name in added:
        setattr(jax, name, getattr(jax.tree_util, name))
    try:
        from precondition import distributed_shampoo

        yield distributed_shampoo
    finally:
        for name in added:
            delattr(jax, name)


def reference_shampoo(reference: Any, learning_rate: float):
    """`distributed_shampoo` configured as `OPTIMIZERS["shampoo"]` (modopt's defaults are the
    reference's, except `block_size`, given here)."""
    config = dict(SHAMPOO)
    graft = config.pop("graft_type")
    return reference.distributed_shampoo(
        learning_rate,
        graft_type=getattr(reference.GraftingType, graft.upper()),
        generate_training_metrics=False,
        **config,
    )


def main_process_timings(names: list[str], sizes: dict) -> dict:
    """Every optimizer of `names` and `precondition-opt`'s Shampoo, timed together (interleaved)."""
    makers = {name: (lambda name=name: OPTIMIZERS[name](LEARNING_RATE), "modopt") for name in names}
    with precondition_reference() as reference, _quiet_float64():
        if "shampoo" in names:
            makers["precondition-opt shampoo"] = (lambda: reference_shampoo(reference, LEARNING_RATE), "optax")
        return time_contenders(makers, sizes)


@contextlib.contextmanager
def _quiet_float64():
    # The reference's roots ask for float64, which jax without x64 truncates to float32 (a warning).
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Explicitly requested dtype float64")
        yield


# ---- psgd-jax, in another environment ------------------------------------------------------


def psgd_timings(python: str | None, sizes: dict, timeout: float = 900) -> dict:
    """`modopt.kron` against `psgd_jax.kron` (defaults, the same learning rate), timed in one
    process of `python` (an environment where psgd-jax imports); or why they were not."""
    import subprocess

    if not python:
        return {"error": f"{PSGD_FAILED}: no Python environment with psgd-jax given (--psgd-python)"}
    root = os.path.dirname(HERE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, HERE, os.environ.get("PYTHONPATH", "")])}
    try:
        done = subprocess.run(
            [python, os.path.join(HERE, "_beyond_timing.py"), "psgd", json.dumps(sizes)],
            capture_output=True, text=True, timeout=timeout, env=env, cwd=root,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as error:
        return {"error": f"{PSGD_FAILED}: {error}"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"{PSGD_FAILED}: {python} exited with {done.returncode}: {tail}"}
    return json.loads(lines[-1])


def _psgd_worker(sizes: dict) -> dict:
    import importlib.metadata

    import optax
    from psgd_jax.kron import kron as psgd_kron

    makers = {
        "kron": (lambda: OPTIMIZERS["kron"](LEARNING_RATE), "modopt"),
        "psgd-jax kron": (lambda: psgd_kron(LEARNING_RATE), "optax"),
    }
    with contextlib.redirect_stdout(sys.stderr):  # psgd-jax prints its state's size
        times = time_contenders(makers, sizes)
    versions = {"psgd-jax": importlib.metadata.version("psgd-jax"), "optax": optax.__version__, "jax": jax.__version__}
    return {"times": times, "versions": versions}


if __name__ == "__main__":
    if sys.argv[1:2] != ["psgd"]:
        sys.exit("usage: _beyond_timing.py psgd SIZES_JSON")
    print(json.dumps(_psgd_worker(json.loads(sys.argv[2]))))
