"""The optimizers beyond optax on the digits main job: steps to a target loss, step and compile time.

Run `python benchmarks/beyond_optax.py` (full size; writes benchmarks/beyond_optax.txt, .json
and .png) or `python benchmarks/beyond_optax.py --size tiny` (the CI smoke run: AdamW and
Adam-mini only, no references; writes nothing unless `--out`). Two parts:

1. Steps to a target training loss on the digits main job (`modopt.examples.digits`: its MLP,
   data, loss, batches and recipe, with the optimizer swapped in; see `_beyond_training.py`)
   for AdamW, Muon, SOAP, Shampoo, Kron and Adam-mini: each swept over the same peak learning
   rates with seed 0, its best rate run again with the other seeds. The loss is the mean loss on
   the whole training set, evaluated every few steps.
2. Step and compile time of each optimizer's jitted, donated update on the job's parameters,
   interleaved in one process (see `_beyond_timing.py`), as absolute numbers and as ratios to
   AdamW; `modopt.shampoo` against the authors' JAX code (`precondition-opt`) configured alike,
   in the same process; `modopt.kron` against `psgd-jax`, which does not import with the optax
   this project uses (0.2.8: it imports `optax._src.clipping`, gone since 0.2.7), so both are
   timed together in a process of another environment (`--psgd-python`), made for instance by

       python -m venv /tmp/psgd-jax-venv
       /tmp/psgd-jax-venv/bin/pip install --no-deps optax==0.2.6 psgd-jax==0.2.9
       echo "$PWD/.venv/lib/python3.11/site-packages" > /tmp/psgd-jax-venv/lib/python3.11/site-packages/modopt-venv.pth

   (the older optax first, then everything else, jax included, from this project's environment:
   both run on the same jax). `/tmp/psgd-jax-venv/bin/python` is used when it exists.

The full run costs about 3 minutes of CPU on a 2-core machine (compilation is most of it:
Shampoo's, Kron's and SOAP's steps take 15-30 s each to compile there). `beyond_optax_h100.*`
is the same command on an NVIDIA H100 (jax 0.11.2, with `--out` and the files renamed).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time
from typing import Any

import jax
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import _beyond_timing as timing  # noqa: E402
import _beyond_training as training  # noqa: E402
import bench  # noqa: E402

import modopt  # noqa: E402

DEFAULT_PSGD_PYTHON = "/tmp/psgd-jax-venv/bin/python"
FILES = ("beyond_optax.txt", "beyond_optax.json", "beyond_optax.png")

# The peak learning rates swept: four on one half-decade lattice, the same for AdamW, Adam-mini
# and Kron, shifted for the optimizers whose best rate lies elsewhere (in a first sweep of
# 1e-3..3e-2, Muon's and SOAP's best was the largest, Shampoo's the smallest): so that each
# best rate has a rate swept on both sides of it.
ADAM_LIKE = (1e-3, 3e-3, 1e-2, 3e-2)
LEARNING_RATES = {
    "adamw": ADAM_LIKE,
    "muon": (3e-3, 1e-2, 3e-2, 1e-1),
    "soap": (3e-3, 1e-2, 3e-2, 1e-1),
    "shampoo": (3e-4, 1e-3, 3e-3, 1e-2),
    "kron": ADAM_LIKE,
    "adam_mini": ADAM_LIKE,
}

SIZES = {
    "full": {
        "learning_rates": LEARNING_RATES, "references": True,
        # 10 epochs (the main job's default): 220 steps; the training loss every 4 steps.
        "epochs": 10, "eval_every": 4, "target": 0.05, "seeds": (0, 1),
        # Each timing run is 10 steps (a refresh of SOAP's and Shampoo's preconditioners in each).
        "timing": {"block": 10, "repeats": 5, "compile_repeats": 1},
    },
    "tiny": {
        "learning_rates": {"adamw": (3e-3, 1e-2), "adam_mini": (1e-2,)}, "references": False,
        "epochs": 1, "eval_every": 4, "target": 1.0, "seeds": (0,),
        "timing": {"block": 2, "repeats": 3, "compile_repeats": 1},
    },
}  # fmt: skip


def run(size: str, psgd_python: str | None = None, log=print) -> dict:
    s = SIZES[size]
    start = time.perf_counter()
    results: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "machine": bench.machine(),
        "backend": jax.default_backend(),
        "versions": {"jax": jax.__version__, "modopt": modopt.__version__},
        "size": size,
        "load average at start": round(os.getloadavg()[0], 1),  # the machine may be shared
    }
    log("1 steps to the target loss")
    results["steps to target"] = training.sweep(
        s["learning_rates"], s["seeds"], s["epochs"], s["eval_every"], s["target"], log=log
    )
    seconds = {"1": round(time.perf_counter() - start, 1)}
    log("2 step and compile times")
    optimizers = list(s["learning_rates"])
    if s["references"]:
        results["versions"]["precondition-opt"] = _version("precondition-opt")
        times = timing.main_process_timings(optimizers, s["timing"])
        results["psgd-jax"] = timing.psgd_timings(psgd_python, s["timing"])
    else:
        times = timing.time_contenders(
            {name: (lambda name=name: training.OPTIMIZERS[name](timing.LEARNING_RATE), "modopt") for name in optimizers},
            s["timing"],
        )
        results["psgd-jax"] = {"error": f"{timing.PSGD_FAILED}: no references at --size {size}"}
    results["times"] = times
    results["parameters"] = sum(p.size for p in timing.params_and_grads()[0].values())
    seconds["2"] = round(time.perf_counter() - start - seconds["1"], 1)
    results["seconds"] = time.perf_counter() - start
    results["seconds by part"] = seconds
    results["cpu seconds"] = round(time.process_time(), 1)  # this process's, not psgd-jax's
    return results


def _version(package: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


# ---- report --------------------------------------------------------------------------------


def table(results: dict) -> str:
    sweep = results["steps to target"]
    seeds = sweep["seeds"]
    lines = [
        f"modopt beyond optax on the digits main job, {results['date']}, {results['machine']}, {results['versions']}, "
        f"load average {results['load average at start']} at the start",
        "",
        f"1 steps to training loss {sweep['target_train_loss']} (mean over the training set, every "
        f"{sweep['eval_every']} steps; {sweep['total_steps']} steps = {sweep['epochs']} epoch(s) of batch 64)",
        "  clip_by_global_norm(1.0) + optimizer, warmup-cosine schedule to the peak learning rate swept with seed 0,",
        f"  the best one again with seed(s) {', '.join(map(str, seeds[1:])) or '(none)'}; '-': not reached",
        f"{'optimizer':12s} {'best lr':>8s} {'steps (median)':>15s} {'per seed':>16s} {'final loss':>11s} {'test acc.':>10s}",
    ]
    for name, row in sweep["optimizers"].items():
        best = row["best"]
        per_seed = ", ".join(_steps(r) for r in best["steps_to_target"])
        lines.append(
            f"{name:12s} {row['best_learning_rate']:>8g} {_steps(best['median_steps_to_target']):>15s} {per_seed:>16s} "
            f"{np.median(best['final_train_loss']):>11.2e} {100 * np.mean(best['test_accuracy']):>9.1f}%"
        )
    rates = sorted({rate for values in sweep["learning_rates"].values() for rate in values})
    lines += ["", f"  steps to the target by peak learning rate (seed {seeds[0]}; blank: not swept)"]
    lines.append(f"{'optimizer':12s} " + " ".join(f"{rate:>8g}" for rate in rates))
    for name, row in sweep["optimizers"].items():
        cells = [_steps(row["rates"][repr(r)]["steps_to_target"]) if repr(r) in row["rates"] else "" for r in rates]
        lines.append(f"{name:12s} " + " ".join(f"{cell:>8s}" for cell in cells))

    times = results["times"]
    adamw = times.get("adamw")
    lines += [
        "",
        f"2 the jitted, donated update on the job's {results['parameters']:,} parameters (interleaved, one process); "
        "step: median of runs of consecutive steps, amortized",
        f"{'optimizer':26s} {'step':>10s} {'/ adamw':>8s} {'compile':>9s} {'/ adamw':>8s}",
    ]
    for name, row in times.items():
        step_ratio = f"{row['step_s'] / adamw['step_s']:8.2f}" if adamw else f"{'':8s}"
        compile_ratio = f"{row['compile_s'] / adamw['compile_s']:8.2f}" if adamw else f"{'':8s}"
        lines.append(f"{name:26s} {_ms(row['step_s']):>10s} {step_ratio} {row['compile_s']:8.2f}s {compile_ratio}")
    lines.append("")
    if "precondition-opt shampoo" in times:
        lines.append(_versus("shampoo", "precondition-opt shampoo", times, "same process"))
    psgd = results["psgd-jax"]
    if "error" in psgd:
        lines.append(f"kron / psgd-jax kron: {psgd['error']}")
    else:
        lines.append(_versus("kron", "psgd-jax kron", psgd["times"], f"both in one process of their own, {psgd['versions']}"))
        for name, row in psgd["times"].items():
            lines.append(f"  {name:24s} {_ms(row['step_s']):>10s} {row['compile_s']:8.2f}s")
    lines.append(
        f"\nwhole run: {results['seconds']:.0f} s (by part: {results['seconds by part']}), "
        f"{results['cpu seconds']:.0f} s of CPU (without the psgd-jax process)"
    )
    return "\n".join(lines)


def _versus(ours: str, theirs: str, times: dict, where: str) -> str:
    a, b = times[ours], times[theirs]
    return (
        f"{ours} / {theirs} ({where}): step {a['step_s'] / b['step_s']:.2f}x, "
        f"compile {a['compile_s'] / b['compile_s']:.2f}x"
    )


def _steps(value) -> str:
    return "-" if value is None else f"{value:g}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def plot(results: dict, path: str) -> None:
    """Training-loss curves at each optimizer's best rate (seed 0), and steps to the target by rate."""
    from matplotlib.figure import Figure  # no pyplot: no global backend, no display needed

    sweep = results["steps to target"]
    figure = Figure(figsize=(12, 4.2), dpi=100)
    curves, by_rate = figure.subplots(1, 2)
    steps = sweep["eval_every"] * np.arange(1, sweep["total_steps"] // sweep["eval_every"] + 1)
    for name, row in sweep["optimizers"].items():
        best = row["rates"][repr(row["best_learning_rate"])]
        curves.semilogy(steps, best["curve"], label=f"{name} (lr {row['best_learning_rate']:g})")
        rates = [r for r in sweep["learning_rates"][name] if row["rates"][repr(r)]["steps_to_target"] is not None]
        by_rate.semilogx(rates, [row["rates"][repr(r)]["steps_to_target"] for r in rates], marker="o", label=name)
    target = sweep["target_train_loss"]
    curves.axhline(target, color="black", linestyle=":", linewidth=1, label=f"target {target:g}")
    curves.set(xlabel="step", ylabel="training loss (whole training set)", title="best peak learning rate, seed 0")
    by_rate.set(
        xlabel="peak learning rate",
        ylabel=f"steps to training loss {target:g}",
        title="learning-rate sweep, seed 0 (missing: not reached)",
        ylim=(0, sweep["total_steps"]),
    )
    for axes in (curves, by_rate):
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=8)
    figure.suptitle("digits MLP (the main job), modopt optimizers")
    figure.subplots_adjust(left=0.06, right=0.99, bottom=0.13, top=0.87, wspace=0.2)
    figure.savefig(path)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument(
        "--out", help="folder for beyond_optax.txt, .json and .png (default: benchmarks/ for --size full, none for tiny)"
    )
    parser.add_argument(
        "--psgd-python",
        default=DEFAULT_PSGD_PYTHON if os.path.exists(DEFAULT_PSGD_PYTHON) else None,
        help=f"a Python in which psgd-jax imports, to time psgd_jax.kron (default: {DEFAULT_PSGD_PYTHON} if it exists)",
    )
    args = parser.parse_args(argv)
    out = args.out if args.out is not None else (HERE if args.size == "full" else None)
    results = run(args.size, args.psgd_python, log=lambda line: print(line, file=sys.stderr, flush=True))
    if out:
        os.makedirs(out, exist_ok=True)
        txt, js, png = (os.path.join(out, name) for name in FILES)
        with open(js, "w") as file:
            json.dump(_finite(results), file, indent=1)
    text = table(results)
    print(text)
    if out:
        with open(txt, "w") as file:
            file.write(text + "\n")
        plot(results, png)
    return results


def _finite(tree):
    """NaN and infinite losses (a diverged run) as strings: JSON has no such numbers."""
    if isinstance(tree, dict):
        return {k: _finite(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [_finite(v) for v in tree]
    if isinstance(tree, float) and not math.isfinite(tree):
        return str(tree)
    return tree


if __name__ == "__main__":
    main()
    sys.exit(0)
