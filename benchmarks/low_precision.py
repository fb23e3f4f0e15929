"""bfloat16 parameters with compensated updates, and state kept on the host, against float32 AdamW.

Run `python benchmarks/low_precision.py` (writes benchmarks/low_precision.txt and .json) or
with `--size tiny` for a quick look (writes nothing unless `--out`). Variants:

- float32 AdamW (the baseline);
- bfloat16 parameters with AdamW, updates rounded to nearest (`apply_updates`; AdamW's
  moments then are bfloat16 too, optax's default: the gradients' dtype);
- the same with stochastic rounding, and with Kahan-compensated summation
  (`Optimizer(..., compensation=...)`);
- float32 AdamW with its state in pinned host memory (`state_memory_kind="pinned_host"`).

For each: the optimizer's memory, measured on the real arrays (state plus compensation, per
memory kind) and per parameter; the step time against float32 AdamW, as medians of
interleaved runs (the digits train step, and `Optimizer.step` alone on a model of about 12.6M
parameters, `--big LAYERS WIDTH` for another size); and the test accuracy of the digits main job (`modopt.examples.digits`, its
model, schedule, AdamW, batches and epochs), over several seeds, as the job runs and with its
schedule's peak learning rate lowered to `SMALL_LR`, where bfloat16 rounding loses most updates.
"""

from __future__ import annotations

import argparse
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
from modopt.examples import digits

HERE = os.path.dirname(os.path.abspath(__file__))
BASELINE = "float32 AdamW"
VARIANTS = {
    BASELINE: {},
    "bf16 AdamW": {"dtype": jnp.bfloat16},
    "bf16 AdamW + stochastic rounding": {"dtype": jnp.bfloat16, "compensation": "stochastic_rounding"},
    "bf16 AdamW + Kahan": {"dtype": jnp.bfloat16, "compensation": "kahan"},
    "float32 AdamW, state on host": {"state_memory_kind": "pinned_host"},
}
SIZES = {
    "full": {"seeds": (0, 1, 2), "epochs": 10, "big": (4, 1792), "rounds": 9, "steps": 20, "big_steps": 5},
    "tiny": {"seeds": (0,), "epochs": 1, "big": (2, 256), "rounds": 3, "steps": 5, "big_steps": 2},
}
SMALL_LR = 1e-4
"""The job's schedule peaks at 3e-3; at this peak most bfloat16 updates fall below half a
spacing (the regime of a long run's end, or of fine-tuning), where rounding to nearest loses them."""


def cast(model, dtype):
    """`model` with its floating arrays in `dtype` (as it is for `None`)."""
    if dtype is None:
        return model
    return jax.tree.map(lambda x: x.astype(dtype) if eqx.is_inexact_array(x) else x, model)


def optimizer_for(variant: str, tx, model, seed: int = 0) -> modopt.Optimizer:
    options = dict(VARIANTS[variant])
    options.pop("dtype", None)
    if options.get("compensation") == "stochastic_rounding":
        options["key"] = jax.random.key(seed)
    return modopt.Optimizer(tx, model, **options)


def memory(optimizer: modopt.Optimizer, parameters: int) -> dict:
    """Measured bytes of the optimizer's state and compensation, per memory kind."""
    found: dict[str, int] = {}
    for x in jax.tree.leaves((optimizer.state, optimizer.compensation)):
        kind = x.sharding.memory_kind or "device"
        found[kind] = found.get(kind, 0) + x.nbytes
    total = sum(found.values())
    return {"bytes": total, "per_parameter": total / parameters, "by_memory_kind": found}


# ---- digits ------------------------------------------------------------------------------


