"""The benchmark runs at its smoke size in CI (every case, every code path, one timing each), so
it never rots. Checks structure, not timings."""

from __future__ import annotations

import json
import os
import sys

import modopt

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

import bench  # noqa: E402


def test_benchmark_smoke_run(capsys, tmp_path):
    results = bench.main(["--size", "smoke", "--out", str(tmp_path)])
    table = capsys.readouterr().out
    for case in ("1 one big array", "2 many 16k leaves", "3 many tiny leaves", "4 MLP train step",
                 "5 compile, 100 leaves", "5 compile, 1000 leaves"):
        assert results[case]["modopt"] > 0 and results[case]["optax"] > 0, case
        assert case in table
    # Cases 1-3 also time Optimizer.step in jit_step and the dispatch floor; case 5 compiles it.
    for case in ("1 one big array", "2 many 16k leaves", "3 many tiny leaves"):
        assert results[case][bench.OPTIMIZER] > 0 and results[case][bench.FLOOR] > 0, case
    assert results["5 compile, 1000 leaves"][bench.OPTIMIZER] > 0
    # The documented train step and the alternatives are all timed.
    assert {"modopt in jax.jit", "modopt in eqx.filter_jit"} <= set(results["4 MLP train step"])
    # No retrace when the learning rate changes or the optimizer is rebuilt.
    assert results["6 traces"]["modopt retraces"] == 0
    assert results["6 traces"]["modopt jit_step retraces"] == 0
    # The donated step runs in place: XLA reuses every byte of the params and state.
    memory = results["7 donated step memory"]
    assert memory["aliased (reused) bytes"] == memory["params+state bytes"]
    assert memory["temporary bytes"] < memory["params+state bytes"]
    # A row per optimizer run, each with a ratio in the table.
    for name in bench.SIZES["smoke"]["catalog"]:
        row = results["8 catalog"][name]
        assert all(row[key] > 0 for key in ("modopt", "optax", "modopt arguments", "modopt jit_step", "optax injected"))
        assert any(line.startswith(name) for line in table.splitlines())
    assert "bandwidth: modopt AdamW moves" in table
    # The NNX train step: NnxOptimizer and nnx.Optimizer under nnx.jit and in nnx.cached_partial.
    nnx_row = results["9 NNX MLP train step"]
    assert nnx_row["modopt"] > 0 and nnx_row["optax"] > 0 and nnx_row["optax in nnx.cached_partial"] > 0
    assert "modopt in nnx.cached_partial / optax in nnx.cached_partial" in table
    # Written where asked, the JSON with every case.
    assert (tmp_path / "results.txt").read_text().startswith("modopt vs optax")
    assert set(json.loads((tmp_path / "results.json").read_text())) == set(results)


def test_catalog_covers_every_named_optimizer():
    """Every lowercase optimizer constructor that optax also has gets a row (with its optax
    counterpart) in the full run; the optimizers optax lacks (soap, kron...) have none."""
    import optax

    names = {n for n in dir(modopt.optimizers) if n[0].islower() and callable(getattr(modopt.optimizers, n))}
    in_optax = set(dir(optax)) | set(dir(optax.contrib))  # dpsgd is in optax.contrib
    assert names & in_optax == set(bench.CATALOG)


def test_train_step_benchmark_smoke_run(tmp_path):
    """The transformer's training-step benchmark at its smallest size: every row timed in every
    round, the ratios against AdamW's, the files written where asked."""
    import train_step

    results = train_step.main(["--size", "micro", "--rounds", "2", "--optimizers", "adamw", "muon", "--out", str(tmp_path)])
    assert set(results) == {"adamw", "muon"}
    for row in results.values():
        assert len(row["step ms, all rounds"]) == 2 and all(t > 0 for t in row["step ms, all rounds"])
        assert row["step / adamw"] == row["step ms"] / results["adamw"]["step ms"]
    assert abs(results["adamw"]["state_bytes_per_parameter"] - 8.0) < 0.01  # two float32 moments and a count
    assert (tmp_path / "train_step.txt").read_text().startswith("The transformer job's training step (micro")
    assert set(json.loads((tmp_path / "train_step.json").read_text())["results"]) == {"adamw", "muon"}
