"""The main job (`python -m modopt.examples.digits`): accuracy, records, resume, and Ctrl-C.

One straight run (in this process) is shared: its output, checkpoint and plot are checked, it is
rerun as it stands and with other settings, and an interrupted run must end exactly as it did.
Interrupts go to a real job in a subprocess: at a named point through the job's hidden test
hook (`_MODOPT_TEST_INTERRUPT_AT`, the job signals itself), and once from this process with
`os.kill` while the job waits at a point; no test depends on sleeping.
"""

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

from modopt.examples import _interrupts, digits
from testing_signals import sigint_handled_in_children

EPOCHS = 5
# 1437 training images in batches of 64: 22 steps per epoch; the hook points are in the middle.
STEPS_PER_EPOCH = 22

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a process is POSIX")


def run_main(*args):
    """`digits.main(args)` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = digits.main(list(args))
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """How to start the job in a subprocess: (command, environment) for a checkpoint directory
    and a test hook. The subprocesses share a persistent compilation cache (half their time)."""
    cache = tmp_path_factory.mktemp("jax_cache")

    def start(directory, hook):
        command = [sys.executable, "-m", "modopt.examples.digits", "--epochs", str(EPOCHS), "--checkpoint-dir", str(directory)]
        env = {
            **os.environ,
            _interrupts.TEST_HOOK: hook,
            "JAX_COMPILATION_CACHE_DIR": str(cache),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
        }
        return command, env

    return start


def run_job(job, directory, hook, terminal=False):
    """The job in a subprocess with the test hook set: (exit status, stdout, stderr). With
    `terminal`, its stderr is a terminal (a pseudo-terminal): the progress bar is shown there."""
    command, env = job(directory, hook)
    if not terminal:
        with sigint_handled_in_children():
            done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=directory.parent)
        return done.returncode, done.stdout, done.stderr
    import fcntl
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # 24 rows, 120 columns
    with sigint_handled_in_children():
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=follower, text=True, env=env, cwd=directory.parent)
    os.close(follower)
    chunks = []
    reader = threading.Thread(target=_read_all, args=(leader, chunks))
    reader.start()
    out, _ = process.communicate(timeout=300)
    reader.join(timeout=60)
    os.close(leader)
    return process.returncode, out, b"".join(chunks).decode(errors="replace")


def _read_all(fd, chunks):
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the job closed the terminal
            return
        if not chunk:
            return
        chunks.append(chunk)


def screen(text: str) -> list[str]:
    """The lines a terminal shows for `text`: a carriage return goes back to the line's start,
    later characters overwrite earlier ones (escape sequences are left out)."""
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    lines, line, column = [], [], 0
    for character in text:
        if character == "\r":
            column = 0
        elif character == "\n":
            lines.append("".join(line).rstrip())
            line, column = [], 0
        else:
            line[column : column + 1] = [character]
            column += 1
    return lines + ["".join(line).rstrip()]


@pytest.fixture(params=["SIGINT handled", "SIGINT ignored by the launcher"])
def launcher(request):
    """How this test process was started: normally, or ignoring SIGINT (a background job, `nohup
    ... &`), which is what the processes it starts inherit. The tests must pass either way."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are handled in the main thread only")
    before = signal.getsignal(signal.SIGINT)
    ignored = request.param != "SIGINT handled"
    signal.signal(signal.SIGINT, signal.SIG_IGN if ignored else signal.default_int_handler)
    yield ignored
    signal.signal(signal.SIGINT, before)


def results(out: str) -> list[str]:
    """The epoch lines and the final accuracy (without the timing), which a resumed run must repeat."""
    lines = [line for line in out.splitlines() if line.startswith("epoch")]
    return lines + re.findall(r"^test accuracy [0-9.]+%", out, re.MULTILINE)


def final_accuracy(out: str) -> float:
    return float(re.search(r"^test accuracy ([0-9.]+)%", out, re.MULTILINE).group(1))


def saved_run(directory, epochs=EPOCHS):
    """The `run` record of the latest checkpoint: its step, per-epoch history, partial epoch."""
    from modopt.integrations.orbax import CheckpointManager

    with CheckpointManager(directory) as manager:
        return manager.restore(run=digits.new_run(epochs, STEPS_PER_EPOCH))["run"]


