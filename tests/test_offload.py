"""Optimizer state kept in pinned host memory (`state_memory_kind="pinned_host"`).

JAX's CPU backend has the memory kinds (`device`, `pinned_host`, `unpinned_host`), so the
placement, the moves inside the jitted step and donation are checked here; the numbers must
equal the step without offload bit for bit. The sharded case runs on a (2, 4) mesh of
simulated devices in one subprocess (this file, run as a script).
"""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import modopt

HOST = "pinned_host"


def make_params():
    keys = jax.random.split(jax.random.key(0), 3)
    return {
        "w": jax.random.normal(keys[0], (16, 8)),
        "v": jax.random.normal(keys[1], (8, 8)).astype(jnp.bfloat16),
        "b": jax.random.normal(keys[2], (8,)),
    }


def gradients(step, params):
    keys = jax.random.split(jax.random.fold_in(jax.random.key(1), step), len(params))
    return {
        k: jax.random.normal(key, params[k].shape).astype(params[k].dtype)
        for key, k in zip(keys, sorted(params))
    }


@modopt.jit_step
def train_step(params, optimizer, grads):
    return optimizer.step(params, grads)


def train(optimizer, params, steps, start=0):
    for i in range(start, start + steps):
        params, optimizer = train_step(params, optimizer, gradients(i, params))
    return params, optimizer


def kinds(tree):
    """The memory kinds of a tree of arrays or of shardings."""
    return {getattr(x, "sharding", x).memory_kind for x in jax.tree.leaves(tree)}


