"""Train an Equinox MLP on scikit-learn's digits with modopt.

Run with `python -m modopt.examples.digits [--epochs N] [--seed S] [--checkpoint-dir D] [--fresh]`.
The data set (1797 8x8 images of handwritten digits) ships with scikit-learn, so nothing is
downloaded. Training takes a few seconds on a laptop CPU and reaches about 97% test accuracy.

The model, the optimizer and where the run is are saved after every epoch (default directory
`checkpoints/digits`), with a plot of the training loss, the learning rate and the test accuracy
per epoch, `training_curves.png`. Ctrl-C stops the run between two steps and saves it there
(exit status 130); a second Ctrl-C stops at once. The same command then continues exactly where
the run stopped (also after a kill, from the last save); `--fresh` starts over. Another `--epochs`
or `--seed` on an existing directory is refused rather than mixed in. A progress bar shows the
steps on a terminal.

`--processes 2` trains data-parallel in 2 processes of one `jax.distributed` run on this machine,
as on a TPU pod (one process per host): the model and optimizer are replicated over every
device, each process feeds its half of every batch, all save the checkpoint, process 0 prints.
It ends as one process does (up to the order of the gradient's sum), and either resumes the
other's checkpoints. On several hosts, start one process on each with `--processes N
--process-id I --coordinator HOST:PORT` (HOST: process 0's).
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
from jax.experimental import multihost_utils

import modopt
from modopt.examples import _processes
from modopt.examples._interrupts import EXIT_INTERRUPTED, InterruptFlag, exit_with, interrupt_point, report
from modopt.examples._runs import EXIT_SETTINGS, Stop, check_settings, copied, positive_int

BATCH_SIZE = 64
MIN_ACCURACY = 0.90
PLOT = "training_curves.png"
# What is recorded per epoch: saved with every checkpoint, printed, and plotted.
SERIES = ("train_loss", "learning_rate", "test_accuracy")


def load_data(seed: int):
    """Returns normalized `(x_train, y_train, x_test, y_test)` as NumPy arrays."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

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


# The model and optimizer are donated (`jit_step`'s default): their buffers are reused for the
# outputs. The step takes `(model, optimizer, batch)` in the order `optimizer.step` returns
# them, so XLA matches each donated input buffer to the output of the same shape.
@modopt.jit_step
def train_step(model, optimizer, batch):
    x, y = batch
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
    model, optimizer = optimizer.step(model, grads)
    return model, optimizer, loss


