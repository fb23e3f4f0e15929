"""modopt against optax (and torch.optim when installed) on the same work, in one process.

Run `python benchmarks/bench.py` (full sizes) or `python benchmarks/bench.py --size tiny` (the
CI smoke run). Each timing is the median of repeated runs after warm-up. Cases:

1. an Adam(W) step on one 16.8M-element float32 array, donated; with the fraction of the
   machine's streaming bandwidth reached (measured here by a jitted `x + 1` on as many bytes);
2. the same on 1000 leaves of 16k elements;  3. on 1000 leaves of 16 elements;
4. a full train step of an Equinox MLP of about 100k parameters;
5. compile time of the jitted step for 100 and 1000 leaves;
6. traces when the learning rate changes and when the same optimizer is rebuilt;
7. memory of the donated step against params + grads + state (does it run in place?).
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
from collections.abc import Callable
from typing import Any

# torch's OpenMP threads would otherwise spin after each of its runs, slowing whatever runs next.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import modopt

SIZES = {
    "full": {"big": 4096 * 4096, "leaves": 1000, "leaf": 16384, "tiny_leaf": 16, "repeats": 20, "width": 290},
    "tiny": {"big": 4096, "leaves": 20, "leaf": 64, "tiny_leaf": 4, "repeats": 3, "width": 16},
}


def median_seconds(run: Callable[[], Any], repeats: int, warmup: int = 3) -> float:
    return compare({"run": run}, repeats, warmup)["run"]


def compare(runs: dict[str, Callable[[], Any]], repeats: int, warmup: int = 3) -> dict[str, float]:
    """Median seconds of each run, with the runs interleaved so that drift hits all alike."""
    for run in runs.values():
        for _ in range(warmup):
            jax.block_until_ready(run())
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            jax.block_until_ready(run())
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def leaves_of(count: int, size: int) -> dict:
    keys = jax.random.split(jax.random.key(0), count)
    return {f"p{i:04d}": jax.random.normal(k, (size,)) for i, k in enumerate(keys)}


# ---- the steps compared --------------------------------------------------------------------


def modopt_step(tx):
    """`(params, state, grads) -> (params, state)` with modopt's transform as an argument."""

    @jax.jit
    def step(tx, params, state, grads):
        updates, state = tx.update(grads, state, params)
        return modopt.apply_updates(params, updates), state

    donated = jax.jit(step.__wrapped__, donate_argnums=(1, 2))
    return lambda params, state, grads: donated(tx, params, state, grads), donated


def optax_step(tx):
    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    donated = jax.jit(step, donate_argnums=(0, 1))
    return donated, donated


class Loop:
    """Runs a donated step repeatedly, feeding its outputs back in."""

    def __init__(self, step, params, state, grads):
        self.step, self.params, self.state, self.grads = step, params, state, grads

    def __call__(self):
        self.params, self.state = self.step(self.params, self.state, self.grads)
        return self.params


def adam_case(params: dict, repeats: int) -> dict:
    grads = jax.tree.map(lambda p: jnp.full_like(p, 1e-3), params)
    fresh = lambda: jax.tree.map(jnp.copy, params)  # noqa: E731
    ours_tx, theirs_tx = modopt.adamw(1e-3), optax.adamw(1e-3)
    ours, _ = modopt_step(ours_tx)
    theirs, _ = optax_step(theirs_tx)
    ours_params, their_params = fresh(), fresh()
    times = compare(
        {
            "modopt": Loop(ours, ours_params, ours_tx.init(ours_params), grads),
            "optax": Loop(theirs, their_params, theirs_tx.init(their_params), grads),
        },
        repeats,
    )
    times.update(torch_adamw(params, repeats))
    return times


def torch_adamw(params: dict, repeats: int) -> dict:
    """torch.optim.AdamW (fused, foreach, default) on CPU on the same tensors, if installed."""
    try:
        import torch
    except ImportError:
        return {}
    tensors = [torch.nn.Parameter(torch.from_numpy(np.array(p))) for p in params.values()]
    for t in tensors:
        t.grad = torch.full_like(t, 1e-3)
    times = {}
    for variant in ("fused", "foreach", "default"):
        flags = {"fused": {"fused": True}, "foreach": {"foreach": True}, "default": {"foreach": False}}[variant]
        try:
            optimizer = torch.optim.AdamW(tensors, lr=1e-3, **flags)
            times[f"torch {variant}"] = median_seconds(lambda o=optimizer: o.step(), repeats)
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
    """A train step of an Equinox MLP, where per-call overhead dominates: modopt's
    `Optimizer.step` under `jax.jit` (the model's arrays and the optimizer as arguments) and
    under `eqx.filter_jit`, against optax under `jax.jit`."""
    model = eqx.nn.MLP(64, 10, width, 2, key=jax.random.key(0))
    x, y = jnp.ones((32, 64)), jnp.zeros((32, 10))
    params, static = eqx.partition(model, eqx.is_array)

    def loss(params):
        return jnp.mean((jax.vmap(eqx.combine(params, static))(x) - y) ** 2)

    def ours(params, optimizer):
        return optimizer.step(params, jax.grad(loss)(params))

    tx = optax.adamw(1e-3)

    def theirs(params, state):
        updates, state = tx.update(jax.grad(loss)(params), state, params)
        return optax.apply_updates(params, updates), state

    @eqx.filter_jit(donate="all")
    def ours_filter_jit(model, optimizer):
        return optimizer.step(model, eqx.filter_grad(lambda m: loss(eqx.filter(m, eqx.is_array)))(model))

    def looped(step, *state):
        state = list(state)

        def run():
            state[:] = step(*state)
            return state[0]

        return run

    copy = lambda: jax.tree.map(jnp.copy, params)  # noqa: E731
    times = compare(
        {
            "modopt": looped(jax.jit(ours, donate_argnums=(0, 1)), copy(), modopt.Optimizer(modopt.adamw(1e-3), params)),
            "optax": looped(jax.jit(theirs, donate_argnums=(0, 1)), copy(), tx.init(params)),
            "modopt in eqx.filter_jit": looped(
                ours_filter_jit, eqx.combine(copy(), static), modopt.Optimizer(modopt.adamw(1e-3), model)
            ),
        },
        repeats * 10,
    )
    return {**times, "parameters": sum(p.size for p in jax.tree.leaves(params))}


