"""The owner scheme on 8 simulated devices: what each matrix optimizer's step costs, read from its
compiled program, stays within bounds, and its numbers are one device's.

The work is in `owners_mesh_worker.py` (one process per group of optimizers: the device count
must be set before jax is imported). Per optimizer and layout (FSDP; tensor parallelism with
ZeRO-1; FSDP on a (2, 2, 2) mesh), on the transformer of `benchmarks/pod.py` at its smoke size
(Shampoo's and GaLore's at width 128: there Shampoo's reference rule keeps each matrix one block,
and GaLore's rank 16 is an eighth of the width, as in the benchmark; see the worker):

- communication: the bytes each device receives through collectives in one step, in units of
  P/N (one device's share of the parameters' float32 bytes), on a plain step and on a refresh
  step, within `pod.GOALS`: a full all-gather of a statistic, or collectives inside the
  Newton-Schulz loop, would cost several times more;
- repeated work: per-device FLOPs times 8 over one device's, at most `pod.GOALS["repeated work"]`
  (a matrix computed on every device instead of its owner would cost up to 8); so are the
  decompositions of a refresh step that LAPACK runs (SOAP's, GaLore's), which XLA's count
  leaves out;
- state: the most state bytes a device holds over an even split of the state without its
  padding units, at most `pod.GOALS["state"]`;
- the parameters and state after 2 steps equal the one-device step's within the tolerance the
  registry's sharded checks use (Newton-Schulz amplifies the rounding of reordered sums; SOAP's
  eigenvectors move with the gap between eigenvalues); so does the transform stepped on its own
  under `jax.set_mesh`, where the owner scheme does not know the parameters' layout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

WORKER = os.path.join(os.path.dirname(__file__), "owners_mesh_worker.py")
TIMEOUT = 900
GROUPS = [["muon", "normuon", "adamuon", "adamw"], ["shampoo", "soap"], ["kron", "galore"]]
TOLERANCE = {"muon": 1e-3, "normuon": 1e-3, "adamuon": 1e-3, "soap": 2e-4}
# Stepped on its own: once per way of cutting units (NorMuon and AdaMuon cut as Muon does).
ALONE = ("muon", "shampoo", "soap", "kron")
# Stored stacks are padded to the device count, so the (2, 2, 2) mesh splits them as the (8,)
# one does: it is checked once (Kron, the quickest of the stacking optimizers to compile), for
# stacks and moves over three mesh axes.
TWO_LAYOUTS = ("fsdp", "tp+zero1")
LAYOUTS = {name: TWO_LAYOUTS for name in ("muon", "normuon", "adamuon", "adamw", "shampoo", "soap", "galore")}
ALL_LAYOUTS = ("fsdp", "fsdp 2x2x2", "tp+zero1")


@pytest.fixture(scope="module", params=GROUPS, ids=["+".join(g) for g in GROUPS])
def rows(request):
    layouts = sorted({layout for name in request.param for layout in LAYOUTS.get(name, ALL_LAYOUTS)})
    command = [sys.executable, WORKER, "--alone", ",".join(ALONE), "--layouts", ",".join(layouts), *request.param]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"owners_mesh_worker.py {' '.join(request.param)} did not finish in {TIMEOUT} s (a collective deadlock?)")
    assert result.returncode == 0, f"{result.stdout[-2000:]}\n{result.stderr[-6000:]}"
    found = {}
    for line in result.stdout.splitlines():
        if line.startswith("goals "):
            found["goals"] = json.loads(line.split(" ", 1)[1])
        if line.startswith("row "):
            data = json.loads(line.split(" ", 1)[1])
            found[(data["name"], data["layout"])] = data["row"]
        if line.startswith("alone "):
            data = json.loads(line.split(" ", 1)[1])
            found[(data["name"], "alone")] = data["difference"]
    return request.param, found


def test_each_step_within_its_bounds_and_equal_to_one_device(rows):
    names, found = rows
    bounds = found["goals"]
    failures = []
    for name in names:
        for layout in LAYOUTS.get(name, ALL_LAYOUTS):
            row = found.get((name, layout))
            assert row is not None, f"no row for {name} on {layout}"
            limit = bounds["communication"][layout].get(name)
            checks = {
                # Amortized over the default refresh period (the plain step for the Muon family).
                "communication amortized": (row["communication amortized"], limit),
                "communication on a refresh": (row["communication on a refresh"], bounds["refresh"] if limit else None),
                "repeated work": (row["repeated work"], bounds["repeated work"]),
                # LAPACK's decompositions (SOAP's, GaLore's), which XLA's count leaves out.
                "repeated decompositions": (row["repeated decompositions"], bounds["repeated work"]),
                "state": (row["state"], bounds["state"]),
                "difference from one device": (row["difference from one device"], TOLERANCE.get(name, 1e-5)),
            }
            for what, (value, bound) in checks.items():
                if bound is not None and value is not None and not value <= bound:
                    failures.append(f"{name} on {layout}: {what} {value:.3g} > {bound}")
    assert not failures, "\n".join(failures)


def test_a_transform_on_its_own_under_set_mesh(rows):
    """Stepped without an `Optimizer` under `jax.set_mesh` (the parameters' layout unknown to the
    owner scheme): one device's numbers."""
    names, found = rows
    for name in names:
        if name in ALONE:
            assert found[(name, "alone")] <= TOLERANCE.get(name, 1e-5), (name, found[(name, "alone")])


def test_adamw_moves_nothing_under_fsdp(rows):
    """AdamW's step is elementwise: under FSDP it receives nothing (the baseline of the table)."""
    names, found = rows
    if "adamw" in names:
        assert found[("adamw", "fsdp")]["communication"] == 0
