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
    # A history (L-BFGS) is not a per-element moment: refused with its path.
    with pytest.raises(ValueError, match=r"ScaleByLBFGS at inner_state\.diff_params_memory\['w'\] \(shape \(10, 64, 128\)\)"):
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