@eqx.filter_jit
def accuracy(model, x, y):
    predictions = jnp.argmax(jax.vmap(model)(x), axis=1)
    return jnp.mean(predictions == y)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m modopt.examples.digits",
        description=__doc__.splitlines()[0],
        epilog=(
            "Ctrl-C stops between two steps and saves (exit status 130); the same command resumes. "
            "A finished run is not trained again: the command prints its test accuracy."
        ),
    )
    parser.add_argument("--epochs", type=positive_int, default=10, help="passes over the training set (default: 10)")
    parser.add_argument("--seed", type=int, default=0, help="data split, initialization and batch order (default: 0)")
    parser.add_argument(
        "--checkpoint-dir",
        default=os.path.join("checkpoints", "digits"),
        help="where the run is saved and resumed from (default: checkpoints/digits)",
    )
    parser.add_argument("--fresh", action="store_true", help="delete the checkpoint directory and start over")
    parser.add_argument(
        "--processes",
        type=positive_int,
        default=1,
        help="train data-parallel in this many processes, as on a pod (alone: all on this machine; default: 1)",
    )
    parser.add_argument("--process-id", type=int, help="with --coordinator: be this process of --processes (one per host)")
    parser.add_argument("--coordinator", help="host:port of process 0, where the processes meet (jax.distributed)")
    args = parser.parse_args(argv)
    if (args.process_id is None) != (args.coordinator is None):
        parser.error("--process-id and --coordinator go together")
    if args.process_id is not None and not 0 <= args.process_id < args.processes:
        parser.error(f"--process-id must be in [0, {args.processes}), got {args.process_id}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.processes > 1 and args.process_id is None:  # start them here, each a process of one run
        return _processes.launch("modopt.examples.digits", sys.argv[1:] if argv is None else argv, args.processes)
    if args.process_id is not None:
        _processes.initialize(args.coordinator, args.processes, args.process_id)
    # From here on Ctrl-C only sets a flag (see `_interrupts`): the job looks at it between the
    # stages of its set-up (imports, data, restore, compilation) and between training steps.
    with InterruptFlag() as interrupt, _processes.quiet_unless_first(args.process_id or 0):
        try:
            return _job(args, _processes.agreed(interrupt))  # all processes stop at the same step
        except Stop as stop:
            report(stop.message)
            return stop.status


def _job(args: argparse.Namespace, interrupt: InterruptFlag) -> int:
    from tqdm import tqdm

    from modopt.integrations.orbax import CheckpointError, CheckpointManager

    if args.fresh and jax.process_index() == 0:
        shutil.rmtree(args.checkpoint_dir, ignore_errors=True)
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("checkpoint directory ready")
    again = "the command without --fresh" if args.fresh else "the same command"
    settings = {"epochs": args.epochs, "seed": args.seed, "batch_size": BATCH_SIZE}
    with CheckpointManager(args.checkpoint_dir, max_to_keep=2) as checkpoints:
        directory, latest = checkpoints.directory, checkpoints.latest_step()

        def set_up_done_so_far() -> None:
            if interrupt.requested:
                kept = (
                    "nothing was trained or saved; the next run starts fresh"
                    if latest is None
                    else f"nothing was trained; {again} resumes from the checkpoint at step {latest}"
                )
                raise Stop(f"interrupted during set-up: {kept}.", EXIT_INTERRUPTED)

        if latest is not None:
            _check_settings(checkpoints, settings, CheckpointError)
        set_up_done_so_far()

        x_train, y_train, x_test, y_test = load_data(args.seed)
        interrupt_point("setup", interrupt)
        set_up_done_so_far()
        # Every batch has the same shape (the last partial batch of an epoch is dropped),
        # so `train_step` compiles once.
        steps_per_epoch = len(x_train) // BATCH_SIZE
        total_steps = args.epochs * steps_per_epoch
        # Data-parallel over every device of every process: the model and optimizer replicated,
        # each batch split by rows (nothing changes in a single process on one device).
        parallel = _processes.DataParallel()
        model, optimizer = parallel.replicate(_model_and_optimizer(args.seed, total_steps))
        run = new_run(args.epochs, steps_per_epoch)
        set_up_done_so_far()

        if latest is not None:
            try:
                restored = checkpoints.restore(model=model, optimizer=optimizer, run=run)
            except CheckpointError as error:
                raise Stop(
                    f"{directory} holds a checkpoint that cannot be resumed: {error} "
                    "Use --fresh to start over there, or another --checkpoint-dir.",
                    EXIT_SETTINGS,
                ) from None
            model, optimizer = restored["model"], restored["optimizer"]
            run = jax.tree.map(np.array, restored["run"])  # writable NumPy copies
        x_test, y_test = parallel.replicate((x_test, y_test))
        step = saved = first = int(run["step"])
        history, epoch_losses = run["history"], run["epoch_losses"]
        if step == total_steps:
            print(
                f"the run in {directory} is already complete ({args.epochs} epochs, {total_steps} steps): "
                "nothing to train (--fresh trains it again)",
                flush=True,
            )
            test_accuracy = float(accuracy(model, x_test, y_test))  # the checkpoint's model, evaluated again
            print(f"test accuracy {test_accuracy:.2%} ({len(x_test)} images, {total_steps} steps, none in this run)")
            return _verdict(test_accuracy)
        if step:
            print(f"resuming {_where(step, steps_per_epoch)} from {directory}", flush=True)

        # Compile before the loop, so that an interrupt during compilation is one during set-up.
        order = _order(args.seed, step // steps_per_epoch + 1, len(x_train))
        train_step.lower(model, optimizer, parallel.batch(*_batch(x_train, y_train, order, 0))).compile()
        accuracy.lower(model, x_test, y_test).compile()
        set_up_done_so_far()

        def stop() -> int:
            """Saves the steps since the last save, says where the run stands, and exits 130."""
            if step > saved:
                run = {"step": step, "history": history, "epoch_losses": epoch_losses}
                checkpoints.save(step, model=model, optimizer=optimizer, settings=settings, run=copied(run))
                checkpoints.wait_until_finished()
                message = f"interrupted {_where(step, steps_per_epoch)}: checkpoint saved; {again} resumes from there."
            elif step:
                message = f"interrupted {_where(step, steps_per_epoch)}, which is saved; {again} resumes from there."
            else:
                message = "interrupted before the first step: nothing was trained or saved; the next run starts fresh."
            if step == total_steps:
                message = f"interrupted after the last epoch: the run is complete and saved; {again} prints its test accuracy."
            report(message)  # on a line of its own, below the progress bar
            return EXIT_INTERRUPTED

        start = time.perf_counter()
        # On a terminal only (tqdm's `disable=None`); epoch lines go through `progress.write`.
        progress = tqdm(total=total_steps, initial=step, unit="step", disable=None, leave=False)
        try:
            while step < total_steps:
                epoch, done_in_epoch = divmod(step, steps_per_epoch)
                epoch += 1
                # Each epoch's order depends only on (seed, epoch), so a resumed run sees the same
                # batches; the losses of a partly done epoch come from the checkpoint.
                order = _order(args.seed, epoch, len(x_train))
                losses = [jnp.asarray(loss) for loss in epoch_losses[:done_in_epoch]]
                for i in range(done_in_epoch, steps_per_epoch):
                    if i == steps_per_epoch // 2:
                        interrupt_point({1: "before-first-save", 2: "mid-epoch"}.get(epoch, ""), interrupt)
                    if interrupt.requested:
                        epoch_losses[:] = np.nan
                        epoch_losses[:i] = [float(loss) for loss in losses]
                        return stop()
                    batch = parallel.batch(*_batch(x_train, y_train, order, i))
                    model, optimizer, loss = train_step(model, optimizer, batch)
                    # Waiting for each step keeps Ctrl-C prompt: the flag is seen within one step.
                    losses.append(loss.block_until_ready())
                    step += 1
                    progress.update()

                history["train_loss"][epoch - 1] = float(jnp.mean(jnp.stack(losses)))
                # `optimizer.learning_rate` is the scheduled rate the next step will use.
                history["learning_rate"][epoch - 1] = float(optimizer.learning_rate)
                history["test_accuracy"][epoch - 1] = float(accuracy(model, x_test, y_test))
                epoch_losses[:] = np.nan
                run = {"step": step, "history": history, "epoch_losses": epoch_losses}
                checkpoints.save(step, model=model, optimizer=optimizer, settings=settings, run=copied(run))  # in the background
                saved = step
                if jax.process_index() == 0:
                    plot_history(history, os.path.join(directory, PLOT))
                line = _epoch_line(epoch, history, optimizer.diagnostics)
                progress.write(line) if not progress.disable else print(line, flush=True)
            if interrupt.requested:
                return stop()
        finally:
            progress.close()

    test_accuracy = float(history["test_accuracy"][-1])
    elapsed = time.perf_counter() - start
    in_this_run = f", {step - first} in this run" if first else ""
    print(
        f"test accuracy {test_accuracy:.2%} ({len(x_test)} images, {total_steps} steps{in_this_run}, {elapsed:.1f} s)",
        flush=True,
    )
    return _verdict(test_accuracy)


def make_model(seed: int) -> eqx.nn.MLP:
    """The job's model: an MLP from the 64 pixels to 10 logits, two hidden layers of 128."""
    return eqx.nn.MLP(64, 10, width_size=128, depth=2, key=jax.random.key(seed))


def _model_and_optimizer(seed: int, total_steps: int) -> tuple[eqx.nn.MLP, modopt.Optimizer]:
    model = make_model(seed)
    schedule = modopt.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=3e-3, warmup_steps=min(50, total_steps // 5), decay_steps=total_steps
    )
    # `with_diagnostics` records each step's gradient and update norms in the state.
    tx = modopt.with_diagnostics(modopt.chain(modopt.clip_by_global_norm(1.0), modopt.adamw(schedule, weight_decay=1e-4)))
    return model, modopt.Optimizer(tx, model)


def _check_settings(checkpoints, settings: dict, checkpoint_error: type[Exception]) -> None:
    names = {"epochs": "--epochs", "seed": "--seed", "batch_size": "batch size"}
    check_settings(checkpoints, settings, names, checkpoint_error)


def new_run(epochs: int, steps_per_epoch: int) -> dict:
    """Where a run is, saved with every checkpoint: its step, the per-epoch `SERIES` (NaN until
    an epoch is done) and the losses of the epoch in progress (for a save between epochs)."""
    return {
        "step": 0,
        "history": {name: np.full(epochs, np.nan, np.float32) for name in SERIES},
        "epoch_losses": np.full(steps_per_epoch, np.nan, np.float32),
    }


def _order(seed: int, epoch: int, n: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n)


def _batch(x: np.ndarray, y: np.ndarray, order: np.ndarray, i: int) -> tuple[np.ndarray, np.ndarray]:
    idx = order[i * BATCH_SIZE : (i + 1) * BATCH_SIZE]
    return x[idx], y[idx]


def _where(step: int, steps_per_epoch: int) -> str:
    epoch, within = divmod(step, steps_per_epoch)
    if within == 0:
        return f"after epoch {epoch} (step {step})"
    return f"at step {step} (epoch {epoch + 1}, {within} of {steps_per_epoch} steps done)"


def _epoch_line(epoch: int, history: dict, diagnostics: dict) -> str:
    # The diagnostics are the last step's.
    return (
        f"epoch {epoch:3d}  train loss {history['train_loss'][epoch - 1]:.4f}  "
        f"test accuracy {history['test_accuracy'][epoch - 1]:.2%}  "
        f"learning rate {history['learning_rate'][epoch - 1]:.2e}  grad norm {float(diagnostics['grad_norm']):.3f}  "
        f"update norm {float(diagnostics['update_norm']):.2e}"
    )


def _verdict(test_accuracy: float) -> int:
    if test_accuracy < MIN_ACCURACY:
        print(f"FAILED: test accuracy below {MIN_ACCURACY:.0%}", file=sys.stderr)
        return 1
    return 0


def plot_history(history: dict, path: str) -> None:
    """Writes the per-epoch training loss, learning rate and test accuracy so far as one PNG."""
    from matplotlib.figure import Figure  # no pyplot: no global backend, no display needed

    epochs = np.arange(1, len(history["train_loss"]) + 1)
    figure = Figure(figsize=(12, 3.2), dpi=100)
    loss, rate, acc = figure.subplots(1, 3)
    loss.semilogy(epochs, history["train_loss"], marker="o")
    loss.set(ylabel="mean training loss")
    rate.plot(epochs, history["learning_rate"], marker="o", color="tab:orange")
    rate.set(ylabel="learning rate (end of epoch)")
    acc.plot(epochs, 100 * history["test_accuracy"], marker="o", color="tab:green")
    acc.set(ylabel="test accuracy (%)")
    for axes in (loss, rate, acc):
        axes.set(xlabel="epoch", xlim=(0.5, len(epochs) + 0.5))
        axes.xaxis.get_major_locator().set_params(integer=True)
        axes.grid(True, alpha=0.3)
    figure.suptitle("digits MLP, modopt adamw")
    # A fixed layout: the automatic ones cost more than the rest of the plot.
    figure.subplots_adjust(left=0.06, right=0.99, bottom=0.16, top=0.88, wspace=0.28)
    figure.savefig(path)


if __name__ == "__main__":
    exit_with(main())  # a Ctrl-C during the clean-up at exit ends it quietly