def assert_interrupted(status, err, message):
    assert status == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err and "None" not in err, err[-3000:]
    assert message in err, err[-3000:]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """An uninterrupted run: (checkpoint directory, stdout)."""
    directory = tmp_path_factory.mktemp("straight")
    status, out, err = run_main("--epochs", str(EPOCHS), "--checkpoint-dir", str(directory))
    assert status == 0, err
    return directory, out


def test_steps_per_epoch_matches_the_data():
    assert len(digits.load_data(0)[0]) // digits.BATCH_SIZE == STEPS_PER_EPOCH


def test_digits_trains_above_90_percent_and_records_its_history(straight):
    directory, out = straight
    losses = [float(x) for x in re.findall(r"train loss ([0-9.]+)", out)]
    assert len(losses) == EPOCHS and losses[-1] < losses[0] / 5, out
    assert final_accuracy(out) > 90.0, out
    assert f" {EPOCHS * STEPS_PER_EPOCH} steps, " in out and "in this run" not in out  # a fresh run trains every step
    with open(directory / digits.PLOT, "rb") as plot:
        assert plot.read(8) == b"\x89PNG\r\n\x1a\n"

    # Every epoch's training loss, learning rate and test accuracy are saved, as printed.
    record = saved_run(directory)
    assert int(record["step"]) == EPOCHS * STEPS_PER_EPOCH
    history = record["history"]
    assert set(history) == {"train_loss", "learning_rate", "test_accuracy"}
    for name, pattern, scale in [
        ("train_loss", r"train loss ([0-9.]+)", 1),
        ("learning_rate", r"learning rate ([0-9.e+-]+)", 1),
        ("test_accuracy", r"  test accuracy ([0-9.]+)%", 100),
    ]:
        printed = [float(x) for x in re.findall(pattern, out)]
        assert len(printed) == EPOCHS and np.all(np.isfinite(history[name])), (name, out)
        np.testing.assert_allclose(scale * history[name], printed, rtol=5e-3, atol=1e-4, err_msg=name)
    assert history["learning_rate"][0] > 0 and history["learning_rate"][-1] < history["learning_rate"][1]
    assert 100 * history["test_accuracy"][-1] == pytest.approx(final_accuracy(out), abs=0.006)


def test_rerun_of_a_finished_run_trains_nothing_and_says_so(straight):
    directory, out = straight
    status, again, err = run_main("--epochs", str(EPOCHS), "--checkpoint-dir", str(directory))
    assert status == 0, err
    assert "already complete" in again and "nothing to train" in again, again
    assert "epoch " not in again.replace("epochs", ""), again  # no epoch lines: nothing was trained
    assert "none in this run" in again, again
    assert final_accuracy(again) == final_accuracy(out)  # the checkpoint's model, evaluated again
    assert int(saved_run(directory)["step"]) == EPOCHS * STEPS_PER_EPOCH


@pytest.mark.parametrize(
    "change, named",
    [(["--epochs", str(EPOCHS + 1)], f"--epochs {EPOCHS} there, {EPOCHS + 1} now"), (["--seed", "1"], "--seed 0 there, 1 now")],
)
def test_other_settings_on_an_existing_directory_are_refused(straight, change, named):
    directory, _ = straight
    status, out, err = run_main("--epochs", str(EPOCHS), *change, "--checkpoint-dir", str(directory))
    assert status == 2 and not out, (out, err)
    assert "holds a run with other settings" in err and "use --fresh" in err, err
    assert named in err, err  # names the setting that differs
    assert int(saved_run(directory)["step"]) == EPOCHS * STEPS_PER_EPOCH  # untouched


def test_a_directory_of_another_kind_is_refused(tmp_path):
    from modopt.integrations.orbax import CheckpointManager

    with CheckpointManager(tmp_path) as manager:
        manager.save(3, run={"epoch": 3})  # e.g. a checkpoint of an older version of the job
    status, out, err = run_main("--checkpoint-dir", str(tmp_path))
    assert status == 2 and not out, (out, err)
    assert "holds a checkpoint of another kind" in err and "use --fresh" in err, err


