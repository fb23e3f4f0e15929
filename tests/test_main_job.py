"""The main job (`python -m modopt.examples.digits`) trains to its promised accuracy and resumes."""

import re
import signal
import subprocess
import sys

import numpy as np

from modopt.examples import digits


def test_digits_trains_above_90_percent(capsys, tmp_path):
    assert digits.main(["--epochs", "5", "--checkpoint-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    losses = [float(x) for x in re.findall(r"train loss ([0-9.]+)", out)]
    assert len(losses) == 5 and losses[-1] < losses[0] / 5, out
    accuracy = float(re.search(r"test accuracy ([0-9.]+)%", out).group(1))
    assert accuracy > 90.0, out
    with open(tmp_path / "loss_curve.png", "rb") as plot:
        assert plot.read(8) == b"\x89PNG\r\n\x1a\n"


def results(out: str) -> list[str]:
    """The epoch lines and the accuracy (without the timing), which a resumed run must repeat."""
    lines = [line for line in out.splitlines() if line.startswith("epoch")]
    return lines + re.findall(r"test accuracy [0-9.]+%", out)


def test_interrupted_run_continues_from_its_last_checkpoint(capsys, tmp_path):
    """Ctrl-C during a run, then the same command: the run ends exactly as an uninterrupted one."""
    epochs = ["--epochs", "8"]
    assert digits.main([*epochs, "--checkpoint-dir", str(tmp_path / "straight")]) == 0
    straight = results(capsys.readouterr().out)

    command = [sys.executable, "-m", "modopt.examples.digits", *epochs, "--checkpoint-dir", str(tmp_path / "run")]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in process.stdout:
        if line.startswith("epoch   2"):
            process.send_signal(signal.SIGINT)
            break
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err[-2000:]
    done = int(re.search(r"resume after epoch (\d+)", err).group(1))
    assert 2 <= done < 8, err[-2000:]

    assert digits.main([*epochs, "--checkpoint-dir", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert f"resuming after epoch {done}" in out
    assert results(out) == straight[done:], (out, straight)
    # The loss history survives the interruption: the resumed run's record has every epoch.
    from modopt.integrations.orbax import CheckpointManager

    with CheckpointManager(tmp_path / "run") as manager:
        record = manager.restore(run=digits._run(digits.argparse.Namespace(epochs=8, seed=0), 0, np.zeros(8, np.float32)))
    losses = [float(line.split()[4]) for line in straight if line.startswith("epoch")]
    np.testing.assert_allclose(record["run"]["history"], losses, atol=5e-5)