def assert_same_bits(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_cpu_backend_has_the_memory_kinds():
    assert HOST in [memory.kind for memory in jax.devices()[0].addressable_memories()]


@pytest.mark.parametrize("compensation", [None, "kahan"])
def test_state_lives_on_the_host_and_steps_equal_the_device_ones(compensation):
    """After init and after every donated step, the state (and the Kahan buffers) are in
    pinned host memory, the count and hyperparameters on the device; params and state equal
    the step without offload bit for bit; the donated state's buffers are consumed."""
    tx = modopt.chain(modopt.clip_by_global_norm(1.0), modopt.adamw(1e-2, weight_decay=1e-3))
    offloaded = modopt.Optimizer(tx, make_params(), compensation=compensation, state_memory_kind=HOST)
    assert kinds(offloaded.state) == {HOST}
    assert kinds((offloaded.tx, offloaded.count)) == {"device"}
    if compensation:
        assert kinds(offloaded.compensation) == {HOST}
    plain = modopt.Optimizer(tx, make_params(), compensation=compensation)
    params, optimizer = make_params(), offloaded
    for i in range(3):
        before = jax.tree.leaves(optimizer.state)
        params, optimizer = train_step(params, optimizer, gradients(i, params))
        assert kinds(optimizer.state) == {HOST} and kinds(optimizer.count) == {"device"}
        assert all(x.is_deleted() == (x.ndim > 0) for x in before)  # donated and reused (scalars are not donated)
        if compensation:
            assert kinds(optimizer.compensation) == {HOST}
    reference = train(plain, make_params(), 3)
    assert_same_bits(
        (params, optimizer.state, optimizer.compensation),
        (reference[0], reference[1].state, reference[1].compensation),
    )
    assert "state kept in pinned_host memory" in repr(optimizer)


def test_memory_plan_splits_bytes_by_memory_kind():
    """Planned from an abstract optimizer (nothing allocated) and measured on the real one:
    Adam's two float32 moments of every parameter, and its int32 count, on the host; the
    step count and the hyperparameters on the device."""
    params = {"w": jnp.ones((16, 8)), "b": jnp.ones(8)}
    n = 16 * 8 + 8
    make = lambda p: modopt.Optimizer(modopt.adam(1e-3), p, state_memory_kind=HOST)  # noqa: E731
    abstract = jax.eval_shape(make, params)
    mesh = jax.make_mesh((1,), ("model",))
    placed = modopt.sharding.shardings(abstract, {"w": jax.P(None, "model"), "b": jax.P()}, mesh=mesh)
    assert kinds(placed.state) == {HOST} and kinds(placed.count) == {"device"}
    plan = modopt.sharding.bytes_per_device
    assert plan(abstract, placed, memory_kind=HOST) == 2 * 4 * n + 4
    assert plan(abstract, placed, memory_kind="device") == plan(abstract, placed) - (2 * 4 * n + 4)
    real = make(params)
    measured = {
        kind: sum(x.nbytes for x in jax.tree.leaves(real) if x.sharding.memory_kind == kind)
        for kind in (HOST, "device")
    }
    assert measured == {kind: plan(abstract, placed, memory_kind=kind) for kind in (HOST, "device")}
    assert plan(real, memory_kind=HOST) == measured[HOST]


def test_quantized_state_offloaded_and_planned():
    """8-bit state (`quantized_state`) kept on the host: its codes (1 byte an element) and block
    scales (4 bytes per 256 elements of a row) are what the plan counts there, before and
    after steps."""
    tx = modopt.quantized_state(modopt.adam(1e-2), min_size=0)
    params = {"w": jax.random.normal(jax.random.key(0), (16, 256)), "b": jnp.ones(8)}
    make = lambda p: modopt.Optimizer(tx, p, state_memory_kind=HOST)  # noqa: E731
    abstract = jax.eval_shape(make, params)
    mesh = jax.make_mesh((1,), ("model",))
    placed = modopt.sharding.shardings(abstract, {"w": jax.P(None, "model"), "b": jax.P()}, mesh=mesh)
    moment = 16 * 256 + 8 + 4 * (16 + 1)  # codes, then one float32 scale per block
    assert modopt.sharding.bytes_per_device(abstract, placed, memory_kind=HOST) == 2 * moment + 4
    grads = {k: jax.random.normal(jax.random.key(1), p.shape) for k, p in params.items()}
    step = jax.jit(lambda p, o: o.step(p, grads), donate_argnums=(0, 1))
    p, optimizer = step(*step(jax.tree.map(jnp.copy, params), make(params)))
    assert kinds(optimizer.state) == {HOST}
    assert modopt.sharding.bytes_per_device(optimizer.state, memory_kind=HOST) == 2 * moment + 4
    # The moments moved: the 8-bit state was updated on the device and put back.
    assert np.any(np.asarray(optimizer.state.inner_state[0].mu["w"].codes) != 0)


def test_offloaded_optimizer_resumes_bit_exactly_onto_the_host(tmp_path):
    """Saved from host memory and restored into an offloaded target: the state is back in
    pinned host memory, and 2 + 2 steps equal 4 straight."""
    pytest.importorskip("orbax.checkpoint")
    from modopt.integrations.orbax import CheckpointManager

    def make():
        return modopt.Optimizer(
            modopt.adam(1e-2), make_params(), compensation="kahan", state_memory_kind=HOST
        )

    straight = train(make(), make_params(), 4)
    params, optimizer = train(make(), make_params(), 2)
    with CheckpointManager(tmp_path, async_save=False) as manager:
        manager.save(2, params=params, optimizer=optimizer)
        restored = manager.restore(params=make_params(), optimizer=make())
    assert kinds(restored["optimizer"].state) == kinds(restored["optimizer"].compensation) == {HOST}
    resumed = train(restored["optimizer"], restored["params"], 2, start=2)
    assert_same_bits(straight, resumed)


def test_invalid_memory_kind_is_refused():
    with pytest.raises(
        ValueError, match=r"Invalid state_memory_kind: 'host' \(must be one of 'pinned_host' or None"
    ):
        modopt.Optimizer(modopt.adam(1e-3), make_params(), state_memory_kind="host")


def test_sharded_offload_on_a_2x4_mesh():
    """On 8 simulated devices, with ZeRO-1 and Kahan buffers: see `sharded()` below."""
    env = {
        **os.environ,
        # LLVM's optimizations off: the check compares two programs compiled alike in that process.
        "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")
        + " --xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0",
    }
    result = subprocess.run([sys.executable, __file__], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, f"{result.stdout[-2000:]}\n{result.stderr[-6000:]}"
    assert "ok sharded offload" in result.stdout


def sharded():
    """State created directly sharded in pinned host memory (never whole on one device), the
    Kahan buffers following their parameters there, `modopt.sharding.shardings` saying so,
    and steps equal to those without offload, bit for bit."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((2, 4), ("data", "model"))
    specs = {"w": P(None, "model"), "v": P("model", None), "b": P("model")}
    shardings = {k: NamedSharding(mesh, s) for k, s in specs.items()}
    params = jax.device_put(make_params(), shardings)
    tx = modopt.adamw(1e-2, weight_decay=1e-3)
    optimizer = modopt.Optimizer(
        tx, params, shardings=shardings, zero_axis="data", compensation="kahan", state_memory_kind=HOST
    )
    placed = modopt.sharding.shardings(optimizer, shardings, zero_axis="data")
    mu = optimizer.state[0].mu["w"]
    assert mu.sharding.memory_kind == HOST and mu.sharding.spec == P("data", "model"), mu.sharding
    assert placed.state[0].mu["w"] == mu.sharding
    buffer = optimizer.compensation.buffers["v"]
    assert buffer.sharding == shardings["v"].with_memory_kind(HOST) == placed.compensation.buffers["v"]
    assert optimizer.compensation.buffers["w"] is None
    # What one device holds in host memory: planned from shapes, and measured on device 0.
    host = modopt.sharding.bytes_per_device(optimizer, memory_kind=HOST)
    measured = sum(
        s.data.nbytes
        for x in jax.tree.leaves(optimizer)
        for s in x.addressable_shards[:1]
        if x.sharding.memory_kind == HOST
    )
    assert host == measured, (host, measured)
    for i in range(3):
        params, optimizer = train_step(params, optimizer, jax.device_put(gradients(i, params), shardings))
        jax.block_until_ready(params)
        assert {x.sharding.memory_kind for x in jax.tree.leaves(optimizer.state)} == {HOST}
        assert optimizer.state[0].mu["w"].sharding == placed.state[0].mu["w"]
        assert optimizer.compensation.buffers["v"].sharding == placed.compensation.buffers["v"]
    # The same sharded optimizer without offload (one device's may round bfloat16 differently:
    # another compilation may keep other intermediates in float32).
    start = jax.device_put(make_params(), shardings)
    reference = modopt.Optimizer(tx, start, shardings=shardings, zero_axis="data", compensation="kahan")
    reference = train(reference, start, 3)
    assert_same_bits(
        (params, optimizer.state, optimizer.compensation),
        (reference[0], reference[1].state, reference[1].compensation),
    )
    print("ok sharded offload")


if __name__ == "__main__":
    sharded()
