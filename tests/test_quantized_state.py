"""`quantized_state` and `quantize_blockwise` without PyTorch: layout, memory, sharding, errors.

The comparisons with bitsandbytes (its tables, its block-wise codes, 50 steps of its 8-bit Adam
protocol against float32 Adam, an Orbax round trip) are in `references/test_quantized_state.py`,
which runs in the PyTorch process of `test_references.py`. The registry runs two entries through
the shared checks (dtypes, convergence, one trace, bit-exact Orbax resume, 8 devices).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AbstractMesh, AxisType
from jax.sharding import PartitionSpec as P

import modopt


def nbytes(tree):
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(tree))


def test_blocks_along_flattened_trailing_axes_and_nearest_linear_codes():
    """Scales per block of the flattened trailing axes; with the linear table every code is
    the nearest of 256 evenly spaced values (NumPy, by brute force), the error at most half a
    step of the block's largest magnitude."""
    rng = np.random.default_rng(0)
    for shape, scales in [((1000,), (4,)), ((3, 512), (3, 2)), ((2, 3, 100), (2, 2))]:
        x = np.abs(rng.standard_normal(shape)).astype(np.float32)
        q = modopt.quantize_blockwise(jnp.asarray(x), 256, "linear")
        assert q.codes.shape == shape and q.codes.dtype == jnp.uint8
        assert q.scales.shape == scales and q.scales.dtype == jnp.float32
        flat = x.reshape(*scales[:-1], -1)
        padded = np.pad(flat, [(0, 0)] * (flat.ndim - 1) + [(0, scales[-1] * 256 - flat.shape[-1])])
        absmax = np.abs(padded.reshape(*scales, 256)).max(-1)
        np.testing.assert_array_equal(np.asarray(q.scales), absmax)  # nonnegative: unsigned table
        table = np.linspace(0.0, 1.0, 256)
        normalized = (padded.reshape(*scales, 256) / absmax[..., None]).reshape(*scales[:-1], -1)[..., : flat.shape[-1]]
        nearest = np.abs(normalized.reshape(-1, 1) - table).argmin(-1).reshape(shape)
        np.testing.assert_array_equal(np.asarray(q.codes), nearest)
        error = np.abs(np.asarray(q.dequantize()) - x)
        per_element = np.repeat(absmax, 256, axis=-1)[..., : flat.shape[-1]].reshape(shape)
        assert np.all(error <= per_element / 255 / 2 * (1 + 1e-5))


def test_quantizes_large_floating_leaves_and_keeps_the_rest():
    """Moments of large parameters are 8-bit; the count, small leaves and integer leaves stay.
    bf16 moments come back as bf16. The first update equals optax's (zero is exact)."""
    params = {"w": jnp.ones((64, 128), jnp.bfloat16), "b": jnp.ones((128,), jnp.bfloat16)}
    tx = modopt.quantized_state(modopt.adam(1e-2), min_size=1024)
    state = tx.init(params)
    adam = state.inner_state[0]
    assert isinstance(adam.mu["w"], modopt.QuantizedArray) and adam.mu["w"].dtype == jnp.bfloat16
    assert adam.nu["b"].dtype == jnp.bfloat16 and not isinstance(adam.nu["b"], modopt.QuantizedArray)
    assert adam.count.dtype == jnp.int32
    grads = jax.tree.map(lambda p: jax.random.normal(jax.random.key(1), p.shape, p.dtype), params)
    updates, state = jax.jit(tx.update)(grads, state, params)
    reference = optax.adam(1e-2)
    expected, their_state = jax.jit(reference.update)(grads, reference.init(params), params)
    assert jax.tree.map(lambda u: u.dtype, updates) == jax.tree.map(lambda u: u.dtype, expected)
    for ours, theirs in zip(jax.tree.leaves(updates), jax.tree.leaves(expected)):
        np.testing.assert_array_equal(np.asarray(ours, np.float32), np.asarray(theirs, np.float32))
    mu = modopt.dequantized(state.inner_state)[0].mu["w"]
    assert mu.dtype == jnp.bfloat16
    # Half a step of the signed table (0.00704 of the block's largest magnitude), and bf16's
    # rounding of the value dequantized (half its 8-bit significand: 2**-8 of it).
    exact = np.asarray(their_state[0].mu["w"], np.float32)
    # (64, 128): the last axis is short, so blocks of 256 run over the array flattened (2 rows).
    absmax = np.repeat(np.abs(exact).reshape(-1, 256).max(-1), 256).reshape(64, 128)
    assert np.all(np.abs(np.asarray(mu, np.float32) - exact) <= 0.00704 * absmax + 2.0**-8 * np.abs(exact) + 1e-12)


