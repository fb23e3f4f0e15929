"""The compile-time benchmark (`benchmarks/compile_time.py`) runs at a tiny size, so it never
rots: structure, not timings (the full run's results are committed beside it)."""

from __future__ import annotations

import json
import os
import sys

import jax

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

import compile_time  # noqa: E402


def test_the_digits_cnn_has_the_issue_s_layers():
    """Two 3x3 convolutions, a (64, 2048) linear layer and a (10, 64) one: 136,586 parameters."""
    model = compile_time.make_cnn(0)
    shapes = [tuple(x.shape) for x in jax.tree.leaves(model)]
    assert (64, 2048) in shapes and (10, 64) in shapes
    assert sum(x.size for x in jax.tree.leaves(model)) == 16 * 9 + 16 + 32 * 16 * 9 + 32 + 64 * 2048 + 64 + 10 * 64 + 10


def test_compile_time_smoke_run(tmp_path, capsys):
    results = compile_time.main(["--only", "adamw", "--out", str(tmp_path)])
    table = capsys.readouterr().out
    rows = results["optimizers"]
    assert list(rows) == ["adamw"]
    for row in rows.values():
        assert row["compile_s"] > 0 and row["step_s"] > 0
        # AdamW keeps two float32 moments per parameter (and a step count).
        assert abs(row["state_bytes_per_parameter"] - 8.0) < 1e-3
    assert "adamw" in table and "/ optax" in table
    assert json.loads((tmp_path / "compile_time.json").read_text())["optimizers"].keys() == rows.keys()
