"""The main job (`python -m modopt.examples.digits`) trains to its promised accuracy."""

import re

from modopt.examples import digits


def test_digits_trains_above_90_percent(capsys):
    assert digits.main(["--epochs", "5"]) == 0
    out = capsys.readouterr().out
    losses = [float(x) for x in re.findall(r"train loss ([0-9.]+)", out)]
    assert len(losses) == 5 and losses[-1] < losses[0] / 5, out
    accuracy = float(re.search(r"test accuracy ([0-9.]+)%", out).group(1))
    assert accuracy > 90.0, out