def test_state_bytes_at_most_0_3_of_float32():
    """Measured: AdamW's 8 bytes per parameter become 2 + 8 / 256 (codes and scales)."""
    params = {"w": jax.ShapeDtypeStruct((1024, 1024), jnp.float32), "b": jax.ShapeDtypeStruct((1024,), jnp.float32)}
    float32 = nbytes(jax.eval_shape(modopt.adamw(1e-3).init, params))
    quantized_tx = modopt.quantized_state(modopt.adamw(1e-3))
    quantized = nbytes(jax.eval_shape(quantized_tx.init, params))
    assert quantized <= 0.3 * float32
    assert quantized == 2 * (1024 * 1024 + 1024 * 4 * 4) + 2 * 1024 * 4 + 4  # codes, scales; b and count kept
    # Memory planning reads the same bytes from abstract values.
    assert modopt.sharding.bytes_per_device(jax.eval_shape(quantized_tx.init, params)) == quantized


def test_codes_follow_the_parameter_and_scales_its_leading_axes():
    params = {"rows": jax.ShapeDtypeStruct((16, 512), jnp.float32), "cols": jax.ShapeDtypeStruct((16, 512), jnp.float32)}
    specs = {"rows": P("model", None), "cols": P(None, "model")}
    tx = modopt.quantized_state(modopt.adam(1e-3))
    mu = tx.state_specs(params, specs).inner_state[0].mu
    assert (mu["rows"].codes, mu["rows"].scales) == (P("model", None), P("model", None))
    assert (mu["cols"].codes, mu["cols"].scales) == (P(None, "model"), P(None, None))
    mesh = AbstractMesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
    optimizer = jax.eval_shape(lambda: modopt.Optimizer(tx, {k: jnp.zeros(v.shape) for k, v in params.items()}))
    placed = modopt.sharding.shardings(optimizer, specs, mesh=mesh, zero_axis="data")
    scales = placed.state.inner_state[0].nu["cols"].scales
    assert scales.spec == P("data", None)  # ZeRO-1 splits the scales' rows


def test_bad_configurations_are_named():
    with pytest.raises(ValueError, match=r"Invalid block_size: 0 \(must be an integer >= 1\) in QuantizedState"):
        modopt.quantized_state(modopt.adam(1e-3), block_size=0)
    with pytest.raises(ValueError, match=r"Invalid min_size: -1"):
        modopt.quantized_state(modopt.adam(1e-3), min_size=-1)
    with pytest.raises(ValueError, match=r"Invalid quantization: 'fp8'"):
        modopt.quantized_state(modopt.adam(1e-3), quantization="fp8")
    with pytest.raises(TypeError, match="real floating array"):
        modopt.quantize_blockwise(jnp.arange(10))
    # L-BFGS keeps histories, no moment: refused, naming its largest state by path.
    with pytest.raises(ValueError, match=r"ScaleByLBFGS keeps no moments .* inner_state\.diff_params_memory\['w'\] \(shape \(10, 64, 128\)\)"):
        modopt.quantized_state(modopt.scale_by_lbfgs()).init({"w": jnp.zeros((64, 128))})


