"""Sharded training on 8 simulated CPU devices; each case runs in its own process.

The work is in `sharded_worker.py`. A case that hangs (XLA's CPU collectives can deadlock
on a 2-core machine) fails its own test after `TIMEOUT` seconds and nothing else.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from registry import ENTRIES

# Entries with a sharding rule of their own run on real devices; every entry's derived specs
# are checked in process on an abstract mesh (`test_registry.test_state_placed_on_a_mesh`).
# Several entries share a worker process, which saves its start-up and jax import.
OWN_RULE = [e.name for e in ENTRIES if e.own_rule]
GROUP = 4
GROUPS = [OWN_RULE[i : i + GROUP] for i in range(0, len(OWN_RULE), GROUP)]

WORKER = os.path.join(os.path.dirname(__file__), "sharded_worker.py")
TIMEOUT = 240


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
    """Derived shardings work as out_shardings of a jitted init and step; steps equal one device's."""
    output = run_worker("registry", *names)
    for name in names:
        assert f"ok {name} auto" in output


def test_registry_entries_on_explicit_axes():
    """The same on a mesh with Explicit axes, where every array's sharding is typed (a typed
    PRNG key in the state included: noisy_sgd)."""
    names = ["adam", "adafactor_full", "partition", "clip_by_global_norm", "noisy_sgd"]
    output = run_worker("registry_explicit", *names)
    for name in names:
        assert f"ok {name} explicit" in output


@pytest.mark.parametrize("zero", ["", "zero"], ids=["plain", "zero1"])
@pytest.mark.parametrize("kind", ["auto", "explicit"])
def test_mlp_trains_like_one_device(kind, zero):
    """32 steps on a 2x4 mesh give one device's loss curve (Auto and Explicit axes, with ZeRO-1)."""
    assert "ok mlp" in run_worker("mlp", kind, *([zero] if zero else []))


def test_optimizer_created_sharded_never_whole_on_one_device():
    assert "ok created" in run_worker("created")


def test_checkpoint_saved_on_8_devices_resumes_on_4_and_1(tmp_path):
    """Save with ZeRO-1 on 8 devices, restore onto 4 and onto 1, train on: one device's numbers."""
    assert "ok saved on 8 devices" in run_worker("checkpoint", str(tmp_path), "save")
    for devices in (4, 1):
        assert f"ok resumed on {devices} devices" in run_worker("checkpoint", str(tmp_path), "resume", devices=devices)


def test_flax_train_state_sharded_by_logical_axis_rules():
    assert "ok flax" in run_worker("flax")


def test_nnx_optimizer_sharded_by_variable_metadata():
    assert "ok nnx" in run_worker("nnx")


def test_readme_sharding_example_runs():
    assert "ok readme" in run_worker("readme")
