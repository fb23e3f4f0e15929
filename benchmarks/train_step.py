"""The transformer job's full training step per optimizer, against AdamW's, on the device at hand.

Run `python benchmarks/train_step.py` (the job's `small` model; writes nothing unless `--out`),
or `--size medium --out DIR` on an accelerator: the medium model is nanoGPT's character-level
Shakespeare transformer (6 layers, width 384, context 256, batch 64; 10.8M parameters).

The model, text, batches, loss and recipes are those of `python -m modopt.examples.lm`: only
the optimizer changes, and each runs its recipe (the Muon family updates the blocks' matrices
and gives the rest to AdamW; Shampoo refreshes its roots every 10 steps, SOAP its eigenbases
every 10). One more row runs Shampoo at its own defaults (roots every step).

For each optimizer it compiles `WINDOW` training steps (gradient, then `Optimizer.step`) as one
jitted, donated `lax.scan`, so that a refresh every 10 steps is amortized as it is in training,
and the same for the optimizer step alone on fixed gradients. Then it times rounds of one
window per optimizer, interleaved in alternating order, and reports the median per step and
each optimizer's ratio to AdamW's, with the compile time of the training window and the state's
bytes per parameter. Kron updates its preconditioner with probability 1 over its first 500
steps (its schedule then decays to 0.03): these windows time that early phase, the costliest.
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

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import modopt
from modopt.examples.lm import corpus, recipes
from modopt.examples.lm.model import SIZES, loss, make_model

WINDOW = 20  # steps per timed call: two refreshes at a period of 10
TOTAL_STEPS = 5000  # the schedules' horizon (the step time does not depend on it)
OPTIMIZERS = ("adamw", "muon", "normuon", "adamuon", "soap", "shampoo", "kron", "adam_mini")
SHAMPOO_DEFAULTS = "shampoo, roots every step"
# Not in the default table: SOAP with its bases kept for 1000 steps, which separates the cost of
# its every-step work (rotations, moments, statistics) from that of its refreshes.
SOAP_RARE = "soap, bases every 1000 steps"


def make_optimizer(name: str, model):
    if name == SHAMPOO_DEFAULTS:
        tx = modopt.shampoo(recipes.schedule(recipes.RECIPES["shampoo"].learning_rate, TOTAL_STEPS))
    elif name == SOAP_RARE:
        schedule = recipes.schedule(recipes.RECIPES["soap"].learning_rate, TOTAL_STEPS)
        tx = modopt.soap(
            schedule,
            weight_decay=recipes.WEIGHT_DECAY,
            mask=recipes.decay_mask(model),
            precondition_frequency=1000,
        )
    else:
        tx = recipes.make_transform(name, model, TOTAL_STEPS)
    return modopt.Optimizer(tx, model)


def compiled_windows(model, optimizer, batches, grads):
    """The compiled training window and optimizer window, with the training window's compile
    seconds. Both take and return the donated `(model, optimizer)` arrays."""
    dynamic, static = eqx.partition((model, optimizer), eqx.is_array)

    def train(dynamic, batches):
        def one(dynamic, batch):
            model, optimizer = eqx.combine(dynamic, static)
            grads = eqx.filter_grad(loss)(model, batch)
            return eqx.filter(optimizer.step(model, grads), eqx.is_array), None

        return jax.lax.scan(one, dynamic, batches)[0]

    def update(dynamic, grads):
        def one(dynamic, _):
            model, optimizer = eqx.combine(dynamic, static)
            return eqx.filter(optimizer.step(model, grads), eqx.is_array), None

        return jax.lax.scan(one, dynamic, None, length=WINDOW)[0]

    start = time.perf_counter()
    train_window = jax.jit(train, donate_argnums=0).lower(dynamic, batches).compile()
    compile_seconds = time.perf_counter() - start
    update_window = jax.jit(update, donate_argnums=0).lower(dynamic, grads).compile()
    return dynamic, train_window, update_window, compile_seconds


def timed(window, dynamic, data) -> tuple[object, float]:
    jax.block_until_ready(dynamic)
    start = time.perf_counter()
    dynamic = jax.block_until_ready(window(dynamic, data))
    return dynamic, (time.perf_counter() - start) / WINDOW


def benchmark(size: str, names, rounds: int, log=print) -> dict:
    config = SIZES[size]
    text = corpus.load()
    batches = jnp.asarray(
        np.stack([text.batch(0, i, config["batch"], config["context"]) for i in range(WINDOW)])
    )
    rows = {}
    for name in names:
        model = make_model(text.vocab_size, size, 0)
        optimizer = make_optimizer(name, model)
        grads = eqx.filter_grad(loss)(model, batches[0])
        try:
            dynamic, train_window, update_window, seconds = compiled_windows(model, optimizer, batches, grads)
            # One untimed window of each: the first call of a program pays for its set-up.
            dynamic = jax.block_until_ready(update_window(train_window(dynamic, batches), grads))
        except Exception as error:  # one optimizer failing on a new platform leaves the others' rows
            log(f"{name}: failed, left out: {type(error).__name__}: {error}")
            continue
        report = optimizer.state_bytes()
        rows[name] = {
            "windows": (train_window, update_window),
            "dynamic": dynamic,
            "grads": grads,
            "compile_seconds": seconds,
            "state_bytes_per_parameter": report.per_parameter,
            "parameters": report.parameters,
            "step": [],
            "optimizer step": [],
        }
        log(f"{name:28s} compiled in {seconds:.1f} s, {report.per_parameter:.1f} B/param")
    order = list(rows)
    for r in range(rounds):
        for name in order if r % 2 == 0 else reversed(order):
            row = rows[name]
            train_window, update_window = row["windows"]
            row["dynamic"], seconds = timed(train_window, row["dynamic"], batches)
            row["step"].append(seconds)
            row["dynamic"], seconds = timed(update_window, row["dynamic"], row["grads"])
            row["optimizer step"].append(seconds)
    results = {}
    for name, row in rows.items():
        results[name] = {
            key: row[key] for key in ("compile_seconds", "state_bytes_per_parameter", "parameters")
        }
        for key in ("step", "optimizer step"):
            results[name][f"{key} ms"] = 1000 * statistics.median(row[key])
            results[name][f"{key} ms, all rounds"] = [1000 * s for s in row[key]]
    base = results.get("adamw")
    if base:
        for row in results.values():
            for key in ("step", "optimizer step"):
                row[f"{key} / adamw"] = row[f"{key} ms"] / base[f"{key} ms"]
            row["compile / adamw"] = row["compile_seconds"] / base["compile_seconds"]
    return results


def table(results: dict) -> str:
    lines = [
        "| optimizer | training step (ms) | / AdamW | optimizer step (ms) | / AdamW | compile (s) | / AdamW | state B/param |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in results.items():
        lines.append(
            f"| {name} | {row['step ms']:.2f} | {row.get('step / adamw', float('nan')):.2f} | "
            f"{row['optimizer step ms']:.3f} | {row.get('optimizer step / adamw', float('nan')):.2f} | "
            f"{row['compile_seconds']:.1f} | {row.get('compile / adamw', float('nan')):.1f} | "
            f"{row['state_bytes_per_parameter']:.1f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", choices=sorted(SIZES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--optimizers", nargs="*", default=[*OPTIMIZERS, SHAMPOO_DEFAULTS])
    parser.add_argument("--out", help="folder for train_step.txt and .json (default: none)")
    args = parser.parse_args(argv)
    if "adamw" not in args.optimizers:
        parser.error("the ratios need adamw among --optimizers")
    start = time.perf_counter()
    results = benchmark(args.size, args.optimizers, args.rounds, log=lambda s: print(s, flush=True))
    device = jax.devices()[0]
    machine = f"{platform.machine()}, {os.cpu_count()} cores, {device.platform}, {device.device_kind}"
    parameters = next(iter(results.values()))["parameters"]
    text = (
        f"The transformer job's training step ({args.size}: {parameters:,} parameters, batch "
        f"{SIZES[args.size]['batch']} x {SIZES[args.size]['context']} tokens), {WINDOW} steps per timed window, "
        f"median of {args.rounds} rounds; {machine}; jax {jax.__version__}; {datetime.date.today().isoformat()}, "
        f"{(time.perf_counter() - start) / 60:.1f} min in all\n\n{table(results)}\n"
    )
    print(text)
    if args.out:
        stem = os.path.join(args.out, "train_step")
        with open(stem + ".txt", "w") as f:
            f.write(text)
        with open(stem + ".json", "w") as f:
            json.dump(
                {
                    "machine": machine,
                    "jax": jax.__version__,
                    "size": args.size,
                    "window": WINDOW,
                    "results": results,
                },
                f,
                indent=1,
            )
    return results


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
