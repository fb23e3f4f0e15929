"""modopt against optax (and torch.optim when installed) on the same work, in one process.

Run `python benchmarks/bench.py` (full sizes; writes benchmarks/results.txt and results.json)
or `python benchmarks/bench.py --size tiny` (small; writes nothing unless `--out`; `--size smoke`,
cheaper still, is the test suite's run);
`--cases 8` (or `4,8`) runs only those cases (and writes nothing unless `--out`).
Each timing is the median of repeated runs after warm-up, with the runs being compared
interleaved so that drift in the machine's load hits them alike. Cases:

1. an AdamW step on one 16.8M-element float32 array (134M on a GPU), donated; with the fraction of the
   machine's streaming bandwidth reached (measured here by a jitted, donated `x + 1` on as many
   bytes: memory on a CPU, HBM on a GPU);
2. the same on 1000 leaves of 16k elements;  3. on 1000 leaves of 16 elements;
   cases 1-3 time the transform's update in `jax.jit` (as optax's), `Optimizer.step` in
   `modopt.jit_step` (which groups small leaves), and a floor: a jitted step that only passes
   the parameters through (the cost of the arrays crossing the jit boundary);
4. a full train step of an Equinox MLP of about 100k parameters: the documented pattern
   (`modopt.jit_step`), `optimizer.step` under `jax.jit` and under `eqx.filter_jit`;
5. compile time of the jitted step for 100 and 1000 leaves (the transform's, and `Optimizer.step`'s);
6. traces when the learning rate changes and when the same optimizer is rebuilt;
7. memory of the donated step against params + grads + state (does it run in place?);
8. every named optimizer of the catalog against its optax counterpart, on the parameter tree
   of the MLP of case 4, as a ratio; with the hyperparameters runtime arrays (a new value does
   not compile again), modopt's transform as an argument against `optax.inject_hyperparams`;
9. a train step of the same MLP written in Flax NNX (when Flax is installed): modopt's
   `NnxOptimizer` against Flax's `nnx.Optimizer` with optax's adam, both under `nnx.jit` (the
   pattern of Flax's guides) and both in `nnx.cached_partial` (the pattern Flax's performance
   guide gives for small steps, which skips the graph traversal per call).

On a GPU the same cases run unchanged (torch.optim joins only when it has CUDA), and the
bandwidth line gives AdamW's fraction of the measured HBM bandwidth and of the device's
nominal peak.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

# torch's OpenMP threads would otherwise spin after each of its runs, slowing whatever runs next.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import modopt

HERE = os.path.dirname(os.path.abspath(__file__))
OPTIMIZER = "modopt Optimizer in jit_step"

SIZES = {
    "full": {
        # On a GPU, one 16.8M-element step takes about 0.15 ms, of which dispatch would be a
        # tenth: its bandwidth (case 1 and the streaming reference) is measured on 134M elements.
        "big": 4096 * 4096, "big_gpu": 2**27, "leaves": 1000, "leaf": 16384, "tiny_leaf": 16, "repeats": 20,
        "width": 290,
        "catalog": None, "catalog_repeats": 300,
    },
    "tiny": {
        "big": 4096, "leaves": 20, "leaf": 64, "tiny_leaf": 4, "repeats": 3, "width": 16,
        # Optimizers of three kinds of step (plain, with the loss value, with per-example gradients).
        "catalog": ("adamw", "polyak_sgd", "dpsgd"), "catalog_repeats": 3,
    },
    # The test suite's smoke run (tests/test_benchmarks.py): every case and every code path of
    # tiny, the same three kinds of catalog step, one timing each (its cost is compiling: each
    # compile case compiles its three steps once, not three times), and 8 leaves, the fewest
    # that `Optimizer` steps as flat buffers (its grouped path, as in the full run).
    "smoke": {
        "big": 4096, "leaves": 8, "leaf": 64, "tiny_leaf": 4, "repeats": 1, "width": 16,
        "catalog": ("adamw", "polyak_sgd", "dpsgd"), "catalog_repeats": 1, "compile_repeats": 1,
    },
}  # fmt: skip

# Nominal peak memory bandwidth (GB/s) of accelerators, by a substring of `device_kind`.
NOMINAL_HBM_GBPS = {"H200": 4800.0, "H100 PCIe": 2000.0, "H100": 3350.0, "A100": 2039.0, "L4": 300.0}


def median_seconds(run: Callable[[], Any], repeats: int, warmup: int = 3) -> float:
    return compare({"run": run}, repeats, warmup)["run"]


def compare(runs: dict[str, Callable[[], Any]], repeats: int, warmup: int = 3) -> dict[str, float]:
    """Median seconds of each run, with the runs interleaved so that drift hits all alike.

    On short steps, a call right after another run's calls was measurably slower (up to 20% on
    a 0.1 ms step): each sample times the second of two calls in a row (a step as it runs in
    a training loop), and the order rotates each round, so every run is timed alike. (An
    order alternating forward and backward gave the middle one of three runs only calls after
    another's, the first and last ones half their calls after their own: 5% apart on the same step.)
    """
    for run in runs.values():
        for _ in range(warmup):
            jax.block_until_ready(run())
    times: dict[str, list[float]] = {name: [] for name in runs}
    order = list(runs.items())
    for repeat in range(repeats):
        shift = repeat % len(order)
        for name, run in order[shift:] + order[:shift]:
            jax.block_until_ready(run())  # right after another run's calls: not timed
            start = time.perf_counter()
            jax.block_until_ready(run())
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def leaves_of(count: int, size: int) -> dict:
    keys = jax.random.split(jax.random.key(0), count)
    return {f"p{i:04d}": jax.random.normal(k, (size,)) for i, k in enumerate(keys)}


# ---- the steps compared --------------------------------------------------------------------


def modopt_step(tx, extra_args: Callable | None = None):
    """`(params, state, grads) -> (params, state)` with modopt's transform as an argument (its
    hyperparameters are arrays: a new value does not retrace)."""

    def step(tx, params, state, grads):
        grads, extra = extra_args(params, grads) if extra_args else (grads, {})
        updates, state = tx.update(grads, state, params, **extra)
        return modopt.apply_updates(params, updates), state

    donated = jax.jit(step, donate_argnums=(1, 2))
    return lambda params, state, grads: donated(tx, params, state, grads), donated


def optax_step(tx, extra_args: Callable | None = None, library: Any = optax):
    """`(params, state, grads) -> (params, state)` as optax's users write it, the transform closed
    over (its hyperparameters compiled in as constants); with `library=modopt` and modopt's
    transform, the same code ported by one import."""

    def step(params, state, grads):
        grads, extra = extra_args(params, grads) if extra_args else (grads, {})
        updates, state = tx.update(grads, state, params, **extra)
        return library.apply_updates(params, updates), state

    donated = jax.jit(step, donate_argnums=(0, 1))
    return donated, donated


class Loop:
    """Runs a donated step repeatedly, feeding its outputs back in."""

    def __init__(self, step, params, state, grads):
        self.step, self.params, self.state, self.grads = step, params, state, grads

    def __call__(self):
        self.params, self.state = self.step(self.params, self.state, self.grads)
        return self.params


def optimizer_step(params: dict):
    """The documented pattern on a tree of arrays: `optimizer.step` in `modopt.jit_step` (which
    groups many small leaves into flat buffers, see `modopt.Optimizer`)."""
    step = modopt.jit_step(lambda params, optimizer, grads: optimizer.step(params, grads))
    return step, modopt.Optimizer(modopt.adamw(1e-3), params)


# What any step costs here before doing any arithmetic: the parameters and gradients go in and
# the parameters come out, donated, as in the steps compared (but without any state).
FLOOR = "floor: params and grads in, params out"
_unchanged = jax.jit(lambda params, state, grads: (params, state), donate_argnums=(0, 1))


def adam_case(params: dict, repeats: int) -> dict:
    grads = jax.tree.map(lambda p: jnp.full_like(p, 1e-3), params)
    fresh = lambda: jax.tree.map(jnp.copy, params)  # noqa: E731
    ours_tx, theirs_tx = modopt.adamw(1e-3), optax.adamw(1e-3)
    ours, _ = modopt_step(ours_tx)
    theirs, _ = optax_step(theirs_tx)
    ours_params, their_params, documented_params = fresh(), fresh(), fresh()
    documented, optimizer = optimizer_step(documented_params)
    times = compare(
        {
            "modopt": Loop(ours, ours_params, ours_tx.init(ours_params), grads),
            "optax": Loop(theirs, their_params, theirs_tx.init(their_params), grads),
            OPTIMIZER: Loop(documented, documented_params, optimizer, grads),
            FLOOR: Loop(_unchanged, fresh(), None, grads),
        },
        repeats,
    )
    times.update(torch_adamw(params, repeats))
    return times


def torch_adamw(params: dict, repeats: int) -> dict:
    """torch.optim.AdamW (fused, foreach, default) on the same tensors, if torch is installed:
    on the CPU next to JAX's CPU backend, on CUDA next to JAX's GPU backend."""
    try:
        import torch
    except ImportError:
        return {}
    if jax.default_backend() == "cpu":
        device, sync = "cpu", lambda: None
    elif jax.default_backend() == "gpu" and torch.cuda.is_available():
        device, sync = "cuda", torch.cuda.synchronize
    else:
        return {"torch": f"n/a (no torch device for JAX's {jax.default_backend()} backend)"}
    tensors = [torch.nn.Parameter(torch.from_numpy(np.array(p)).to(device)) for p in params.values()]
    for t in tensors:
        t.grad = torch.full_like(t, 1e-3)
    times = {}
    for variant in ("fused", "foreach", "default"):
        flags = {"fused": {"fused": True}, "foreach": {"foreach": True}, "default": {"foreach": False}}[variant]
        try:
            optimizer = torch.optim.AdamW(tensors, lr=1e-3, **flags)

            def run(o=optimizer):
                o.step()
                sync()

            times[f"torch {variant}"] = median_seconds(run, repeats)
        except (RuntimeError, TypeError) as error:  # fused may be unavailable on this build
            times[f"torch {variant}"] = f"n/a ({error})"
    return times


def bandwidth(elements: int, repeats: int) -> float:
    """Bytes per second of a jitted, donated `x + 1` (reads and writes every byte once)."""
    x = jnp.zeros((elements,), jnp.float32)
    add = jax.jit(lambda x: x + 1.0, donate_argnums=0)
    loop = [x]

    def run():
        loop[0] = add(loop[0])
        return loop[0]

    return 2 * 4 * elements / median_seconds(run, repeats)


def mlp_case(width: int, repeats: int) -> dict:
    """A train step of an Equinox MLP, where per-call overhead is a large part of the step.

    optax under `jax.jit` (the model's arrays and the state as arguments) against modopt's
    `Optimizer.step` in the documented pattern (`modopt.jit_step`), under `jax.jit` (the
    model's arrays and the optimizer as arguments), and under `eqx.filter_jit`.
    """
    model = eqx.nn.MLP(64, 10, width, 2, key=jax.random.key(0))
    x, y = jnp.ones((32, 64)), jnp.zeros((32, 10))
    params, static = eqx.partition(model, eqx.is_array)

    def loss(model):
        return jnp.mean((jax.vmap(model)(x) - y) ** 2)

    def train_step(model, optimizer):
        return optimizer.step(model, eqx.filter_grad(loss)(model))

    def ours_jax_jit(params, optimizer):
        model, optimizer = train_step(eqx.combine(params, static), optimizer)
        return eqx.filter(model, eqx.is_array), optimizer

    tx = optax.adamw(1e-3)

    def theirs(params, state):
        updates, state = tx.update(jax.grad(lambda p: loss(eqx.combine(p, static)))(params), state, params)
        return optax.apply_updates(params, updates), state

    def looped(step, *state):
        state = list(state)

        def run():
            state[:] = step(*state)
            return state[0]

        return run

    copy = lambda: jax.tree.map(jnp.copy, params)  # noqa: E731
    optimizer = lambda: modopt.Optimizer(modopt.adamw(1e-3), model)  # noqa: E731
    times = compare(
        {
            "modopt": looped(modopt.jit_step(train_step), eqx.combine(copy(), static), optimizer()),
            "optax": looped(jax.jit(theirs, donate_argnums=(0, 1)), copy(), tx.init(params)),
            "modopt in jax.jit": looped(jax.jit(ours_jax_jit, donate_argnums=(0, 1)), copy(), optimizer()),
            "modopt in eqx.filter_jit": looped(
                eqx.filter_jit(train_step, donate="all"), eqx.combine(copy(), static), optimizer()
            ),
        },
        repeats * 10,
    )
    return {**times, "parameters": sum(p.size for p in jax.tree.leaves(params))}


def compile_case(count: int, size: int, repeats: int = 3) -> dict:
    """Seconds to trace, lower and compile a fresh jitted AdamW step (median, interleaved): the
    transforms' update in `jax.jit`, and `Optimizer.step` in `modopt.jit_step`."""
    params = leaves_of(count, size)
    grads = jax.tree.map(jnp.ones_like, params)
    ours_tx, theirs_tx = modopt.adamw(1e-3), optax.adamw(1e-3)
    ours_state, their_state = ours_tx.init(params), theirs_tx.init(params)

    def ours():
        _, step = modopt_step(ours_tx)  # a new function each time: nothing is cached
        return step.lower(ours_tx, params, ours_state, grads).compile()

    def theirs():
        _, step = optax_step(theirs_tx)
        return step.lower(params, their_state, grads).compile()

    def documented():
        step, optimizer = optimizer_step(params)  # a new step each time: nothing is cached
        return step.lower(params, optimizer, grads).compile()

    timings = {"modopt": [], "optax": [], OPTIMIZER: []}
    for _ in range(repeats):
        for name, build in (("modopt", ours), ("optax", theirs), (OPTIMIZER, documented)):
            start = time.perf_counter()
            build()
            timings[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in timings.items()}


def trace_case() -> dict:
    """Traces of a jitted step when the learning rate changes and when the optimizer is rebuilt,
    under `eqx.filter_jit` and `modopt.jit_step`; optax's closures retrace."""
    params = {"w": jnp.ones(8)}
    grads = {"w": jnp.ones(8)}
    traces = {"modopt": 0, "modopt jit_step": 0, "optax": 0}

    @eqx.filter_jit
    def ours(params, optimizer):
        traces["modopt"] += 1
        return optimizer.step(params, grads)

    @modopt.jit_step
    def ours_jit_step(params, optimizer):
        traces["modopt jit_step"] += 1
        return optimizer.step(params, grads)

    for step in (ours, ours_jit_step):
        optimizer = modopt.Optimizer(modopt.adam(1e-3), params)
        p, optimizer = step(jax.tree.map(jnp.copy, params), optimizer)
        p, optimizer = step(p, optimizer.set(learning_rate=1e-4))  # a new learning rate
        step(p, modopt.Optimizer(modopt.adam(1e-3), params))  # the same optimizer, rebuilt

    def theirs_for(tx):
        @jax.jit
        def step(params, state):
            traces["optax"] += 1
            updates, state = tx.update(grads, state, params)
            return optax.apply_updates(params, updates), state

        return step

    for tx in (optax.adam(1e-3), optax.adam(1e-4), optax.adam(1e-3)):  # first, new rate, rebuilt
        theirs_for(tx)(params, tx.init(params))
    return {f"{name} retraces": count - 1 for name, count in traces.items()}


def memory_case(count: int, size: int) -> dict:
    """Whether the donated step runs in place: XLA's buffer assignment for the compiled step."""
    params = leaves_of(count, size)
    grads = jax.tree.map(jnp.ones_like, params)
    tx = modopt.adamw(1e-3)
    _, step = modopt_step(tx)
    state = tx.init(params)
    memory = step.lower(tx, params, state, grads).compile().memory_analysis()
    nbytes = lambda tree: sum(x.nbytes for x in jax.tree.leaves(tree))  # noqa: E731
    return {
        "params+grads+state bytes": nbytes(params) + nbytes(grads) + nbytes(state),
        "params+state bytes": nbytes(params) + nbytes(state),
        "aliased (reused) bytes": memory.alias_size_in_bytes,
        "temporary bytes": memory.temp_size_in_bytes,
    }


# ---- the catalog ---------------------------------------------------------------------------


def _quadratic(params):
    return 0.5 * sum(jnp.sum(p**2) for p in jax.tree.leaves(params))


def _value(params, grads):
    return grads, {"value": _quadratic(params)}


def _line_search(params, grads):
    return grads, {"value": _quadratic(params), "grad": grads, "value_fn": _quadratic}


def _per_example(params, grads):
    return jax.tree.map(lambda g: jnp.broadcast_to(g, (4, *g.shape)), grads), {}


class Entry(NamedTuple):
    """A catalog row's optimizers, built alike: modopt's, optax's, and optax's with its
    hyperparameters as arrays of its state (`optax.inject_hyperparams`: optax's way to change one
    without compiling again, as modopt's transform does as an argument); and the extra work a step
    needs (`None`: none; else a function of `(params, grads)` giving the gradients and the extra
    arguments `update` takes)."""

    ours: Callable[[], Any]
    theirs: Callable[[], Any]
    injected: Callable[[], Any]
    extra_args: Callable | None = None


def _same(name: str, *args: Any, extra_args: Callable | None = None, static: tuple = (), **kwargs: Any) -> Entry:
    """`modopt.name(*args, **kwargs)`, `optax.name(...)` (or `optax.contrib.name`) alike, and
    optax's with its hyperparameters injected (those named in `static` kept static: numbers that
    shapes depend on, which `inject_hyperparams` would otherwise trace)."""
    # `None` where this optax lacks the name (an older one, as in psgd-jax's environment):
    # the entry fails only if run.
    theirs = getattr(optax, name, None) or getattr(optax.contrib, name, None)
    return Entry(
        lambda: _quiet(lambda: getattr(modopt, name)(*args, **kwargs)),
        lambda: _quiet(lambda: theirs(*args, **kwargs)),
        lambda: _quiet(lambda: optax.inject_hyperparams(theirs, static_args=static)(*args, **kwargs)),
        extra_args,
    )


def _quiet(make: Callable[[], Any]) -> Any:
    """Builds a transform that warns about a deprecation (optax's, or modopt's own alias of it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return make()


# Every named optimizer optax also has (the lowercase constructors of `modopt.optimizers`).
CATALOG: dict[str, Entry] = {
    **{
        name: _same(name, 1e-3)
        for name in (
            "adabelief", "adadelta", "adagrad", "adam", "adamax", "adamaxw", "adamw", "adan",
            "amsgrad", "fromage", "lamb", "lars", "lion", "nadam", "nadamw", "novograd", "optimistic_adam_v2",
            "optimistic_gradient_descent", "radam", "rmsprop", "rprop", "sgd", "sign_sgd", "signum", "sm3", "yogi",
        )
    },
    "adafactor": _same("adafactor", 1e-3, static=("min_dim_size_to_factor", "dtype_momentum")),
    "optimistic_adam": _same("optimistic_adam", 1e-3, optimism=1e-3),
    "noisy_sgd": _same("noisy_sgd", 1e-3, key=jax.random.key(0), static=("key",)),
    "polyak_sgd": _same("polyak_sgd", extra_args=_value),
    "lbfgs": _same("lbfgs", extra_args=_line_search, static=("memory_size",)),
    "dpsgd": _same("dpsgd", 1e-3, 1.0, 1.1, seed=0, extra_args=_per_example, static=("seed",)),
}  # fmt: skip


def mlp_params(width: int) -> dict:
    """The parameters of case 4's MLP (64 -> width -> width -> 10) as a dict of arrays."""
    shapes = {"w0": (width, 64), "b0": (width,), "w1": (width, width), "b1": (width,), "w2": (10, width), "b2": (10,)}
    keys = jax.random.split(jax.random.key(1), len(shapes))
    return {name: 0.1 * jax.random.normal(k, shape) for (name, shape), k in zip(shapes.items(), keys)}


def catalog_case(width: int, repeats: int, names: tuple[str, ...] | None = None) -> dict:
    """Each named optimizer against optax, on the same parameters and gradients, donated.

    "modopt" is optax's own step function with modopt's transform in place of optax's (the
    code a port by one import runs: the transform closed over, its hyperparameters constants);
    "modopt arguments" passes the transform as an argument of the jitted step, so that a new
    hyperparameter value does not compile again (its scalars cross the jit boundary per call);
    "modopt jit_step" is the documented pattern, `optimizer.step` in `modopt.jit_step`, which
    also builds the new `Optimizer` object each step. "optax injected" is optax's way to the
    same freedom as "modopt arguments": `optax.inject_hyperparams`, its hyperparameters arrays
    of its state.
    """
    params = mlp_params(width)
    grads = jax.tree.map(lambda p: 1e-2 * jnp.cos(p), params)
    results = {}
    for name in names or sorted(CATALOG):
        entry = CATALOG[name]
        extra_args = entry.extra_args
        ours_tx, pure_tx, theirs_tx, injected_tx = entry.ours(), entry.ours(), entry.theirs(), entry.injected()

        @modopt.jit_step
        def documented(params, optimizer, grads, extra_args=extra_args):
            grads, extra = extra_args(params, grads) if extra_args else (grads, {})
            return optimizer.step(params, grads, **extra)

        steps = {
            "modopt": (optax_step(pure_tx, extra_args, library=modopt)[0], pure_tx),
            "optax": (optax_step(theirs_tx, extra_args)[0], theirs_tx),
            "modopt arguments": (modopt_step(pure_tx, extra_args)[0], pure_tx),
            "optax injected": (optax_step(injected_tx, extra_args)[0], injected_tx),
        }
        # Every state leaf its own buffer (an init may put one array in two places): all are donated.
        owned = lambda tx, params: jax.tree.map(jnp.copy, tx.init(params))  # noqa: E731
        runs = {}
        for key, (step, tx) in steps.items():
            step_params = jax.tree.map(jnp.copy, params)
            runs[key] = Loop(step, step_params, owned(tx, step_params), grads)
        ours_params = jax.tree.map(jnp.copy, params)
        runs["modopt jit_step"] = Loop(documented, ours_params, modopt.Optimizer(ours_tx, ours_params), grads)
        results[name] = compare(runs, repeats)
    return results


# ---- Flax NNX ------------------------------------------------------------------------------


def nnx_case(width: int, repeats: int) -> dict | None:
    """A train step of case 4's MLP in Flax NNX: modopt's `NnxOptimizer` against Flax's
    `nnx.Optimizer` (optax's adam), under `nnx.jit` and in `nnx.cached_partial`; `None` without Flax."""
    try:
        from flax import nnx

        from modopt.integrations.flax import NnxOptimizer
    except ImportError:
        return None

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.layers = nnx.List(
                [nnx.Linear(64, width, rngs=rngs), nnx.Linear(width, width, rngs=rngs), nnx.Linear(width, 10, rngs=rngs)]
            )

        def __call__(self, x):
            for layer in self.layers[:-1]:
                x = jax.nn.relu(layer(x))
            return self.layers[-1](x)

    x, y = jnp.ones((32, 64)), jnp.zeros((32, 10))

    def train_step(model, optimizer):
        grads = nnx.grad(lambda model: jnp.mean((model(x) - y) ** 2))(model)
        optimizer.update(model, grads)

    step = nnx.jit(train_step, donate_argnums=(0, 1))

    def make(ours: bool):
        model = MLP(nnx.Rngs(0))
        if ours:
            return model, NnxOptimizer(model, modopt.adam(1e-3), wrt=nnx.Param)
        return model, nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)

    def jitted(model, optimizer):
        return lambda: (step(model, optimizer), model.layers[0].kernel[...])[1]

    def cached(model, optimizer):
        run = nnx.cached_partial(step, model, optimizer)
        return lambda: (run(), model.layers[0].kernel[...])[1]

    times = compare(
        {
            "modopt": jitted(*make(True)),
            "optax": jitted(*make(False)),
            "modopt in nnx.cached_partial": cached(*make(True)),
            "optax in nnx.cached_partial": cached(*make(False)),
        },
        repeats * 10,
    )
    return times


# ---- report --------------------------------------------------------------------------------


def machine() -> str:
    device = jax.devices()[0]
    kind = f", {device.device_kind}" if device.platform != "cpu" else ""
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {device.platform}{kind}"


class Timer:
    """Seconds spent in each case, for the report."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.last = time.perf_counter()

    def __call__(self, case: str) -> None:
        now = time.perf_counter()
        self.seconds[case] = round(now - self.last, 1)
        self.last = now


CASES = tuple(range(1, 10))


def run(size: str, cases: tuple[int, ...] = CASES) -> dict:
    """The cases asked for (all by default), with the machine and versions."""
    s = SIZES[size]
    start = time.perf_counter()
    results: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "backend": jax.default_backend(),
        "device kind": jax.devices()[0].device_kind,
        "versions": {"jax": jax.__version__, "optax": optax.__version__, "modopt": modopt.__version__},
        "size": size,
    }
    timer = Timer()
    if 1 in cases:
        elements = s.get("big_gpu", s["big"]) if jax.default_backend() == "gpu" else s["big"]
        big = {"w": jax.random.normal(jax.random.key(0), (elements,))}
        results["1 one big array"] = adam_case(big, s["repeats"])
        results["1 one big array"]["bandwidth GB/s"] = bandwidth(elements, s["repeats"]) / 1e9
        results["1 one big array"]["elements"] = elements
        timer("1")
    if 2 in cases:
        results["2 many 16k leaves"] = adam_case(leaves_of(s["leaves"], s["leaf"]), s["repeats"])
        timer("2")
    if 3 in cases:
        results["3 many tiny leaves"] = adam_case(leaves_of(s["leaves"], s["tiny_leaf"]), s["repeats"])
        timer("3")
    if 4 in cases:
        results["4 MLP train step"] = mlp_case(s["width"], s["repeats"])
        timer("4")
    if 5 in cases:
        compile_repeats = s.get("compile_repeats", 3)
        results["5 compile, 100 leaves"] = compile_case(min(100, s["leaves"]), s["tiny_leaf"], compile_repeats)
        results["5 compile, 1000 leaves"] = compile_case(s["leaves"], s["tiny_leaf"], compile_repeats)
        timer("5")
    if 6 in cases:
        results["6 traces"] = trace_case()
        timer("6")
    if 7 in cases:
        results["7 donated step memory"] = memory_case(s["leaves"], s["leaf"])
        timer("7")
    if 8 in cases:
        results["8 catalog"] = catalog_case(s["width"], s["catalog_repeats"], s["catalog"])
        results["8 catalog parameters"] = sum(p.size for p in jax.tree.leaves(mlp_params(s["width"])))
        timer("8")
    if 9 in cases:
        nnx_row = nnx_case(s["width"], s["repeats"])
        if nnx_row is not None:
            results["9 NNX MLP train step"] = nnx_row
        timer("9")
    results["seconds"] = time.perf_counter() - start
    results["seconds by case"] = timer.seconds
    return results


def bandwidth_line(results: dict) -> str:
    """AdamW's bytes per second on the big array against the streaming bandwidth measured."""
    big = results["1 one big array"]
    adam_bytes = 28 * big["elements"]  # reads p, g, mu, nu; writes p, mu, nu
    achieved = adam_bytes / big["modopt"] / 1e9
    streaming = big["bandwidth GB/s"]
    memory = "HBM" if results.get("backend") == "gpu" else "memory"
    line = (
        f"bandwidth: modopt AdamW moves {achieved:.1f} GB/s (28 bytes per parameter) of the {streaming:.1f} GB/s "
        f"a jitted x + 1 streams through {memory} here ({achieved / streaming:.0%})"
    )
    nominal = next((v for k, v in NOMINAL_HBM_GBPS.items() if k in results.get("device kind", "")), None)
    if results.get("backend") == "gpu" and nominal:
        line += f"; {achieved / nominal:.0%} of the nominal {nominal:.0f} GB/s of a {results['device kind']}"
    return line


def table(results: dict) -> str:
    lines = [f"modopt vs optax, {results['date']}, {results['machine']}, {results['versions']}", ""]
    lines.append(f"{'case':28s} {'modopt':>12s} {'optax':>12s} {'ratio':>7s}  others (ratio)")
    for name, row in results.items():
        if not isinstance(row, dict) or not isinstance(row.get("modopt"), float):
            continue
        lines.append(f"{name:28s} {_fmt(row['modopt']):>12s} {_fmt(row['optax']):>12s} {row['modopt'] / row['optax']:7.2f}")
        for key, value in row.items():
            if key in ("modopt", "optax"):
                continue
            if key.startswith("torch") and isinstance(value, float):
                note = f"modopt / {key}: {row['modopt'] / value:.2f}"
                if isinstance(row.get(OPTIMIZER), float):
                    note += f", Optimizer / {key}: {row[OPTIMIZER] / value:.2f}"
            elif key.startswith("modopt") and isinstance(row.get("optax" + key[6:]), float):
                twin = "optax" + key[6:]  # the same pattern with optax (`optax in nnx.cached_partial`)
                note = f"{key} / {twin}: {value / row[twin]:.2f}"
            elif key.startswith("modopt") and isinstance(value, float):
                note = f"{key} / optax: {value / row['optax']:.2f}"
            else:
                note = ""
            lines.append(f"{'':28s} {key + ': ' + _fmt(value, key):>40s}  {note}")
    if "1 one big array" in results:
        lines.append("\n" + bandwidth_line(results))
    if "6 traces" in results:
        lines.append(f"traces: {results['6 traces']}")
    if "7 donated step memory" in results:
        lines.append(f"memory: {results['7 donated step memory']}")
    if "8 catalog" in results:
        lines.extend(catalog_table(results))
    lines.append(f"\nwhole run: {results['seconds']:.0f} s (by case: {results['seconds by case']})")
    return "\n".join(lines)


def catalog_table(results: dict) -> list[str]:
    """Case 8's lines: each optimizer's times and ratios to optax, and their geometric means."""
    lines = []
    catalog = results["8 catalog"]
    lines.append(f"\n8 catalog: each named optimizer's donated step on the MLP's {results['8 catalog parameters']:,} parameters")
    lines.append(
        "modopt: optax's step function with modopt's transform (a port by one import); arguments: the transform "
        "an argument of the jitted step (a new hyperparameter value does not compile again); jit_step: "
        "optimizer.step in modopt.jit_step (the documented pattern); optax injected: optax.inject_hyperparams "
        "(optax's way not to compile again), next to which arguments/injected is the ratio"
    )
    columns = {"modopt": "modopt", "modopt arguments": "arguments", "modopt jit_step": "jit_step", "optax injected": "injected"}
    header = "".join(f" {title:>12s} {'ratio':>7s}" for title in columns.values())
    lines.append(f"{'optimizer':28s} {'optax':>12s}{header} {'arguments/injected':>19s}")
    for name, row in catalog.items():
        cells = "".join(f" {_fmt(row[key]):>12s} {row[key] / row['optax']:7.2f}" for key in columns)
        flag = "  <- slower than optax by more than 10%" if row["modopt"] / row["optax"] > 1.10 else ""
        lines.append(f"{name:28s} {_fmt(row['optax']):>12s}{cells} {row['modopt arguments'] / row['optax injected']:19.2f}{flag}")
    mean = lambda key, over="optax": float(np.exp(np.mean([np.log(r[key] / r[over]) for r in catalog.values()])))  # noqa: E731
    means = "".join(f" {'':12s} {mean(key):7.2f}" for key in columns)
    lines.append(f"{'geometric mean':28s} {'':12s}{means} {mean('modopt arguments', 'optax injected'):19.2f}")
    return lines


def _fmt(value: Any, key: str = "") -> str:
    """Seconds as milliseconds; other numbers as they are."""
    if isinstance(value, float) and "GB/s" not in key:
        return f"{value * 1e3:.3f} ms"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument(
        "--out", help="folder for results.txt and results.json (default: benchmarks/ for --size full, none for tiny)"
    )
    parser.add_argument(
        "--cases",
        help="the cases to run, by number, e.g. 8 or 4,8 (default: all); a run of some cases writes nothing unless `--out`",
    )
    args = parser.parse_args(argv)
    cases = CASES if args.cases is None else tuple(sorted({int(c) for c in args.cases.split(",")}))
    if not set(cases) <= set(CASES):
        parser.error(f"--cases: the cases are {list(CASES)}, not {args.cases}")
    results = run(args.size, cases)
    text = table(results)
    print(text)
    default_out = HERE if args.size == "full" and cases == CASES else None
    out = args.out if args.out is not None else default_out
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "results.txt"), "w") as file:
            file.write(text + "\n")
        with open(os.path.join(out, "results.json"), "w") as file:
            json.dump(results, file, indent=2)
    return results


if __name__ == "__main__":
    main()
    sys.exit(0)