def test_state_memory_benchmark_smoke_run(tmp_path):
    """benchmarks/state_memory.py at its tiny size: every part measured, the table and files
    written (structure only; the numbers are the full run's)."""
    import json
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    import state_memory

    results = state_memory.main(["--size", "tiny", "--out", str(tmp_path)])
    names = state_memory.SIZES["tiny"]["variants"]
    model = results["model"]
    assert set(model["state_bytes"]) == set(model["step_seconds"]) == set(results["digits"]["accuracy"]) == set(names)
    assert all(model["step_seconds"][name] > 0 for name in names)
    assert model["state_bytes"][names[1]] <= 0.3 * model["state_bytes"][names[0]]  # 8-bit against float32
    table = (tmp_path / "state_memory.txt").read_text()
    assert all(name in table for name in names)
    assert set(json.loads((tmp_path / "state_memory.json").read_text())) == set(results)


# ---- faults: non-finite gradients, offloaded state, checkpoints of another layout -------------


def test_non_finite_elements_do_not_enter_their_block_scale():
    """A block with `inf`, `-inf` and `NaN`: the other elements get the codes they get with those
    set to 0 (the block already holds negatives and a larger finite magnitude); `inf` comes back
    as the block's largest finite magnitude, `-inf` as the signed table's most negative entry
    times it, `NaN` as 0."""
    x = np.linspace(-2.0, 3.0, 256).astype(np.float32)
    hit = x.copy()
    hit[[10, 20, 30]] = [np.inf, -np.inf, np.nan]
    clean = x.copy()
    clean[[10, 20, 30]] = 0.0
    q, reference = modopt.quantize_blockwise(jnp.asarray(hit)), modopt.quantize_blockwise(jnp.asarray(clean))
    others = np.ones(256, bool)
    others[[10, 20, 30]] = False
    np.testing.assert_array_equal(np.asarray(q.codes)[others], np.asarray(reference.codes)[others])
    np.testing.assert_array_equal(np.asarray(q.scales), np.asarray(reference.scales))  # -3: signed, largest |x| 3
    back = np.asarray(q.dequantize())
    most_negative = float(modopt._state.quantization.dynamic_map(True)[0])
    np.testing.assert_allclose(back[[10, 20, 30]], [3.0, 3.0 * most_negative, 0.0], rtol=1e-6)


def _adam_runs(tx, steps, hit_step, hit):
    """Parameters of a 1024-element vector after each of `steps` Adam steps, an `inf` at element
    `hit` of the gradient of step `hit_step`."""
    params = {"w": jnp.linspace(-1.0, 1.0, 1024)}
    state = tx.init(params)
    update = jax.jit(tx.update)
    found = []
    for i in range(steps):
        grads = {"w": jax.random.normal(jax.random.key(i), (1024,))}
        if i == hit_step:
            grads = {"w": grads["w"].at[hit].set(jnp.inf)}
        updates, state = update(grads, state, params)
        params = optax.apply_updates(params, updates)
        found.append(np.asarray(params["w"]))
    return found, state


def test_an_inf_gradient_element_hits_that_element_only_as_in_float32_adam():
    """float32 Adam (optax) turns the parameter element whose gradient is `inf` into NaN and leaves
    the others; 8-bit Adam does the same: the other 255 moments of the block stay finite, and the
    other parameters stay within 8-bit rounding of float32 Adam's (each step moves a parameter by
    at most about the learning rate; 8-bit moments change a step by a few percent of it)."""
    lr, steps = 1e-2, 5
    exact, _ = _adam_runs(optax.adam(lr), steps, 1, 300)
    ours, state = _adam_runs(modopt.quantized_state(modopt.adam(lr), min_size=1), steps, 1, 300)
    for e, o in zip(exact, ours):
        np.testing.assert_array_equal(np.isnan(o), np.isnan(e))
    assert np.flatnonzero(np.isnan(exact[-1])).tolist() == [300]
    others = np.arange(1024) != 300
    assert np.max(np.abs(ours[-1] - exact[-1])[others]) <= 0.1 * lr * steps
    moments = modopt.dequantized(state.inner_state)[0]
    assert np.all(np.isfinite(np.asarray(moments.mu["w"]))) and np.all(np.isfinite(np.asarray(moments.nu["w"])))