def test_interrupt_during_set_up_exits_130_with_one_line(launcher, job, tmp_path):
    """Also with a second Ctrl-C as the job exits (in JAX's clean-up): no traceback."""
    status, out, err = run_job(job, tmp_path / "run", "setup,exit")
    assert_interrupted(status, err, "interrupted during set-up: nothing was trained or saved; the next run starts fresh.")
    assert not out and len(err.strip().splitlines()) == 1, err
    assert not [p for p in (tmp_path / "run").iterdir() if p.name.isdigit()]


def test_interrupt_before_the_first_save_saves_the_steps_done(job, tmp_path):
    """On a terminal, where the progress bar is shown: the message is on a line of its own."""
    status, out, err = run_job(job, tmp_path / "run", "before-first-save", terminal=True)
    half = STEPS_PER_EPOCH // 2
    message = f"interrupted at step {half} (epoch 1, {half} of {STEPS_PER_EPOCH} steps done): checkpoint saved;"
    assert_interrupted(status, err, message)
    assert "resumes from there" in err and not out, (out, err)
    lines = screen(err)
    assert any(f"/{STEPS_PER_EPOCH * EPOCHS} [" in line for line in lines), lines  # the progress bar was shown
    assert [line for line in lines if message in line] == [message + " the same command resumes from there."], lines
    record = saved_run(tmp_path / "run")
    assert int(record["step"]) == half and np.all(np.isnan(record["history"]["train_loss"]))
    assert np.all(np.isfinite(record["epoch_losses"][:half])) and np.all(np.isnan(record["epoch_losses"][half:]))


def test_ctrl_c_mid_epoch_saves_and_the_rerun_ends_as_the_straight_run(straight, job, tmp_path):
    """A real SIGINT from this process, while the job waits mid-epoch 2; then the same command."""
    directory = tmp_path / "run"
    command, env = job(directory, "mid-epoch:parent")
    with sigint_handled_in_children():
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    seen = []
    for line in process.stderr:  # set-up warnings may come first
        seen.append(line)
        if line.startswith("waiting for SIGINT at mid-epoch"):
            os.kill(process.pid, signal.SIGINT)
            break
    out, err = process.communicate(timeout=120)
    err = "".join(seen) + err
    step = STEPS_PER_EPOCH + STEPS_PER_EPOCH // 2
    assert_interrupted(process.returncode, err, f"interrupted at step {step} (epoch 2, {STEPS_PER_EPOCH // 2} of")
    assert "checkpoint saved; the same command resumes from there." in err
    straight_dir, straight_out = straight
    assert results(out) == results(straight_out)[:1], out

    status, resumed, err = run_main("--epochs", str(EPOCHS), "--checkpoint-dir", str(directory))
    assert status == 0, err
    assert f"resuming at step {step} (epoch 2," in resumed, resumed
    # Bit-exact: the epoch lines from the interrupted epoch on, and the accuracy, are the straight run's.
    assert results(resumed) == results(straight_out)[1:], (resumed, straight_out)
    total = EPOCHS * STEPS_PER_EPOCH
    assert f" {total} steps, {total - step} in this run," in resumed, resumed
    history, expected = saved_run(directory)["history"], saved_run(straight_dir)["history"]
    for name in expected:
        np.testing.assert_array_equal(history[name], expected[name], err_msg=name)


def test_interrupt_flag_restores_the_handler_and_a_second_ctrl_c_aborts(launcher):
    if launcher:  # SIGINT ignored: the flag leaves it so (as Python does), and is never set
        with _interrupts.InterruptFlag() as interrupt:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            signal.raise_signal(signal.SIGINT)
            assert not interrupt.requested
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a foreground program
    before = signal.getsignal(signal.SIGINT)
    aborted = []
    with _interrupts.InterruptFlag(on_second=lambda: aborted.append(True)) as interrupt:
        assert signal.getsignal(signal.SIGINT) != before
        signal.raise_signal(signal.SIGINT)
        assert interrupt.requested and not aborted
        signal.raise_signal(signal.SIGINT)
        assert aborted == [True]
    assert signal.getsignal(signal.SIGINT) == before
