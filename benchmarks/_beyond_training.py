"""Steps to a target training loss on the digits main job, for `beyond_optax.py`.

The model, data, loss, accuracy, batch size and batch order are the main job's
(`modopt.examples.digits`), imported; only the optimizer changes. Each run is the job's
recipe with the optimizer swapped in: `chain(clip_by_global_norm(1.0), optimizer(schedule))`
with the job's warmup-cosine schedule, whose peak is the learning rate swept. A whole run
(all its steps, and the loss on the whole training set every `eval_every` steps) is one jitted
`lax.scan`, compiled once per optimizer: the learning rate and the seed are arrays, so the
sweep reuses the compiled run.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import modopt
from modopt.examples import digits


def _adam_mini_partition(params):
    # The paper's partition of an MLP: one second moment per output neuron (a weight's row),
    # one per bias.
    return jax.tree.map(lambda p: 0 if p.ndim == 2 else "leaf", params)


# Shampoo as distributed Shampoo is usually run: grafted on RMSProp, with Adam-like momentum
# (`1 - beta1` on the new gradient), so that its learning rate has Adam's scale (the default SGD
# grafting and summed momentum would need rates ~100 times smaller); inverse roots every 10
# steps, as SOAP's eigenbases (every step, they cost more than the rest of a step many times
# over on a CPU). The reference's defaults otherwise. The timing compares `precondition-opt`
# configured alike.
SHAMPOO = dict(block_size=128, graft_type="rmsprop", moving_average_for_momentum=True, preconditioning_compute_steps=10)

# Each optimizer as a function of its (scheduled) learning rate: its paper's defaults, except
# where a default makes no sense on this job (said next to it).
OPTIMIZERS: dict[str, Callable] = {
    "adamw": lambda lr: modopt.adamw(lr, weight_decay=1e-4),  # the main job's optimizer
    "muon": lambda lr: modopt.contrib.muon(lr),  # AdamW (same lr) on the biases
    "soap": lambda lr: modopt.soap(lr),
    "shampoo": lambda lr: modopt.shampoo(lr, **SHAMPOO),
    "kron": lambda lr: modopt.kron(lr),
    "adam_mini": lambda lr: modopt.adam_mini(lr, partition=_adam_mini_partition),
}


def schedule(peak, total_steps: int):
    """The main job's schedule with `peak` as its peak learning rate."""
    return modopt.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=peak, warmup_steps=min(50, total_steps // 5), decay_steps=total_steps
    )


def job_transform(name: str, peak, total_steps: int):
    return modopt.chain(modopt.clip_by_global_norm(1.0), OPTIMIZERS[name](schedule(peak, total_steps)))


def batch_indices(seed: int, epochs: int, n: int) -> np.ndarray:
    """The main job's batches, `(epochs * steps_per_epoch, BATCH_SIZE)` indices: each epoch's
    order from `digits._order(seed, epoch)`, its last partial batch dropped."""
    per_epoch = n // digits.BATCH_SIZE
    rows = [
        digits._order(seed, epoch, n)[: per_epoch * digits.BATCH_SIZE].reshape(per_epoch, digits.BATCH_SIZE)
        for epoch in range(1, epochs + 1)
    ]
    return np.concatenate(rows)


def make_run(eval_every: int, traces: list | None = None):
    """`run(model, optimizer, indices, x, y, x_test, y_test) -> (train losses, test accuracy)`:
    the whole run in one jit; the loss on the whole training set after every `eval_every` steps.
    Each trace appends to `traces`."""

    @eqx.filter_jit
    def run(model, optimizer, indices, x, y, x_test, y_test):
        if traces is not None:
            traces.append(1)
        chunks = indices.reshape(-1, eval_every, indices.shape[-1])
        # The scans carry the arrays; the rest of the model and optimizer (functions, static
        # fields) is put back around each step.
        dynamic, static = eqx.partition((model, optimizer), eqx.is_array)

        def step(dynamic, idx):
            model, optimizer = eqx.combine(dynamic, static)
            grads = eqx.filter_grad(digits.loss_fn)(model, x[idx], y[idx])
            return eqx.filter(optimizer.step(model, grads), eqx.is_array), None

        def chunk(dynamic, idx):
            dynamic, _ = jax.lax.scan(step, dynamic, idx)
            model, _ = eqx.combine(dynamic, static)
            return dynamic, digits.loss_fn(model, x, y)

        dynamic, losses = jax.lax.scan(chunk, dynamic, chunks)
        model, _ = eqx.combine(dynamic, static)
        return losses, digits.accuracy(model, x_test, y_test)

    return run