def test_apply_if_finite_skips_the_step_and_keeps_the_8_bit_state():
    """The other remedy: `apply_if_finite` drops a non-finite step whole, codes and scales unchanged."""
    tx = modopt.apply_if_finite(modopt.quantized_state(modopt.adam(1e-2), min_size=1), max_consecutive_errors=5)
    params = {"w": jnp.linspace(-1.0, 1.0, 1024)}
    grads = {"w": jax.random.normal(jax.random.key(0), (1024,))}
    _, state = tx.update(grads, tx.init(params), params)
    updates, after = tx.update({"w": grads["w"].at[3].set(jnp.inf)}, state, params)
    assert not np.any(np.asarray(updates["w"]))
    for a, b in zip(jax.tree.leaves(after.inner_state), jax.tree.leaves(state.inner_state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_dequantized_reads_an_offloaded_state():
    """`state_memory_kind="pinned_host"`: `dequantized` and `.dequantize()` give the numbers of the
    same optimizer kept on the device, and leave the state in host memory."""
    params = {"w": jnp.linspace(-1.0, 1.0, 1024)}
    grads = {"w": jax.random.normal(jax.random.key(0), (1024,))}
    tx = modopt.quantized_state(modopt.adam(1e-2), min_size=1)
    on_host = modopt.Optimizer(tx, params, state_memory_kind="pinned_host")
    on_device = modopt.Optimizer(tx, params)
    step = modopt.jit_step(lambda params, optimizer, grads: optimizer.step(params, grads), donate_argnums=())
    _, on_host = step(params, on_host, grads)
    _, on_device = step(params, on_device, grads)
    assert {x.sharding.memory_kind for x in jax.tree.leaves(on_host.state)} == {"pinned_host"}
    for ours, theirs in zip(jax.tree.leaves(modopt.dequantized(on_host.state)), jax.tree.leaves(modopt.dequantized(on_device.state))):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    mu = on_host.state.inner_state[0].mu["w"]
    np.testing.assert_array_equal(np.asarray(mu.dequantize()), np.asarray(on_device.state.inner_state[0].mu["w"].dequantize()))
    assert mu.codes.sharding.memory_kind == "pinned_host"


@pytest.mark.parametrize(
    "change, saved_text, target_text",
    [
        ({"block_size": 250}, "blocks of 256, 'dynamic' tables", "blocks of 250, 'dynamic' tables"),
        ({"quantization": "linear"}, "blocks of 256, 'dynamic' tables", "blocks of 256, 'linear' tables"),
    ],
    ids=["block_size", "quantization"],
)
def test_a_checkpoint_restores_only_into_the_same_tables_and_blocks(tmp_path, change, saved_text, target_text):
    """500 elements: blocks of 256 and of 250 give codes and scales of the same shapes, yet the
    codes are other numbers under the other layout. The record keeps the layout; a restore into
    another is refused, naming the leaf and both layouts; into the same it is bit-exact."""
    from modopt.integrations.orbax import CheckpointError, CheckpointManager

    params = {"w": jnp.linspace(-1.0, 1.0, 500)}
    grads = {"w": jax.random.normal(jax.random.key(0), (500,))}

    def made(**options):
        tx = modopt.quantized_state(modopt.adam(1e-2), min_size=1, **options)
        return modopt.Optimizer(tx, params)

    _, saved = made().step(params, grads)
    with CheckpointManager(tmp_path) as manager:
        manager.save(1, optimizer=saved)
        manager.wait_until_finished()
        other = made(**change)
        assert [x.shape for x in jax.tree.leaves(other.state)] == [x.shape for x in jax.tree.leaves(saved.state)]
        with pytest.raises(CheckpointError) as error:
            manager.restore(1, optimizer=other)
        message = str(error.value)
        assert ".state.inner_state[0].mu['w'].codes" in message or ".state.inner_state[0].mu['w'].scales" in message
        assert saved_text in message and target_text in message
        restored = manager.restore(1, optimizer=made())["optimizer"]
    for a, b in zip(jax.tree.leaves(restored.state), jax.tree.leaves(saved.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
