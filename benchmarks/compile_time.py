"""First-step compile time, step time and state bytes of the matrix optimizers on the digits CNN.

Run `python benchmarks/compile_time.py` (writes benchmarks/compile_time.txt and .json) or
`python benchmarks/compile_time.py --only adamw optax_adamw --out DIR` (the CI smoke run).

The model is a small Equinox CNN on the digits images (8x8): two 3x3 convolutions (16 and 32
channels, padded), a (64, 2048) linear layer and a (10, 64) one, 136,586 parameters, the shape
of model a new user tries after the MLP of `modopt.examples.digits`. Each optimizer (its
defaults; `optax.adamw` beside `modopt.adamw`) runs in a fresh Python process: the first
`modopt.jit_step` train step (loss, gradient and `optimizer.step` on the job's first batch of
64) is traced, lowered and compiled from nothing cached, and timed: the compile time is the
seconds JAX reports for tracing, lowering and XLA's compilation during that call (its
`jax.monitoring` events; the process's CPU seconds for the call beside it, which a loaded
machine inflates less), the first step's wall time beside it (it also runs the step: SOAP's
first step runs the eigendecompositions, a 2048 x 2048 one among them, about 3 s here); then
the median of a few steps. The bytes of state per parameter are `Optimizer.state_bytes()`'s. Timings on a shared
machine vary with its load, which is recorded.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
OPTIMIZERS = ("optax_adamw", "adamw", "soap", "shampoo", "kron")
STEPS = 5


def make_cnn(seed: int):
    """The digits CNN (see the module's docstring)."""
    import equinox as eqx
    import jax

    class CNN(eqx.Module):
        layers: list

        def __init__(self, key):
            k = jax.random.split(key, 4)
            self.layers = [
                eqx.nn.Conv2d(1, 16, 3, padding=1, key=k[0]),
                eqx.nn.Conv2d(16, 32, 3, padding=1, key=k[1]),
                eqx.nn.Linear(2048, 64, key=k[2]),
                eqx.nn.Linear(64, 10, key=k[3]),
            ]

        def __call__(self, x):
            x = jax.nn.relu(self.layers[0](x.reshape(1, 8, 8)))
            x = jax.nn.relu(self.layers[1](x))
            x = jax.nn.relu(self.layers[2](x.reshape(-1)))
            return self.layers[3](x)

    return CNN(jax.random.key(seed))


def make_optimizer(name: str):
    import modopt

    if name == "optax_adamw":
        import optax

        return optax.adamw(1e-3)
    return {"adamw": modopt.adamw, "soap": modopt.soap, "shampoo": modopt.shampoo, "kron": modopt.kron}[name](1e-3)


def measure(name: str) -> dict:
    """In this process: the first train step's compile time, the step time, the state's bytes."""
    import warnings

    import equinox as eqx
    import jax
    import jax.numpy as jnp

    import modopt
    from modopt.examples import digits

    model = make_cnn(0)
    x, y, _, _ = digits.load_data(0)
    batch = jnp.asarray(x[: digits.BATCH_SIZE]), jnp.asarray(y[: digits.BATCH_SIZE])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", modopt.StateMemoryWarning)
        optimizer = modopt.Optimizer(make_optimizer(name), model)

    @modopt.jit_step
    def train_step(model, optimizer, batch):
        loss, grads = eqx.filter_value_and_grad(digits.loss_fn)(model, *batch)
        model, optimizer = optimizer.step(model, grads)
        return model, optimizer, loss

    phases = ("jaxpr_trace_duration", "jaxpr_to_mlir_module_duration", "backend_compile_duration")
    seconds = []

    def record(event, duration, **_):
        if event.rsplit("/", 1)[-1] in phases:
            seconds.append(duration)

    jax.monitoring.register_event_duration_secs_listener(record)
    start, cpu = time.perf_counter(), time.process_time()
    model, optimizer, loss = train_step(model, optimizer, batch)
    jax.block_until_ready(loss)
    first, cpu = time.perf_counter() - start, time.process_time() - cpu
    jax.monitoring.unregister_event_duration_listener(record)
    times = []
    for _ in range(STEPS):
        start = time.perf_counter()
        model, optimizer, loss = train_step(model, optimizer, batch)
        jax.block_until_ready(loss)
        times.append(time.perf_counter() - start)
    step = statistics.median(times)
    report = optimizer.state_bytes()
    return {
        "first_step_s": first,
        "step_s": step,
        "compile_s": sum(seconds),  # tracing, lowering and compiling in the first step
        "first_step_cpu_s": cpu,
        "state_bytes_per_parameter": report.per_parameter,
        "parameters": report.parameters,
    }


def run(names, log=print) -> dict:
    import jax

    sys.path.insert(0, HERE)
    import bench

    results = {
        "date": datetime.date.today().isoformat(),
        "machine": bench.machine(),
        "versions": {"jax": jax.__version__},
        "load average at start": round(os.getloadavg()[0], 1),
        "optimizers": {},
    }
    root = os.path.dirname(HERE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    for name in names:  # each in a fresh process: nothing compiled or traced before
        done = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--measure", name],
            capture_output=True, text=True, env=env, cwd=root, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"{name}: {done.stderr.strip().splitlines()[-1:]}")
        results["optimizers"][name] = json.loads(done.stdout.strip().splitlines()[-1])
        log(f"{name}: {results['optimizers'][name]}")
    results["load average at end"] = round(os.getloadavg()[0], 1)
    return results


def table(results: dict) -> str:
    rows = results["optimizers"]
    base = rows.get("optax_adamw")
    lines = [
        f"first-step compile time on the digits CNN, {results['date']}, {results['machine']}, {results['versions']}, "
        f"load average {results['load average at start']} at the start, {results['load average at end']} at the end",
        f"(each optimizer's defaults, lr 1e-3; modopt.jit_step train step; each in a fresh process; "
        f"{next(iter(rows.values()))['parameters']:,} parameters)",
        f"{'optimizer':12s} {'compile':>9s} {'/ optax':>8s} {'1st step':>9s} {'its CPU':>8s} {'step':>10s} "
        f"{'state B/param':>14s}",
    ]
    for name, row in rows.items():
        ratio = f"{row['compile_s'] / base['compile_s']:8.2f}" if base else f"{'':8s}"
        lines.append(
            f"{name:12s} {row['compile_s']:8.2f}s {ratio} {row['first_step_s']:8.2f}s {row['first_step_cpu_s']:7.2f}s "
            f"{row['step_s'] * 1e3:7.2f} ms "
            f"{row['state_bytes_per_parameter']:14.1f}"
        )
    return "\n".join(lines)


def main(argv=None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=OPTIMIZERS, default=list(OPTIMIZERS))
    parser.add_argument("--out", help="folder for compile_time.txt and .json (default: benchmarks/ for a full run)")
    parser.add_argument("--measure", choices=OPTIMIZERS, help=argparse.SUPPRESS)  # the worker
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure)))
        return None
    results = run(args.only, log=lambda line: print(line, file=sys.stderr, flush=True))
    text = table(results)
    print(text)
    out = args.out if args.out is not None else (HERE if args.only == list(OPTIMIZERS) else None)
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "compile_time.json"), "w") as file:
            json.dump(results, file, indent=1)
        with open(os.path.join(out, "compile_time.txt"), "w") as file:
            file.write(text + "\n")
    return results


if __name__ == "__main__":
    main()
