"""Optimizer state in fewer bytes: measured state memory, step time and accuracy per variant.

Run `python benchmarks/state_memory.py` (writes benchmarks/state_memory.txt and .json) or with
`--size tiny` for a quick look (writes nothing unless `--out`). Each variant is one line of
`VARIANTS`: a function of the learning rate and the weight decay giving an AdamW. For each:

1. memory: the bytes of the optimizer state, summed over the arrays `init` returns (measured,
   not estimated), on a model of about 12.6M parameters (a 16384 x 512 embedding and two
   512 -> 2048 -> 512 blocks with their biases and a norm), and their ratio to float32 AdamW;
2. speed: the step time on that model (the transform's update and `apply_updates`, jitted,
   donated), as the median of interleaved runs, against float32 AdamW;
3. accuracy: the test accuracy of the digits main job (`modopt.examples.digits`: its model,
   data, batches, schedule, gradient clipping and epochs) with its AdamW replaced by the
   variant's, over several seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import modopt
from modopt.examples import digits

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench import Loop, compare, modopt_step, optax_step  # noqa: E402

BASELINE = "modopt adamw, float32"
VARIANTS = {
    "optax adamw, float32": lambda lr, wd: optax.adamw(lr, weight_decay=wd),
    BASELINE: lambda lr, wd: modopt.adamw(lr, weight_decay=wd),
    "modopt adamw, bf16 moments": lambda lr, wd: modopt.adamw(lr, weight_decay=wd, mu_dtype=jnp.bfloat16, nu_dtype=jnp.bfloat16),
    "modopt 8-bit adamw (dynamic)": lambda lr, wd: modopt.quantized_state(modopt.adamw(lr, weight_decay=wd)),
    "modopt 8-bit adamw, every leaf": lambda lr, wd: modopt.quantized_state(modopt.adamw(lr, weight_decay=wd), min_size=0),
    "modopt 8-bit adamw (linear)": lambda lr, wd: modopt.quantized_state(modopt.adamw(lr, weight_decay=wd), quantization="linear"),
}  # fmt: skip
SIZES = {
    "full": {"vocab": 16384, "width": 512, "hidden": 2048, "blocks": 2, "repeats": 15, "seeds": (0, 1, 2), "epochs": 10},
    # The smoke run (tests/test_quantized_state.py): two variants, three steps of the digits job.
    "tiny": {"vocab": 512, "width": 64, "hidden": 256, "blocks": 1, "repeats": 3, "seeds": (0,), "epochs": 1,
             "variants": (BASELINE, "modopt 8-bit adamw (dynamic)"), "steps": 3},
}  # fmt: skip


def model_params(vocab: int, width: int, hidden: int, blocks: int) -> dict:
    """The parameters of a small language model's body: embedding, MLP blocks, norms."""
    keys = iter(jax.random.split(jax.random.key(0), 2 + 2 * blocks))
    params = {"embed": 0.02 * jax.random.normal(next(keys), (vocab, width))}
    for i in range(blocks):
        params[f"block{i}"] = {
            "w_in": 0.02 * jax.random.normal(next(keys), (width, hidden)),
            "b_in": jnp.zeros((hidden,)),
            "w_out": 0.02 * jax.random.normal(next(keys), (hidden, width)),
            "b_out": jnp.zeros((width,)),
            "norm": jnp.ones((width,)),
        }
    return params


def state_bytes(state) -> int:
    """The bytes of the arrays of a state (as allocated)."""
    return sum(leaf.nbytes for leaf in jax.tree.leaves(state))


def is_optax(tx) -> bool:
    return not isinstance(tx, modopt.AbstractTransform)


def variants(size: dict) -> dict:
    """The variants run at `size`: all of them, unless the size names some."""
    return {name: VARIANTS[name] for name in size.get("variants", VARIANTS)}


def memory_and_speed(size: dict) -> dict:
    params = model_params(size["vocab"], size["width"], size["hidden"], size["blocks"])
    count = sum(p.size for p in jax.tree.leaves(params))
    grads = jax.tree.map(lambda p: 1e-3 * jax.random.normal(jax.random.key(1), p.shape), params)
    loops, memory = {}, {}
    for name, make in variants(size).items():
        tx = make(1e-3, 1e-4)
        own = jax.tree.map(jnp.copy, params)
        state = tx.init(own)
        memory[name] = state_bytes(state)
        step = optax_step(tx)[0] if is_optax(tx) else modopt_step(tx)[0]
        loops[name] = Loop(step, own, state, grads)
    seconds = compare(loops, size["repeats"])
    return {"parameters": count, "state_bytes": memory, "step_seconds": seconds}


