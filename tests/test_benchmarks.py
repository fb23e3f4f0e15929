"""The benchmark runs at a tiny size in CI, so it never rots. Checks structure, not timings."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

import bench  # noqa: E402


def test_benchmark_smoke_run(capsys):
    results = bench.main(["--size", "tiny"])
    table = capsys.readouterr().out
    for case in ("1 one big array", "2 many 16k leaves", "3 many tiny leaves", "4 MLP train step",
                 "5 compile, 100 leaves", "5 compile, 1000 leaves"):
        assert results[case]["modopt"] > 0 and results[case]["optax"] > 0, case
        assert case in table
    # No retrace when the learning rate changes or the optimizer is rebuilt.
    assert results["6 traces"]["modopt retraces"] == 0
    # The donated step runs in place: XLA reuses every byte of the params and state.
    memory = results["7 donated step memory"]
    assert memory["aliased (reused) bytes"] == memory["params+state bytes"]
    assert memory["temporary bytes"] < memory["params+state bytes"]