def compile_case(count: int, size: int, repeats: int = 3) -> dict:
    """Seconds to lower and compile a fresh jitted Adam(W) step (median, interleaved)."""
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

    timings = {"modopt": [], "optax": []}
    for _ in range(repeats):
        for name, build in (("modopt", ours), ("optax", theirs)):
            start = time.perf_counter()
            build()
            timings[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in timings.items()}


def trace_case() -> dict:
    """Traces of a jitted step when the learning rate changes and when the optimizer is rebuilt."""
    params = {"w": jnp.ones(8)}
    grads = {"w": jnp.ones(8)}
    traces = {"modopt": 0, "optax": 0}

    @eqx.filter_jit
    def ours(params, optimizer):
        traces["modopt"] += 1
        return optimizer.step(params, grads)

    optimizer = modopt.Optimizer(modopt.adam(1e-3), params)
    ours(params, optimizer)
    ours(params, optimizer.set(learning_rate=1e-4))  # a new learning rate
    ours(params, modopt.Optimizer(modopt.adam(1e-3), params))  # the same optimizer, rebuilt

    def theirs_for(tx):
        @jax.jit
        def step(params, state):
            traces["optax"] += 1
            updates, state = tx.update(grads, state, params)
            return optax.apply_updates(params, updates), state

        return step

    for tx in (optax.adam(1e-3), optax.adam(1e-4), optax.adam(1e-3)):  # first, new rate, rebuilt
        theirs_for(tx)(params, tx.init(params))
    return {"modopt retraces": traces["modopt"] - 1, "optax retraces": traces["optax"] - 1}


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


# ---- report --------------------------------------------------------------------------------


def run(size: str) -> dict:
    s = SIZES[size]
    results: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {jax.devices()[0].platform}",
        "versions": {"jax": jax.__version__, "optax": optax.__version__, "modopt": modopt.__version__},
        "size": size,
    }
    big = {"w": jax.random.normal(jax.random.key(0), (s["big"],))}
    results["1 one big array"] = adam_case(big, s["repeats"])
    results["1 one big array"]["bandwidth GB/s"] = bandwidth(s["big"], s["repeats"]) / 1e9
    results["2 many 16k leaves"] = adam_case(leaves_of(s["leaves"], s["leaf"]), s["repeats"])
    results["3 many tiny leaves"] = adam_case(leaves_of(s["leaves"], s["tiny_leaf"]), s["repeats"])
    results["4 MLP train step"] = mlp_case(s["width"], s["repeats"])
    results["5 compile, 100 leaves"] = compile_case(min(100, s["leaves"]), s["tiny_leaf"])
    results["5 compile, 1000 leaves"] = compile_case(s["leaves"], s["tiny_leaf"])
    results["6 traces"] = trace_case()
    results["7 donated step memory"] = memory_case(s["leaves"], s["leaf"])
    return results


def table(results: dict) -> str:
    big = results["1 one big array"]
    adam_bytes = 28 * SIZES[results["size"]]["big"]  # reads p, g, mu, nu; writes p, mu, nu
    lines = [f"modopt vs optax, {results['date']}, {results['machine']}, {results['versions']}", ""]
    lines.append(f"{'case':28s} {'modopt':>12s} {'optax':>12s} {'ratio':>7s}  others")
    for name, row in results.items():
        if not isinstance(row, dict) or not isinstance(row.get("modopt"), float):
            continue
        others = "  ".join(f"{k}: {_fmt(v, k)}" for k, v in row.items() if k not in ("modopt", "optax"))
        ratio = row["modopt"] / row["optax"]
        lines.append(f"{name:28s} {_fmt(row['modopt']):>12s} {_fmt(row['optax']):>12s} {ratio:7.2f}  {others}")
        for key, value in row.items():
            if key.startswith("torch") and isinstance(value, float):
                lines.append(f"{'':28s} {'':12s} {'':12s} {row['modopt'] / value:7.2f}  (modopt / {key})")
    achieved = adam_bytes / big["modopt"] / 1e9
    lines.append(f"\nbandwidth: modopt Adam moves {achieved:.1f} GB/s of {big['bandwidth GB/s']:.1f} GB/s streaming "
                 f"({achieved / big['bandwidth GB/s']:.0%})")
    lines.append(f"traces: {results['6 traces']}")
    lines.append(f"memory: {results['7 donated step memory']}")
    return "\n".join(lines)


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
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    results = run(args.size)
    print(table(results))
    if args.json:
        with open(args.json, "w") as file:
            json.dump(results, file, indent=2)
    return results


if __name__ == "__main__":
    main()
    sys.exit(0)
