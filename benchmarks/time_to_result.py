"""Time to a target validation loss on the transformer language-model job, per optimizer.

Run `python benchmarks/time_to_result.py` (writes benchmarks/time_to_result.txt, .json and .png)
or `--size tiny --steps 6 --smoke` (the test suite's run: a few steps of every optimizer, no
files unless `--out`). `--size` and `--steps` scale it up on an accelerator.

The model, text, batches, loss and recipes are the job's (`modopt.examples.lm`): only the
optimizer changes. For every optimizer the same tuning budget: its peak learning rate swept over
`GRID` (the recipe's default times 1/3, 1, 3) with seed 0, chosen by the final validation loss;
then seeds 1 and 2 at the chosen rate. 8-bit AdamW and AdamW with bfloat16 moments run at
AdamW's chosen rate, with the 3 seeds. Reported per optimizer, as mean ± std over the seeds:
steps and seconds to the target validation loss (`TARGET_BITS` bits per character; seconds are
steps times the measured step time), the final validation loss after the step budget, the step
time, the compile time and the optimizer state's bytes per parameter.

Where optax has the same optimizer (AdamW, Lion, Muon, schedule-free AdamW), optax's runs too,
configured alike (its own schedule, masks and dimension numbers), on the same model, batches and
seeds at the chosen rate: the table gives the largest difference of its validation curve from
modopt's, which shows that the comparison is about the algorithm.

A whole run (its steps, and the validation loss every `eval_every` steps) is one jitted
`lax.scan`; the learning rate and the seed are arrays, so each optimizer compiles once.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import modopt
from modopt.examples.lm import corpus, recipes
from modopt.examples.lm.model import SIZES, loss, make_model

HERE = os.path.dirname(os.path.abspath(__file__))
GRID = (1 / 3, 1.0, 3.0)
SEEDS = (0, 1, 2)
TARGET_BITS = {"micro": 4.0, "tiny": 2.9, "small": 2.4, "medium": 1.9}
VALIDATION_WINDOWS = 64
# The optimizers of the table; the two state variants take AdamW's rate.
OPTIMIZERS = tuple(recipes.RECIPES)
VARIANTS = {"adamw 8-bit state": ("adamw", "8bit"), "adamw bf16 moments": ("adamw", "bf16")}
OPTAX = ("adamw", "lion", "muon", "schedule_free_adamw")


def optax_transform(name: str, model: Any, total_steps: int, peak: Any) -> Any:
    """optax's optimizer `name`, configured as `recipes.make_transform` configures modopt's."""
    import optax

    # Functions of the params: optax calls a callable mask, and an Equinox model is one.
    decay, warmup = recipes.decay_mask(model), recipes.warmup_steps(total_steps)
    mask = lambda params: decay  # noqa: E731

    def cosine(top):
        return optax.warmup_cosine_decay_schedule(0.0, top, warmup, max(total_steps, warmup + 1), end_value=top / 10)

    wd = recipes.WEIGHT_DECAY
    if name == "adamw":
        return optax.adamw(cosine(peak), weight_decay=wd, mask=mask)
    if name == "lion":
        return optax.lion(cosine(peak), weight_decay=wd, mask=mask)
    if name == "schedule_free_adamw":
        return optax.contrib.schedule_free_adamw(peak, warmup_steps=warmup, weight_decay=wd)
    if name == "muon":
        dims = jax.tree.map(
            lambda d: optax.contrib.MuonDimensionNumbers(reduction_axis=1, output_axis=0),
            recipes.muon_dimensions(model),
            is_leaf=lambda d: isinstance(d, modopt.contrib.MuonDimensionNumbers),
        )
        return optax.contrib.muon(
            cosine(peak), weight_decay=wd, weight_decay_mask=mask, adam_learning_rate=cosine(recipes.ADAM_LEARNING_RATE),
            adam_weight_decay=wd, muon_weight_dimension_numbers=lambda params: dims,
        )
    raise ValueError(name)


def _modopt_step(name: str):
    def step(model, optimizer, batch):
        grads = eqx.filter_grad(loss)(model, batch)
        return optimizer.step(model, grads)

    def evaluate(model, optimizer, windows):
        return loss(recipes.evaluation_model(name, model, optimizer), windows)

    return step, evaluate


def _optax_step(name: str, tx: Any):
    import optax

    def step(model, state, batch):
        params = eqx.filter(model, eqx.is_array)
        grads = eqx.filter_grad(loss)(model, batch)
        updates, state = tx.update(grads, state, params)
        return eqx.apply_updates(model, updates), state

    def evaluate(model, state, windows):
        if name == "schedule_free_adamw":
            params = optax.contrib.schedule_free_eval_params(state, eqx.filter(model, eqx.is_array))
            model = eqx.combine(params, eqx.filter(model, eqx.is_array, inverse=True))
        return loss(model, windows)

    return step, evaluate


def make_run(step: Callable, evaluate: Callable, eval_every: int):
    """`run(model, state, batches, windows) -> validation losses`: the whole run in one jit."""

    @eqx.filter_jit
    def run(model, state, batches, windows):
        dynamic, static = eqx.partition((model, state), eqx.is_array)

        def one(dynamic, batch):
            return eqx.filter(step(*eqx.combine(dynamic, static), batch), eqx.is_array), None

        def chunk(dynamic, batches):
            dynamic, _ = jax.lax.scan(one, dynamic, batches)
            return dynamic, evaluate(*eqx.combine(dynamic, static), windows)

        chunks = batches.reshape(-1, eval_every, *batches.shape[1:])
        return jax.lax.scan(chunk, dynamic, chunks)[1]

    return run


class Runner:
    """Trains one optimizer (compiled once) at any learning rate and seed."""

    def __init__(self, name: str, state: str, library: str, size: str, steps: int, eval_every: int):
        self.name, self.state, self.library, self.size, self.steps = name, state, library, size, steps
        self.eval_every = eval_every
        self.text = corpus.load()
        self.windows = jnp.asarray(self.text.validation_windows(VALIDATION_WINDOWS, SIZES[size]["context"]))
        self.run = None
        self.compile_seconds = None

    def _start(self, rate: float, seed: int):
        model = make_model(self.text.vocab_size, self.size, seed)
        rate = jnp.asarray(rate, jnp.float32)  # an array: a new rate does not recompile
        if self.library == "optax":
            tx = optax_transform(self.name, model, self.steps, rate)
            return model, tx.init(eqx.filter(model, eqx.is_array)), _optax_step(self.name, tx)
        tx = recipes.make_transform(self.name, model, self.steps, learning_rate=rate, state=self.state)
        return model, modopt.Optimizer(tx, model), _modopt_step(self.name)

    def train(self, rate: float, seed: int) -> dict:
        model, state, (step, evaluate) = self._start(rate, seed)
        config = SIZES[self.size]
        batches = jnp.asarray(np.stack([self.text.batch(seed, i, config["batch"], config["context"]) for i in range(self.steps)]))
        if self.run is None:
            self.run = make_run(step, evaluate, self.eval_every)
            start = time.perf_counter()
            self.run.lower(model, state, batches, self.windows).compile()
            self.compile_seconds = time.perf_counter() - start
        start = time.perf_counter()
        losses = np.asarray(jax.block_until_ready(self.run(model, state, batches, self.windows)), np.float64)
        seconds = time.perf_counter() - start
        bits = losses / math.log(2)
        return {
            "learning_rate": float(rate),
            "seed": seed,
            "curve": [float(b) for b in bits],
            "final_bits": float(bits[-1]),
            "step_seconds": seconds / self.steps,  # evaluations included: a few % of the steps
            "state_bytes_per_parameter": _state_bytes(state) / _count(model),
        }


def _count(model) -> int:
    return sum(x.size for x in jax.tree.leaves(eqx.filter(model, eqx.is_array)))


def _state_bytes(state) -> int:
    tree = state.state if isinstance(state, modopt.Optimizer) else state
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree) if hasattr(x, "dtype") and x.ndim)


def steps_to(curve, target: float, eval_every: int) -> int | None:
    below = np.flatnonzero(np.asarray(curve) <= target)
    return int((below[0] + 1) * eval_every) if below.size else None


def summarize(rows: list[dict], target: float, eval_every: int) -> dict:
    reached = [steps_to(r["curve"], target, eval_every) for r in rows]

    def spread(values):
        values = [v for v in values if v is not None]
        if not values:
            return None
        return [statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0]

    return {
        "reached": sum(r is not None for r in reached),
        "steps": spread(reached),
        "seconds": spread([s * r["step_seconds"] if s is not None else None for s, r in zip(reached, rows)]),
        "final_bits": spread([r["final_bits"] for r in rows]),
        "step_ms": spread([1000 * r["step_seconds"] for r in rows]),
    }


def benchmark(size: str, steps: int, eval_every: int, names, seeds, grid, with_optax: bool, log=print) -> dict:
    target = TARGET_BITS[size]
    results: dict[str, Any] = {}
    chosen: dict[str, float] = {}

    def record(label, runner, rows, tuning=None):
        results[label] = {
            "learning_rate": rows[0]["learning_rate"],
            "compile_seconds": runner.compile_seconds,
            "state_bytes_per_parameter": rows[0]["state_bytes_per_parameter"],
            "runs": rows,
            "tuning": tuning,
            **summarize(rows, target, eval_every),
        }
        log(f"{label:24s} lr {rows[0]['learning_rate']:.3g}: final {results[label]['final_bits']} bits, steps to {target}: {results[label]['steps']}")

    for name in names:
        runner = Runner(name, "float32", "modopt", size, steps, eval_every)
        default = recipes.RECIPES[name].learning_rate
        tuning = [runner.train(default * factor, seeds[0]) for factor in grid]
        best = min(tuning, key=lambda r: r["final_bits"] if math.isfinite(r["final_bits"]) else math.inf)
        chosen[name] = best["learning_rate"]
        rows = [best] + [runner.train(best["learning_rate"], seed) for seed in seeds[1:]]
        record(name, runner, rows, [{"learning_rate": r["learning_rate"], "final_bits": r["final_bits"]} for r in tuning])
        if with_optax and name in OPTAX:
            reference = Runner(name, "float32", "optax", size, steps, eval_every)
            optax_rows = [reference.train(best["learning_rate"], seed) for seed in seeds]
            record(f"{name} (optax)", reference, optax_rows)
            results[f"{name} (optax)"]["largest difference from modopt (bits)"] = max(
                float(np.max(np.abs(np.subtract(a["curve"], b["curve"])))) for a, b in zip(optax_rows, rows)
            )
    for label, (name, state) in VARIANTS.items():
        if name in chosen:
            runner = Runner(name, state, "modopt", size, steps, eval_every)
            record(label, runner, [runner.train(chosen[name], seed) for seed in seeds])
    return {"target_bits": target, "size": size, "steps": steps, "eval_every": eval_every, "results": results}


def _cell(pair, digits: int = 0) -> str:
    return "-" if pair is None else f"{pair[0]:.{digits}f} ± {pair[1]:.{digits}f}"


def table(report: dict) -> str:
    lines = [
        f"| optimizer | peak lr | runs reaching {report['target_bits']} bits | steps | seconds | final bits | step (ms) | compile (s) | state B/param |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, row in report["results"].items():
        note = ""
        if "largest difference from modopt (bits)" in row:
            note = f" (Δ {row['largest difference from modopt (bits)']:.1e})"
        lines.append(
            f"| {label}{note} | {row['learning_rate']:.3g} | {row['reached']}/{len(row['runs'])} | {_cell(row['steps'])} | "
            f"{_cell(row['seconds'], 1)} | {_cell(row['final_bits'], 3)} | {_cell(row['step_ms'], 1)} | "
            f"{row['compile_seconds']:.1f} | {row['state_bytes_per_parameter']:.1f} |"
        )
    return "\n".join(lines)


def plot(report: dict, path: str) -> None:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 4), dpi=100)
    by_steps, by_seconds = figure.subplots(1, 2)
    every = report["eval_every"]
    for label, row in report["results"].items():
        if "(optax)" in label:
            continue
        curve = np.mean([r["curve"] for r in row["runs"]], axis=0)
        steps = every * np.arange(1, len(curve) + 1)
        by_steps.plot(steps, curve, label=label)
        by_seconds.plot(steps * row["step_ms"][0] / 1000, curve, label=label)
    for axes, x in ((by_steps, "step"), (by_seconds, "seconds (steps x step time)")):
        axes.axhline(report["target_bits"], color="gray", linestyle="--", linewidth=0.8)
        axes.set(xlabel=x, ylabel="validation bits per character", ylim=(None, 4.5))
        axes.grid(True, alpha=0.3)
    by_steps.legend(fontsize=7, ncol=2)
    figure.suptitle(f"Shakespeare character model ({report['size']}), mean of {len(SEEDS)} seeds")
    figure.subplots_adjust(left=0.06, right=0.99, bottom=0.13, top=0.9, wspace=0.2)
    figure.savefig(path)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="tiny", choices=sorted(SIZES))
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--eval-every", type=int, default=40)
    parser.add_argument("--optimizers", nargs="*", default=list(OPTIMIZERS))
    parser.add_argument("--smoke", action="store_true", help="one learning rate, one seed, no files")
    parser.add_argument("--no-optax", action="store_true")
    parser.add_argument("--out", help="folder for the files (default: benchmarks/ unless --smoke)")
    args = parser.parse_args(argv)
    if args.steps % args.eval_every:
        parser.error("--steps must be a multiple of --eval-every")
    seeds, grid = ((0,), (1.0,)) if args.smoke else (SEEDS, GRID)
    start = time.perf_counter()
    report = benchmark(args.size, args.steps, args.eval_every, args.optimizers, seeds, grid, not args.no_optax, log=lambda s: print(s, flush=True))
    report["machine"] = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {jax.devices()[0].device_kind}; jax {jax.__version__}"
    report["date"] = datetime.date.today().isoformat()
    report["wall_seconds"] = time.perf_counter() - start
    text = (
        f"Time to {report['target_bits']} validation bits per character, Shakespeare character model ({args.size}, "
        f"{args.steps} steps), {report['machine']}, {report['date']}, {report['wall_seconds'] / 60:.0f} min in all\n\n{table(report)}\n"
    )
    print(text)
    out = args.out or (None if args.smoke else HERE)
    if out:
        with open(os.path.join(out, "time_to_result.txt"), "w") as f:
            f.write(text)
        with open(os.path.join(out, "time_to_result.json"), "w") as f:
            json.dump(report, f, indent=1)
        plot(report, os.path.join(out, "time_to_result.png"))
    return report


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