def swap_adamw(tx, make):
    """`tx` with each AdamW in it replaced by `make(learning_rate, weight_decay)` of that AdamW."""
    adamw = type(modopt.adamw(1e-3))
    found = lambda x: isinstance(x, adamw)  # noqa: E731
    return jax.tree.map(
        lambda x: modopt.from_optax(make(x.learning_rate, x.weight_decay)) if found(x) else x, tx, is_leaf=found
    )


def digits_accuracy(make, seed: int, epochs: int, steps: int | None = None) -> float:
    """The digits main job with `make`'s AdamW in place of its own: the test accuracy (after
    `steps` steps of each epoch, if given: a smoke run)."""
    x_train, y_train, x_test, y_test = digits.load_data(seed)
    steps_per_epoch = len(x_train) // digits.BATCH_SIZE
    model, job = digits._model_and_optimizer(seed, epochs * steps_per_epoch)
    optimizer = modopt.Optimizer(swap_adamw(job.tx, make), model)
    for epoch in range(1, epochs + 1):
        order = digits._order(seed, epoch, len(x_train))
        for i in range(steps_per_epoch if steps is None else steps):
            model, optimizer, _ = digits.train_step(model, optimizer, digits._batch(x_train, y_train, order, i))
    return float(digits.accuracy(model, jnp.asarray(x_test), jnp.asarray(y_test)))


def run(size_name: str) -> dict:
    size = SIZES[size_name]
    results = {
        "size": size_name,
        "device": f"{jax.devices()[0].device_kind} ({jax.default_backend()})",
        "platform": platform.platform(),
        "versions": {"jax": jax.__version__, "optax": optax.__version__, "modopt": modopt.__version__},
        "model": memory_and_speed(size),
        "digits": {"seeds": list(size["seeds"]), "epochs": size["epochs"], "accuracy": {}},
    }
    for name, make in variants(size).items():
        accuracy = [digits_accuracy(make, seed, size["epochs"], size.get("steps")) for seed in size["seeds"]]
        results["digits"]["accuracy"][name] = accuracy
    model = digits._model_and_optimizer(0, 1)[0]
    results["digits"]["parameters"] = sum(x.size for x in jax.tree.leaves(eqx.filter(model, eqx.is_inexact_array)))
    return results


def report(results: dict) -> str:
    model, accuracy = results["model"], results["digits"]["accuracy"]
    base_bytes, base_seconds = model["state_bytes"][BASELINE], model["step_seconds"][BASELINE]
    base_accuracy = np.mean(accuracy[BASELINE])
    seeds = results["digits"]["seeds"]
    lines = [
        f"AdamW's state per variant ({results['device']}, jax {results['versions']['jax']})",
        f"memory and step: {model['parameters']:,} parameters; digits main job: "
        f"{results['digits']['parameters']:,} parameters, {results['digits']['epochs']} epochs, seeds {seeds}",
        "",
        f"{'variant':30s} {'state bytes':>12s} {'B/param':>8s} {'vs float32':>10s} {'step':>7s} "
        f"{'digits accuracy, mean (per seed)':>34s} {'vs float32':>10s}",
    ]
    for name in model["state_bytes"]:
        memory, acc = model["state_bytes"][name], accuracy[name]
        per_seed = ", ".join(f"{100 * a:.2f}" for a in acc)
        lines.append(
            f"{name:30s} {memory:12,d} {memory / model['parameters']:8.2f} {memory / base_bytes:9.3f}x "
            f"{model['step_seconds'][name] / base_seconds:6.2f}x {100 * np.mean(acc):12.2f}% ({per_seed}) "
            f"{100 * (np.mean(acc) - base_accuracy):+9.2f}"
        )
    lines.append("")
    lines.append(
        f"float32 AdamW step on {model['parameters'] / 1e6:.1f}M parameters: {1e3 * base_seconds:.2f} ms "
        "(medians of interleaved, donated, jitted steps); accuracy difference in points."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--out", help="folder for state_memory.txt and .json (default: benchmarks/ for --size full)")
    args = parser.parse_args(argv)
    results = run(args.size)
    text = report(results)
    print(text)
    out = args.out if args.out is not None else (HERE if args.size == "full" else None)
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "state_memory.txt"), "w") as file:
            file.write(text + "\n")
        with open(os.path.join(out, "state_memory.json"), "w") as file:
            json.dump(results, file, indent=1)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