def steps_to(losses: np.ndarray, target: float, eval_every: int) -> int | None:
    """The first evaluated step whose training loss is at or below `target` (None: never)."""
    below = np.flatnonzero(np.asarray(losses) <= target)
    return int((below[0] + 1) * eval_every) if below.size else None


def sweep(rates: dict, seeds, epochs: int, eval_every: int, target: float, log=print) -> dict:
    """Every optimizer (`rates`' keys) at each of its peak learning rates (`rates[name]`) with
    the first seed; the best rate (fewest
    steps to `target`; if none reaches it, the lowest final loss) again with the other seeds.
    Per optimizer: each rate's steps to the target, final training loss, test accuracy and loss
    curve; the best rate's at every seed."""
    data = {seed: digits.load_data(seed) for seed in seeds}
    n = len(data[seeds[0]][0])
    total_steps = epochs * (n // digits.BATCH_SIZE)
    total_steps -= total_steps % eval_every
    results = {}
    for name in rates:
        traces: list = []
        run = make_run(eval_every, traces)  # compiled on the first call, reused for every rate and seed

        def train(rate, seed):
            x, y, x_test, y_test = (jnp.asarray(a) for a in data[seed])
            model = digits.make_model(seed)
            optimizer = modopt.Optimizer(job_transform(name, rate, total_steps), model)
            indices = jnp.asarray(batch_indices(seed, epochs, n)[:total_steps])
            losses, accuracy = run(model, optimizer, indices, x, y, x_test, y_test)
            losses = np.asarray(losses, np.float64)
            row = {
                "steps_to_target": steps_to(losses, target, eval_every),
                "final_train_loss": float(losses[-1]),
                "test_accuracy": float(accuracy),
                "curve": [float(v) for v in losses],
            }
            log(
                f"  {name:10s} lr {rate:<8g} seed {seed}: steps to {target}: {row['steps_to_target']}, "
                f"final train loss {row['final_train_loss']:.3g}, test accuracy {row['test_accuracy']:.2%}"
            )
            return row

        per_rate = {repr(rate): {"learning_rate": rate, **train(rate, seeds[0])} for rate in rates[name]}
        best = min(per_rate.values(), key=_rank)
        at_seeds = [best] + [train(best["learning_rate"], seed) for seed in seeds[1:]]
        reached = [row["steps_to_target"] for row in at_seeds]
        results[name] = {
            "best_learning_rate": best["learning_rate"],
            "best": {
                "seeds": list(seeds),
                "steps_to_target": reached,
                "median_steps_to_target": _median_steps(reached),
                "final_train_loss": [row["final_train_loss"] for row in at_seeds],
                "test_accuracy": [row["test_accuracy"] for row in at_seeds],
            },
            "rates": per_rate,
            "traces": len(traces),
        }
    return {
        "target_train_loss": target,
        "epochs": epochs,
        "total_steps": total_steps,
        "eval_every": eval_every,
        "seeds": list(seeds),
        "learning_rates": {name: list(values) for name, values in rates.items()},
        "optimizers": results,
    }


def _median_steps(reached: list) -> float | None:
    # A seed that never reaches the target counts as infinitely many steps.
    median = float(np.median([math.inf if r is None else r for r in reached]))
    return None if math.isinf(median) else median


def _rank(row: dict) -> tuple:
    steps, loss = row["steps_to_target"], row["final_train_loss"]
    return (math.inf if steps is None else steps, loss if math.isfinite(loss) else math.inf)