def digits_run(variant: str, seed: int, epochs: int, data=None, peak_lr: float | None = None):
    """The main job's training (its model, optimizer, batches), with `variant`'s parameters and
    options (and another peak learning rate, if given): returns (model, optimizer, batches,
    test accuracy)."""
    dtype = VARIANTS[variant].get("dtype")
    x_train, y_train, x_test, y_test = data or digits.load_data(seed)
    steps_per_epoch = len(x_train) // digits.BATCH_SIZE
    model, job_optimizer = digits._model_and_optimizer(seed, epochs * steps_per_epoch)
    model = cast(model, dtype)
    optimizer = optimizer_for(variant, job_optimizer.tx, model, seed)
    if peak_lr is not None:
        optimizer = optimizer.set(peak_value=peak_lr)  # the schedule's peak, by name
    batches = []
    for epoch in range(1, epochs + 1):
        order = digits._order(seed, epoch, len(x_train))
        for i in range(steps_per_epoch):
            x, y = digits._batch(x_train, y_train, order, i)
            batch = (x if dtype is None else x.astype(dtype), y)
            model, optimizer, _ = digits.train_step(model, optimizer, batch)
            if len(batches) < 8:
                batches.append(batch)
    x_test = jnp.asarray(x_test) if dtype is None else jnp.asarray(x_test).astype(dtype)
    accuracy = float(digits.accuracy(model, x_test, jnp.asarray(y_test)))
    return model, optimizer, batches, accuracy


