"""bfloat16 / float16 parameters with compensated updates: stochastic rounding and Kahan summation.

References are NumPy, written from the definitions: a sum's two neighbouring low-precision
values come from NumPy's (ml_dtypes') casts and `nextafter`, never from modopt's rounding;
Kahan's steps are replayed in NumPy float32 arithmetic; the exact sums are float64.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

import modopt

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)


def neighbours(x: np.ndarray, dtype) -> tuple[np.ndarray, np.ndarray]:
    """The largest value of `dtype` <= x and the smallest >= x (equal where `dtype` holds x), as float64."""
    x = np.asarray(x, np.float32)
    nearest = x.astype(dtype)
    above = nearest.astype(np.float64) > x
    other = np.nextafter(nearest, np.where(above, -np.inf, np.inf).astype(dtype))
    a, b = nearest.astype(np.float64), other.astype(np.float64)
    exact = a == x.astype(np.float64)
    lower = np.where(exact, a, np.minimum(a, b))
    upper = np.where(exact, a, np.maximum(a, b))
    return lower, upper


def sums(dtype, n, seed=0):
    """Parameters of `dtype` and float32 updates whose sums fall between representable values,
    over many binades (float16's subnormals included)."""
    rng = np.random.default_rng(seed)
    scale = 2.0 ** rng.integers(-20 if dtype == F16 else -30, 12, n)
    p = (rng.standard_normal(n) * scale).astype(dtype)
    u = (rng.standard_normal(n) * scale * 2.0**-7).astype(np.float32)
    return p, u


# ---- stochastic rounding -----------------------------------------------------------------


def test_stochastic_rounding_is_a_neighbour_and_unbiased_over_keys():
    """Each result is one of the two values of the parameter's dtype (bfloat16, float16) around
    the float32 sum, and its mean over many keys is the sum (Gupta et al. 2015: up with
    probability (x - lower) / spacing)."""
    draws = 4096
    params, updates = {}, {}
    for name, dtype in (("bf16", BF16), ("f16", F16)):
        params[name], updates[name] = sums(dtype, 64)
    keys = jax.random.split(jax.random.key(0), draws)
    rounded = jax.jit(jax.vmap(lambda k: modopt.apply_updates(params, updates, key=k)))(keys)
    for name, dtype in (("bf16", BF16), ("f16", F16)):
        assert rounded[name].dtype == dtype
        x = params[name].astype(np.float32) + updates[name]  # the sum, formed in float32 (NumPy's addition)
        lower, upper = neighbours(x, dtype)
        got = np.asarray(rounded[name], np.float64)
        assert np.all((got == lower) | (got == upper))
        spacing = upper - lower
        between = spacing > 0
        assert between.sum() > 50
        probability = np.where(between, (x - lower) / np.where(between, spacing, 1), 0)
        frequency = np.where(between, (got == upper).mean(axis=0), 0)
        # 5 standard deviations of a frequency over the draws.
        assert np.all(
            np.abs(frequency - probability) <= 5 * np.sqrt(probability * (1 - probability) / draws) + 1e-12
        )
        # Unbiased: the mean rounding error is zero within the same bound, relative to the spacing.
        bias = np.where(between, (got.mean(axis=0) - x) / np.where(between, spacing, 1), 0)
        assert np.abs(bias).max() <= 5 * 0.5 / np.sqrt(draws)


def test_stochastic_rounding_keeps_exact_sums_special_values_and_wide_leaves():
    """A sum `dtype` holds stays; inf and NaN stay; float32 leaves round to nearest (as
    without a key); `None` leaves stay `None`; one key gives one result."""
    params = {
        "p": jnp.asarray([1.0, 2.0, np.inf, -np.inf, np.nan, 0.0], jnp.bfloat16),
        "w": jnp.asarray([1.0, 2.0], jnp.float32),
        "frozen": None,
    }
    updates = {
        "p": jnp.asarray([0.5, -0.25, 1.0, 1.0, 1.0, -0.0], jnp.float32),
        "w": jnp.asarray([1e-9, 0.1]),
        "frozen": None,
    }
    key = jax.random.key(3)
    out = jax.jit(modopt.apply_updates)(params, updates, key=key)
    np.testing.assert_array_equal(np.asarray(out["p"], np.float64), [1.5, 1.75, np.inf, -np.inf, np.nan, 0.0])
    np.testing.assert_array_equal(
        np.asarray(out["w"]), np.asarray([1.0, 2.0], np.float32) + np.asarray([1e-9, 0.1], np.float32)
    )
    assert out["frozen"] is None and out["p"].dtype == jnp.bfloat16
    again = jax.jit(modopt.apply_updates)(params, updates, key=key)
    np.testing.assert_array_equal(np.asarray(out["p"], np.float64), np.asarray(again["p"], np.float64))


# ---- Kahan summation ---------------------------------------------------------------------


def kahan_numpy(p: np.ndarray, u: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One compensated step in NumPy float32 arithmetic: s = p + (u + c); p = round(s); c = s - p."""
    s = p.astype(np.float32) + (u.astype(np.float32) + c.astype(np.float32))
    new_p = s.astype(p.dtype)
    return new_p, (s - new_p.astype(np.float32)).astype(p.dtype)


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
def test_kahan_step_is_the_definition(dtype):
    """Several steps equal NumPy's float32 replay of the rule, bit for bit (float16's
    subnormals included)."""
    p, _ = sums(dtype, 512)
    params = {"p": jnp.asarray(p), "w": jnp.ones(3, jnp.float32)}
    compensation = modopt.kahan_compensation(params)
    assert (
        compensation["w"] is None
        and compensation["p"].dtype == dtype
        and not np.any(np.asarray(compensation["p"], np.float64))
    )
    step = jax.jit(modopt.apply_updates_kahan)
    ref_p, ref_c = p, np.zeros_like(p)
    for i in range(3):
        _, u = sums(dtype, 512, seed=i + 1)
        params, compensation = step(
            params, {"p": jnp.asarray(u), "w": jnp.full(3, 0.5, jnp.float32)}, compensation
        )
        ref_p, ref_c = kahan_numpy(ref_p, u, ref_c)
        np.testing.assert_array_equal(np.asarray(params["p"]).view(np.uint16), ref_p.view(np.uint16))
        np.testing.assert_array_equal(np.asarray(compensation["p"]).view(np.uint16), ref_c.view(np.uint16))
    np.testing.assert_array_equal(np.asarray(params["w"]), np.full(3, 2.5, np.float32))


def test_kahan_error_stays_bounded_where_rounding_to_nearest_loses_every_update():
    """300 updates each below half a bfloat16 spacing, drifting one way: rounding to nearest
    never moves the parameters (off by over 10 spacings at the end); Kahan's are within one spacing of the exact (float64) sum, and parameter plus
    buffer within the bound of its analysis (each step: the float32 sum's rounding, 2**-24 of
    it, and the buffer's, 2**-9 of a residual at most 2**-8 of the sum)."""
    steps, n = 300, 256
    rng = np.random.default_rng(0)
    p0 = rng.uniform(0.5, 4.0, n).astype(BF16)
    half_spacing = 2.0 ** (np.floor(np.log2(p0.astype(np.float64))) - 8)
    # Each parameter drifts one way, by about 50 half spacings in all.
    updates = (rng.uniform(0.05, 0.3, (steps, n)) * half_spacing * rng.choice([-1, 1], n)).astype(np.float32)
    exact = p0.astype(np.float64) + updates.astype(np.float64).sum(axis=0)

    def run(apply, carry):
        def body(carry, u):
            return apply(carry, u), None

        return jax.jit(lambda c: jax.lax.scan(body, c, jnp.asarray(updates))[0])(carry)

    nearest = run(lambda p, u: modopt.apply_updates(p, u), jnp.asarray(p0))
    np.testing.assert_array_equal(np.asarray(nearest, np.float64), p0.astype(np.float64))
    p, c = run(
        lambda pc, u: modopt.apply_updates_kahan(pc[0], u, pc[1]),
        (jnp.asarray(p0), jnp.zeros(n, jnp.bfloat16)),
    )
    p, c = np.asarray(p, np.float64), np.asarray(c, np.float64)
    largest = np.maximum(np.abs(exact), np.abs(p0.astype(np.float64))) * 1.01
    bound = steps * (2.0**-24 + 2.0**-17) * largest
    assert np.all(np.abs(p + c - exact) <= bound)
    spacing = 2.0 ** (np.floor(np.log2(np.abs(exact))) - 7)
    assert np.all(np.abs(p - exact) <= spacing + bound)
    assert np.all(np.abs(np.asarray(nearest, np.float64) - exact) > 10 * spacing)


def test_kahan_refuses_missing_or_mismatched_buffers():
    params = {"a": jnp.ones(3, jnp.bfloat16), "b": jnp.ones(2, jnp.float32)}
    updates = jax.tree.map(jnp.zeros_like, params)
    with pytest.raises(ValueError, match=r"\['a'\] is bfloat16 but has no compensation buffer"):
        modopt.apply_updates_kahan(params, updates, {"a": None, "b": None})
    with pytest.raises(ValueError, match=r"buffer for the parameter at \['a'\] has shape \(2,\)"):
        modopt.apply_updates_kahan(params, updates, {"a": jnp.zeros(2, jnp.bfloat16), "b": None})
    with pytest.raises(ValueError, match="does not have the structure of the parameters"):
        modopt.apply_updates_kahan(params, updates, {"a": jnp.zeros(3, jnp.bfloat16)})


# ---- the Optimizer -----------------------------------------------------------------------


def make_params():
    keys = jax.random.split(jax.random.key(0), 3)
    return {
        "w": jax.random.normal(keys[0], (16, 8)).astype(jnp.bfloat16),
        "h": (jax.random.normal(keys[1], (8,)) * 1e-3).astype(jnp.float16),
        "b": jax.random.normal(keys[2], (8,)),
        "n": jnp.arange(3),  # an integer leaf: never trained
    }


@functools.cache
def gradients(step):
    """Fixed gradients of step `step` (of each parameter's dtype), so that references see the
    same numbers whatever a compiler makes of a loss."""
    keys = jax.random.split(jax.random.fold_in(jax.random.key(2), step), 3)
    params = make_params()
    grads = {
        k: jax.random.normal(key, params[k].shape).astype(params[k].dtype) for k, key in zip("whb", keys)
    }
    return {**grads, "n": None}


@modopt.jit_step
def train_step(params, optimizer, grads):
    return optimizer.step(params, grads)


def train(optimizer, params, steps, start=0, drop=()):
    for i in range(start, start + steps):
        grads = {k: None if k in drop else g for k, g in gradients(i).items()}
        params, optimizer = train_step(params, optimizer, grads)
    return params, optimizer


def fresh(tree):
    return jax.tree.map(jnp.copy, tree)


def test_optimizer_kahan_equals_optax_updates_with_the_numpy_rule():
    """`Optimizer(sgd, compensation="kahan")`: each step is optax's SGD update applied by the
    NumPy rule; buffers exist for the bfloat16 and float16 leaves only."""
    # Updates mostly below half a spacing. A power of two makes `-lr * g` exact in bfloat16, so
    # the update is the same number whether or not XLA rounds it to bfloat16 (with excess
    # precision allowed, it may keep it in float32 inside a fusion).
    lr = 2.0**-10
    optimizer = modopt.Optimizer(modopt.sgd(lr), make_params(), compensation="kahan")
    buffers = optimizer.compensation.buffers
    assert isinstance(optimizer.compensation, modopt.KahanCompensation)
    assert buffers["b"] is None and buffers["n"] is None
    assert buffers["w"].dtype == jnp.bfloat16 and buffers["h"].dtype == jnp.float16
    params, optimizer = train(optimizer, make_params(), 5)

    tx = optax.sgd(lr)
    ref = {k: np.asarray(v) for k, v in make_params().items()}
    comp = {k: np.zeros_like(ref[k]) for k in ("w", "h")}
    state = tx.init({k: jnp.asarray(ref[k]) for k in ("w", "h", "b")})
    for i in range(5):
        grads = gradients(i)
        updates, state = tx.update({k: grads[k] for k in ("w", "h", "b")}, state)
        for k in ("w", "h"):
            ref[k], comp[k] = kahan_numpy(ref[k], np.asarray(updates[k]), comp[k])
        ref["b"] = ref["b"] + np.asarray(updates["b"])
    for k in ("w", "h"):
        np.testing.assert_array_equal(np.asarray(params[k]).view(np.uint16), ref[k].view(np.uint16))
        np.testing.assert_array_equal(
            np.asarray(optimizer.compensation.buffers[k]).view(np.uint16), comp[k].view(np.uint16)
        )
    np.testing.assert_array_equal(np.asarray(params["b"]), ref["b"])
    np.testing.assert_array_equal(np.asarray(params["n"]), np.arange(3))
    assert any(np.any(np.asarray(params[k]) != np.asarray(make_params()[k])) for k in ("w", "h"))


def test_optimizer_stochastic_rounding_rounds_to_neighbours_with_a_new_key_each_step():
    """Each bfloat16 / float16 result is a neighbour of the float32 sum of optax's update;
    float32 leaves are as without compensation; the key advances every step."""
    lr = 3e-3
    key = jax.random.key(7)
    optimizer = modopt.Optimizer(modopt.sgd(lr), make_params(), compensation="stochastic_rounding", key=key)
    plain = modopt.Optimizer(modopt.sgd(lr), make_params())
    params = make_params()
    grads = gradients(0)
    updates, _ = optax.sgd(lr).update({k: grads[k] for k in ("w", "h", "b")}, optax.sgd(lr).init(params))
    new, optimizer = train(optimizer, fresh(params), 1)
    for k in ("w", "h"):
        x = np.asarray(params[k], np.float32) + np.asarray(updates[k], np.float32)
        lower, upper = neighbours(x, np.asarray(params[k]).dtype)
        got = np.asarray(new[k], np.float64)
        assert np.all((got == lower) | (got == upper)) and np.any(lower != upper)
    np.testing.assert_array_equal(np.asarray(new["b"]), np.asarray(train(plain, make_params(), 1)[0]["b"]))
    first = np.asarray(jax.random.key_data(optimizer.compensation.key))
    _, optimizer = train(optimizer, new, 1, start=1)
    second = np.asarray(jax.random.key_data(optimizer.compensation.key))
    assert not np.array_equal(first, second) and not np.array_equal(
        first, np.asarray(jax.random.key_data(key))
    )


def test_a_none_gradient_keeps_the_parameter_and_its_buffer():
    optimizer = modopt.Optimizer(modopt.adam(1e-2), make_params(), compensation="kahan")
    params, optimizer = train(optimizer, make_params(), 2)
    before = fresh((params, optimizer.compensation.buffers))
    params, optimizer = train(optimizer, params, 1, start=2, drop=("w",))
    np.testing.assert_array_equal(np.asarray(params["w"], np.float64), np.asarray(before[0]["w"], np.float64))
    np.testing.assert_array_equal(
        np.asarray(optimizer.compensation.buffers["w"], np.float64), np.asarray(before[1]["w"], np.float64)
    )
    assert np.any(np.asarray(params["b"]) != np.asarray(before[0]["b"]))


def test_compensation_arguments_are_checked():
    params = make_params()
    with pytest.raises(
        ValueError, match=r"Invalid compensation: 'kahn' \(must be one of 'kahan', 'stochastic_rounding'"
    ):
        modopt.Optimizer(modopt.sgd(0.1), params, compensation="kahn")
    with pytest.raises(ValueError, match=r"needs a PRNG key.*key=jax.random.key\(0\)"):
        modopt.Optimizer(modopt.sgd(0.1), params, compensation="stochastic_rounding")
    with pytest.raises(ValueError, match="`key` is the PRNG key of compensation='stochastic_rounding'"):
        modopt.Optimizer(modopt.sgd(0.1), params, compensation="kahan", key=jax.random.key(0))
    # A float32 model: nothing to compensate, nothing changes.
    wide = {"b": jnp.ones(3)}
    optimizer = modopt.Optimizer(modopt.sgd(0.1), wide, compensation="kahan")
    assert optimizer.compensation.buffers == {"b": None}
    assert "compensation=KahanCompensation" in repr(optimizer)


@pytest.mark.parametrize("kind", ["kahan", "stochastic_rounding"])
def test_compensated_optimizer_resumes_bit_exactly_from_a_checkpoint(tmp_path, kind):
    """Kahan buffers and the rounding key are saved and restored with the optimizer: 4 steps
    straight equal 2 steps, save, restore into a fresh optimizer, 2 steps."""
    pytest.importorskip("orbax.checkpoint")
    from modopt.integrations.orbax import CheckpointManager

    def make():
        key = jax.random.key(5) if kind == "stochastic_rounding" else None
        return modopt.Optimizer(modopt.adamw(1e-2), make_params(), compensation=kind, key=key)

    straight, straight_opt = train(make(), make_params(), 4)
    params, optimizer = train(make(), make_params(), 2)
    with CheckpointManager(tmp_path, async_save=False) as manager:
        manager.save(2, params=params, optimizer=optimizer)
        restored = manager.restore(params=make_params(), optimizer=make())
    resumed, resumed_opt = train(restored["optimizer"], restored["params"], 2, start=2)
    for a, b in zip(
        jax.tree.leaves((straight, straight_opt)), jax.tree.leaves((resumed, resumed_opt)), strict=True
    ):
        if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_shardings_and_memory_plan_count_the_compensation():
    """`modopt.sharding.shardings` places Kahan buffers like their parameters and the key
    replicated; `bytes_per_device` counts them (2 bytes per bfloat16 / float16 element)."""
    mesh = jax.make_mesh((1,), ("model",))
    specs = {"w": jax.P(None, "model"), "h": jax.P(), "b": jax.P(), "n": None}
    params = make_params()
    optimizer = modopt.Optimizer(modopt.adam(1e-3), params, compensation="kahan", group_small_leaves=False)
    placed = modopt.sharding.shardings(optimizer, specs, mesh=mesh)
    assert (
        placed.compensation.buffers["w"].spec == jax.P(None, "model")
        and placed.compensation.buffers["b"] is None
    )
    assert modopt.sharding.bytes_per_device(optimizer.compensation, placed.compensation) == (16 * 8 + 8) * 2
    # Adam's moments: each of the parameter's dtype (optax's default), plus two int32 counts.
    moments = 2 * (16 * 8 * 2 + 8 * 2 + 8 * 4) + 4
    assert modopt.sharding.bytes_per_device(optimizer.state, placed.state) == moments
    rounding = modopt.Optimizer(
        modopt.adam(1e-3), params, compensation="stochastic_rounding", key=jax.random.key(0)
    )
    placed = modopt.sharding.shardings(rounding, specs, mesh=mesh)
    assert placed.compensation.key.spec == jax.P()
    assert modopt.sharding.bytes_per_device(rounding.compensation) == 8  # a threefry key: two uint32
