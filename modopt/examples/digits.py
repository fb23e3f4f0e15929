"""Train an Equinox MLP on scikit-learn's digits with modopt.

Run with `python -m modopt.examples.digits [--epochs N] [--seed S] [--checkpoint-dir D]`.
The data set (1797 8x8 images of handwritten digits) ships with scikit-learn, so nothing is
downloaded. Training takes a few seconds on a laptop CPU and reaches about 97% test accuracy.

The model, the optimizer and the epoch are saved after every epoch (default directory
`checkpoints/digits`), with a plot of the loss curve, `loss_curve.png`. Interrupted (Ctrl-C,
or killed), the same command continues from the last checkpoint; `--fresh` starts over. A
progress bar shows the steps on a terminal.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from tqdm import tqdm

import modopt
from modopt.integrations.orbax import CheckpointManager

BATCH_SIZE = 64
MIN_ACCURACY = 0.90


def load_data(seed: int):
    """Returns normalized `(x_train, y_train, x_test, y_test)` as NumPy arrays."""
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x.astype(np.float32), y.astype(np.int32), test_size=0.2, random_state=seed, stratify=y
    )
    # Standardize each pixel with statistics of the training set only.
    mean, std = x_train.mean(axis=0), x_train.std(axis=0) + 1e-6
    return (x_train - mean) / std, y_train, (x_test - mean) / std, y_test


def loss_fn(model: eqx.nn.MLP, x: jax.Array, y: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy of a batch."""
    logits = jax.vmap(model)(x)
    log_probs = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(log_probs, y[:, None], axis=1))


# The model and optimizer are donated: their buffers are reused for the outputs. The step
# takes `(model, optimizer, batch)` in the order `optimizer.step` returns them, so XLA
# matches each donated input buffer to the output of the same shape.
@eqx.filter_jit(donate="all")
def train_step(model, optimizer, batch):
    x, y = batch
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
    model, optimizer = optimizer.step(model, grads)
    return model, optimizer, loss


@eqx.filter_jit
def accuracy(model, x, y):
    predictions = jnp.argmax(jax.vmap(model)(x), axis=1)
    return jnp.mean(predictions == y)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=positive_int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-dir", default=os.path.join("checkpoints", "digits"))
    parser.add_argument("--fresh", action="store_true", help="ignore and delete existing checkpoints")
    args = parser.parse_args(argv)

    x_train, y_train, x_test, y_test = load_data(args.seed)
    model = eqx.nn.MLP(64, 10, width_size=128, depth=2, key=jax.random.key(args.seed))

    # Every batch has the same shape (the last partial batch of an epoch is dropped),
    # so `train_step` compiles once.
    steps_per_epoch = len(x_train) // BATCH_SIZE
    total_steps = args.epochs * steps_per_epoch
    schedule = modopt.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=3e-3, warmup_steps=min(50, total_steps // 5), decay_steps=total_steps
    )
    # `with_diagnostics` records each step's gradient and update norms in the state.
    tx = modopt.with_diagnostics(modopt.chain(modopt.clip_by_global_norm(1.0), modopt.adamw(schedule, weight_decay=1e-4)))
    optimizer = modopt.Optimizer(tx, model)

    if args.fresh:
        shutil.rmtree(args.checkpoint_dir, ignore_errors=True)
    with CheckpointManager(args.checkpoint_dir, max_to_keep=2) as checkpoints:
        done, history = 0, _no_history(args)
        if checkpoints.latest_step() is not None:
            restored = checkpoints.restore(model=model, optimizer=optimizer, run=_run(args, 0, _no_history(args)))
            if restored["run"]["epochs"] != args.epochs or restored["run"]["seed"] != args.seed:
                print(
                    f"{args.checkpoint_dir} holds a run with other settings "
                    f"({restored['run']['epochs']} epochs, seed {restored['run']['seed']}); use --fresh "
                    "or another --checkpoint-dir.",
                    file=sys.stderr,
                )
                return 2
            model, optimizer, done = restored["model"], restored["optimizer"], restored["run"]["epoch"]
            history = np.array(restored["run"]["history"])  # a writable copy
            print(f"resuming after epoch {done} from {os.path.abspath(args.checkpoint_dir)}", flush=True)

        start = time.perf_counter()
        # On a terminal only (tqdm's `disable=None`); epoch lines go through `progress.write`.
        progress = tqdm(total=total_steps, initial=done * steps_per_epoch, unit="step", disable=None, leave=False)
        try:
            for epoch in range(done + 1, args.epochs + 1):
                # Each epoch's order depends only on (seed, epoch), so a resumed run sees the same batches.
                order = np.random.default_rng([args.seed, epoch]).permutation(len(x_train))
                losses = []
                for i in range(steps_per_epoch):
                    idx = order[i * BATCH_SIZE : (i + 1) * BATCH_SIZE]
                    batch = (jnp.asarray(x_train[idx]), jnp.asarray(y_train[idx]))
                    model, optimizer, loss = train_step(model, optimizer, batch)
                    losses.append(loss)  # kept on device: no host sync inside the epoch
                    progress.update()
                history[epoch - 1] = float(jnp.mean(jnp.stack(losses)))
                checkpoints.save(epoch, model=model, optimizer=optimizer, run=_run(args, epoch, history))  # in the background
                plot_losses(history, os.path.join(args.checkpoint_dir, "loss_curve.png"))
                # `optimizer.learning_rate` is the scheduled rate the next step will use; the
                # diagnostics are the last step's.
                seen = optimizer.diagnostics
                line = (
                    f"epoch {epoch:3d}  train loss {history[epoch - 1]:.4f}  learning rate "
                    f"{float(optimizer.learning_rate):.2e}  grad norm {float(seen['grad_norm']):.3f}  "
                    f"update norm {float(seen['update_norm']):.2e}"
                )
                progress.write(line) if not progress.disable else print(line, flush=True)
        except KeyboardInterrupt:
            progress.close()
            checkpoints.wait_until_finished()
            print(f"interrupted: run the same command to resume after epoch {checkpoints.latest_step()}", file=sys.stderr)
            return 130

        progress.close()

    test_accuracy = float(accuracy(model, jnp.asarray(x_test), jnp.asarray(y_test)))
    elapsed = time.perf_counter() - start
    print(f"test accuracy {test_accuracy:.2%} ({len(x_test)} images, {total_steps} steps, {elapsed:.1f} s)", flush=True)
    if test_accuracy < MIN_ACCURACY:
        print(f"FAILED: test accuracy below {MIN_ACCURACY:.0%}", file=sys.stderr)
        return 1
    return 0


def _run(args: argparse.Namespace, epoch: int, history: np.ndarray) -> dict:
    """Where the run is, and its mean training loss per epoch: saved with each checkpoint."""
    return {"epoch": epoch, "epochs": args.epochs, "seed": args.seed, "history": history}


def _no_history(args: argparse.Namespace) -> np.ndarray:
    return np.full(args.epochs, np.nan, np.float32)


def plot_losses(history: np.ndarray, path: str) -> None:
    """Writes the mean training loss per epoch so far as a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    epochs = np.arange(1, len(history) + 1)
    figure, axes = plt.subplots(figsize=(5, 3.2), dpi=100)
    axes.semilogy(epochs, history, marker="o")
    axes.set(xlabel="epoch", ylabel="mean training loss", title="digits MLP, modopt adamw")
    axes.xaxis.get_major_locator().set_params(integer=True)
    axes.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


if __name__ == "__main__":
    sys.exit(main())
