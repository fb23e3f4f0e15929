"""The beyond-optax benchmark runs at a tiny size in CI, so it never rots. Checks structure, not
timings (`benchmarks/beyond_optax.py`; the full run's results are committed beside it)."""

from __future__ import annotations

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

import _beyond_training as training  # noqa: E402
import beyond_optax  # noqa: E402


def test_beyond_optax_smoke_run(capsys, tmp_path):
    results = beyond_optax.main(["--size", "tiny", "--out", str(tmp_path)])
    table = capsys.readouterr().out
    tiny = beyond_optax.SIZES["tiny"]
    sweep = results["steps to target"]
    assert sweep["total_steps"] % sweep["eval_every"] == 0
    for name, rates in tiny["learning_rates"].items():
        row = sweep["optimizers"][name]
        assert row["best_learning_rate"] in rates
        for rate in rates:
            run = row["rates"][repr(rate)]
            assert len(run["curve"]) == sweep["total_steps"] // sweep["eval_every"]
            # Steps to the target are read off the curve (an independent recount).
            below = [i for i, loss in enumerate(run["curve"]) if loss <= sweep["target_train_loss"]]
            assert run["steps_to_target"] == ((below[0] + 1) * sweep["eval_every"] if below else None)
            assert 0 <= run["test_accuracy"] <= 1
        assert len(row["best"]["steps_to_target"]) == len(tiny["seeds"])
        # One compilation per optimizer: a new learning rate or seed does not retrace the run.
        assert row["traces"] == 1
        # The tiny run trains: the loss falls from the untrained model's ~log(10).
        assert row["rates"][repr(row["best_learning_rate"])]["curve"][-1] < np.log(10)
        times = results["times"][name]
        assert times["step_s"] > 0 and times["compile_s"] > 0
        assert any(line.startswith(name) for line in table.splitlines())
    # Without psgd-jax the table says so instead of a ratio.
    assert "error" in results["psgd-jax"]
    assert "kron / psgd-jax kron: psgd-jax not measured" in table
    # Written where asked: the table, the JSON with every part, the plot.
    assert (tmp_path / "beyond_optax.txt").read_text().startswith("modopt beyond optax")
    assert set(json.loads((tmp_path / "beyond_optax.json").read_text())) == set(results)
    assert (tmp_path / "beyond_optax.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_steps_to_and_batches_follow_the_main_job():
    """Steps to the target count whole evaluations; the batches are the main job's epochs."""
    from modopt.examples import digits

    assert training.steps_to(np.array([2.0, 0.5, 0.04, 0.06]), 0.05, 4) == 12
    assert training.steps_to(np.array([2.0, 0.5]), 0.05, 4) is None
    indices = training.batch_indices(3, 2, 200)
    assert indices.shape == (2 * (200 // digits.BATCH_SIZE), digits.BATCH_SIZE)
    first_epoch = digits._order(3, 1, 200)[: 3 * digits.BATCH_SIZE]
    np.testing.assert_array_equal(indices[:3].ravel(), first_epoch)
