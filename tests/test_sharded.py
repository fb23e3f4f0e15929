"""Sharded training on 8 simulated CPU devices, in worker processes.

The work is in `sharded_worker.py`. Each test runs one worker process, which may hold
several cases (a process start and jax import cost seconds). A worker that hangs (XLA's CPU
collectives can deadlock on a 2-core machine) fails its own test after `TIMEOUT` seconds
and nothing else.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from registry import ENTRIES

# Entries with a sharding rule of their own run on real devices; every entry's derived specs
# are checked in process on an abstract mesh (`test_registry.test_state_placed_on_a_mesh`).
# Several entries share a worker process, which saves its start-up and jax import. The
# entries are dealt round-robin into the groups: the costly ones (Shampoo, SOAP, Kron, GaLore,
# Muon, each compiled twice: on one device and on the mesh) stand next to each other in the
# registry.
# The matrix optimizers at their defaults run on 8 devices in test_owners_mesh.py (the
# transformer on three layouts, against one device); their configuration variants run here.
ON_OWNERS_MESH = {"muon", "normuon", "scale_by_normuon", "kron", "soap", "shampoo"}
OWN_RULE = [e.name for e in ENTRIES if e.own_rule and e.name not in ON_OWNERS_MESH]
WORKERS = 4
GROUPS = [OWN_RULE[i::WORKERS] for i in range(WORKERS)]

WORKER = os.path.join(os.path.dirname(__file__), "sharded_worker.py")
TIMEOUT = 600


def run_worker(*args: str, devices: int = 8) -> str:
    env = {**os.environ, "MODOPT_TEST_DEVICES": str(devices)}
    try:
        result = subprocess.run(
            [sys.executable, WORKER, *args], capture_output=True, text=True, timeout=TIMEOUT, env=env
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"`sharded_worker.py {' '.join(args)}` did not finish in {TIMEOUT} s (a collective deadlock?)")
    assert result.returncode == 0, f"{result.stdout[-2000:]}\n{result.stderr[-6000:]}"
    return result.stdout


@pytest.mark.parametrize("names", GROUPS, ids=["+".join(g) for g in GROUPS])
def test_registry_entries_sharded_and_zero(names):
    """Derived shardings (with ZeRO-1) work as out_shardings of a jitted init and step, the
    arrays land there, ZeRO-1 halves each state leaf it can split, and the steps equal one
    device's (see `sharded_worker.registry_entry`)."""
    output = run_worker("registry", *names)
    for name in names:
        assert f"ok {name} auto" in output


def test_registry_entries_on_explicit_axes():
    """The same on a mesh with Explicit axes, where every array's sharding is typed (a typed
    PRNG key in the state included: noisy_sgd; matrix optimizers on owners: muon, kron, and
    galore's refresh, whose two conditionals hold the owners' work), with
    and without ZeRO-1; Kron's last step also run eagerly (not under jit), with the jitted
    step's numbers."""
    names = ["adam", "adafactor_full", "partition", "clip_by_global_norm", "noisy_sgd", "muon", "kron", "galore"]
    output = run_worker("registry_explicit", *names)
    for name in names:
        assert f"ok {name} explicit" in output


def test_mlp_trains_like_one_device():
    """32 steps on a 2x4 mesh give one device's loss curve (Auto and Explicit axes, with and
    without ZeRO-1)."""
    output = run_worker("mlp", "auto", "+", "mlp", "auto", "zero", "+", "mlp", "explicit", "+", "mlp", "explicit", "zero")
    for kind in ("auto", "explicit"):
        for zero in (False, True):
            assert f"ok mlp {kind} zero={zero}" in output, output


def test_optimizer_created_sharded_never_whole_on_one_device():
    assert "ok created" in run_worker("created")


def test_checkpoint_saved_on_8_devices_resumes_on_4_and_1(tmp_path):
    """Save with ZeRO-1 on 8 devices, restore onto 4 and onto 1, train on: one device's numbers."""
    assert "ok saved on 8 devices" in run_worker("checkpoint", str(tmp_path), "save")
    output = run_worker("checkpoint", str(tmp_path), "resume", "4", "1")  # in a new process, as after a restart
    for devices in (4, 1):
        assert f"ok resumed on {devices} devices" in output, output


def test_flax_train_state_nnx_optimizer_and_readme_example_sharded():
    """A Flax TrainState sharded by logical axis rules, an NnxOptimizer sharded by variable
    metadata, and the README's sharding example as written."""
    output = run_worker("flax", "+", "nnx", "+", "readme")
    for case in ("ok flax", "ok nnx", "ok readme"):
        assert case in output, output


def test_galore_stacks_weights_of_both_orientations_on_owners():
    """GaLore's (24, 8) and (8, 24) weights in one stack, more units than devices: one device's
    numbers (see `sharded_worker.galore_both_ways`)."""
    assert "ok galore both ways" in run_worker("galore_both_ways")