def interleaved(steps: dict, rounds: int, repeats: int) -> dict:
    """Median seconds per call of each `steps[name]()` (which runs `repeats` steps and blocks),
    the contenders interleaved round after round."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    for name, run in steps.items():  # warm-up (compilation)
        run()
    for _ in range(rounds):
        for name, run in steps.items():
            start = time.perf_counter()
            run()
            times[name].append((time.perf_counter() - start) / repeats)
    return {name: statistics.median(t) for name, t in times.items()}


def digits_step_times(trained: dict, rounds: int, repeats: int) -> dict:
    steps = {}
    for variant, (model, optimizer, batches, _) in trained.items():
        state = {"model": model, "optimizer": optimizer}

        def run(state=state, batches=batches):
            for i in range(repeats):
                state["model"], state["optimizer"], loss = digits.train_step(
                    state["model"], state["optimizer"], batches[i % len(batches)]
                )
            loss.block_until_ready()

        steps[variant] = run
    return interleaved(steps, rounds, repeats)


# ---- a model of ~12.6M parameters: Optimizer.step alone -----------------------------------


@modopt.jit_step
def optimizer_step(params, optimizer, grads):
    return optimizer.step(params, grads)


def big_model(layers: int, width: int, dtype) -> tuple[dict, dict]:
    keys = jax.random.split(jax.random.key(0), 2 * layers)
    params = {f"w{i}": jax.random.normal(keys[i], (width, width), dtype) * 0.02 for i in range(layers)}
    grads = {
        f"w{i}": jax.random.normal(keys[layers + i], (width, width), dtype) * 1e-3 for i in range(layers)
    }
    return params, grads


def big_model_results(layers: int, width: int, rounds: int, repeats: int) -> dict:
    parameters = layers * width * width
    steps, memories = {}, {}
    for variant, options in VARIANTS.items():
        params, grads = big_model(layers, width, options.get("dtype", jnp.float32))
        optimizer = optimizer_for(variant, modopt.adamw(1e-3, weight_decay=1e-4), params)
        memories[variant] = memory(optimizer, parameters)
        state = {"params": params, "optimizer": optimizer}

        def run(state=state, grads=grads):
            for _ in range(repeats):
                state["params"], state["optimizer"] = optimizer_step(
                    state["params"], state["optimizer"], grads
                )
            jax.block_until_ready(state["params"])

        steps[variant] = run
    return {"parameters": parameters, "memory": memories, "step_seconds": interleaved(steps, rounds, repeats)}


# ---- the report --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--seeds", type=int, nargs="*", help="digits seeds (default: the size's)")
    parser.add_argument(
        "--epochs", type=int, help="digits epochs (default: the size's; the job's default is 10)"
    )
    parser.add_argument(
        "--big", type=int, nargs=2, metavar=("LAYERS", "WIDTH"), help="the step-alone model's size"
    )
    parser.add_argument(
        "--out", help="directory for low_precision.txt and .json (default: benchmarks/ for --size full)"
    )
    args = parser.parse_args(argv)
    size = SIZES[args.size]
    seeds, epochs = tuple(args.seeds or size["seeds"]), args.epochs or size["epochs"]
    out = args.out or (HERE if args.size == "full" else None)

    accuracy: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    small_lr_accuracy: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    trained = {}
    for seed in seeds:
        data = digits.load_data(seed)
        for variant in VARIANTS:
            run = digits_run(variant, seed, epochs, data)
            accuracy[variant].append(run[3])
            small_lr_accuracy[variant].append(digits_run(variant, seed, epochs, data, SMALL_LR)[3])
            if seed == seeds[0]:
                trained[variant] = run
    parameters = sum(x.size for x in jax.tree.leaves(eqx.filter(trained[BASELINE][0], eqx.is_inexact_array)))
    digits_memory = {variant: memory(run[1], parameters) for variant, run in trained.items()}
    digits_times = digits_step_times(trained, size["rounds"], size["steps"])
    big = big_model_results(*(args.big or size["big"]), size["rounds"], size["big_steps"])

    results = {
        "device": str(jax.devices()[0].device_kind),
        "platform": platform.platform(),
        "jax": jax.__version__,
        "seeds": list(seeds),
        "epochs": epochs,
        "digits": {
            "parameters": parameters,
            "accuracy": accuracy,
            "small_lr": SMALL_LR,
            "small_lr_accuracy": small_lr_accuracy,
            "memory": digits_memory,
            "step_seconds": digits_times,
        },
        "big": big,
    }
    table = report(results)
    print(table)
    if out:
        with open(os.path.join(out, "low_precision.txt"), "w") as f:
            f.write(table + "\n")
        with open(os.path.join(out, "low_precision.json"), "w") as f:
            json.dump(results, f, indent=1)
    return results


def report(results: dict) -> str:
    d, big = results["digits"], results["big"]
    base_digits, base_big = d["step_seconds"][BASELINE], big["step_seconds"][BASELINE]
    big_step = f"{big['parameters'] / 1e6:.1f}M step"
    small_lr = f"at peak lr {d['small_lr']:g}"
    lines = [
        f"bfloat16 parameters and host offload vs float32 AdamW ({results['device']}, jax {results['jax']})",
        f"digits main job: {d['parameters']:,} parameters, {results['epochs']} epochs, seeds {results['seeds']}, "
        f"its schedule (peak lr 3e-3) and {small_lr}; step alone: {big['parameters']:,} parameters",
        "",
        f"{'variant':34s} {'state B/param':>13s} {'host B/param':>12s} {'digits step':>11s} {big_step:>11s}  "
        f"{'digits accuracy (mean; per seed)':34s} {small_lr}",
    ]
    for variant in VARIANTS:
        memory = big["memory"][variant]
        host = memory["by_memory_kind"].get("pinned_host", 0) / big["parameters"]
        accuracies = [
            f"{100 * np.mean(acc):6.2f}% ({', '.join(f'{100 * a:.2f}' for a in acc)})"
            for acc in (d["accuracy"][variant], d["small_lr_accuracy"][variant])
        ]
        lines.append(
            f"{variant:34s} {memory['per_parameter']:13.2f} {host:12.2f} "
            f"{d['step_seconds'][variant] / base_digits:10.2f}x {big['step_seconds'][variant] / base_big:10.2f}x  "
            f"{accuracies[0]:34s} {accuracies[1]}"
        )
    lines.append("")
    lines.append(
        f"float32 AdamW step: digits {1e3 * base_digits:.3f} ms, {big_step} {1e3 * base_big:.2f} ms "
        "(medians of interleaved runs)"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
