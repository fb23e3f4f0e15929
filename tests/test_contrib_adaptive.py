"""contrib's adaptive and parameter-free optimizers beyond the registry's checks.

The registry (`registry/contrib_adaptive.py`) compares each with optax on numbers given as
numbers. Here: AdEMAMix's `b3` and `alpha` as schedules (modopt's and plain functions) against
optax, `mu_dtype`, DoG's `init_step` pair and its initial distance from the paper's formula,
ACProp's first step, COCOB's first step from Algorithm 2, state dtypes that stay put, and bad
hyperparameters with the errors they give.
"""

from __future__ import annotations

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import modopt
from modopt import contrib

STEPS = 4


def make_params(dtype=jnp.float32):
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    return {
        "w": jax.random.normal(k1, (4, 3), dtype),
        "b": jax.random.normal(k2, (3,), dtype),
        "s": jax.random.normal(k3, (), dtype),
    }


def grads_at(step, params):
    keys = jax.random.split(jax.random.fold_in(jax.random.key(3), step), 3)
    return {
        name: jax.random.normal(k, p.shape, jnp.float32).astype(p.dtype)
        for k, (name, p) in zip(keys, sorted(params.items()))
    }


def assert_close(ours, theirs, what, rtol=1e-6, atol=1e-6):
    our_flat = jax.tree_util.tree_flatten_with_path(ours)[0]
    their_flat = jax.tree_util.tree_flatten_with_path(theirs)[0]
    assert [p for p, _ in our_flat] == [p for p, _ in their_flat], f"{what}: structure differs"
    for (path, a), (_, b) in zip(our_flat, their_flat):
        assert jnp.result_type(a) == jnp.result_type(b), f"{what} at {jax.tree_util.keystr(path)}: dtype"
        np.testing.assert_allclose(
            np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=rtol, atol=atol,
            err_msg=f"{what} at {jax.tree_util.keystr(path)}",
        )


def run_both(ours, theirs, steps=STEPS, params=None):
    """Updates and states of `ours` (jitted) and `theirs` (optax) along the same trajectory."""
    params = make_params() if params is None else params
    our_state, their_state = ours.init(params), theirs.init(params)
    update = jax.jit(ours.update)
    for step in range(steps):
        grads = grads_at(step, params)
        our_updates, our_state = update(grads, our_state, params)
        their_updates, their_state = theirs.update(grads, their_state, params)
        assert_close(our_updates, their_updates, f"updates, step {step}")
        assert_close(our_state, their_state, f"state, step {step}")
        params = optax.apply_updates(params, their_updates)
    return our_state


# --- AdEMAMix: b3 and alpha as schedules -------------------------------------------------


def test_ademamix_b3_and_alpha_schedules_match_optax():
    """The paper's warm-ups: alpha linear from 0, b3 from b1 towards its final value."""
    ours = contrib.ademamix(
        0.01,
        b3=modopt.linear_schedule(0.9, 0.999, 3),
        alpha=modopt.linear_schedule(0.0, 5.0, 3),
        weight_decay=0.01,
    )
    theirs = optax.contrib.ademamix(
        0.01, b3=optax.linear_schedule(0.9, 0.999, 3), alpha=optax.linear_schedule(0.0, 5.0, 3), weight_decay=0.01
    )
    run_both(ours, theirs, steps=5)


def test_scale_by_ademamix_plain_function_schedules_match_optax():
    b3 = lambda count: 0.99 - 0.09 / (1.0 + count)  # noqa: E731
    alpha = lambda count: 2.0 * jnp.minimum(count, 2)  # noqa: E731
    run_both(contrib.scale_by_ademamix(b3=b3, alpha=alpha), optax.contrib.scale_by_ademamix(b3=b3, alpha=alpha))


def test_simplified_ademamix_alpha_schedule_matches_optax():
    ours = contrib.simplified_ademamix(0.005, b1=0.9, alpha=modopt.linear_schedule(0.0, 4.0, 3))
    theirs = optax.contrib.simplified_ademamix(0.005, b1=0.9, alpha=optax.linear_schedule(0.0, 4.0, 3))
    run_both(ours, theirs)


def test_ademamix_defaults_match_optax():
    """The defaults differ between the two in optax (alpha 6.0 vs 5.0); both kept."""
    assert float(contrib.scale_by_ademamix().alpha) == 6.0
    assert float(contrib.ademamix(0.1).alpha) == 5.0
    run_both(contrib.scale_by_ademamix(), optax.contrib.scale_by_ademamix())
    run_both(contrib.ademamix(0.01), optax.contrib.ademamix(0.01))
    run_both(contrib.simplified_ademamix(0.01), optax.contrib.simplified_ademamix(0.01))


def test_ademamix_slow_ema_is_not_bias_corrected():
    """From the paper's update with NumPy: m2 is used raw, m1 and nu are bias-corrected."""
    b1, b2, b3, alpha, eps = 0.9, 0.999, 0.99, 5.0, 1e-8
    tx = contrib.scale_by_ademamix(b1, b2, b3, alpha, eps)
    params = {"x": jnp.zeros(3)}
    state = tx.init(params)
    m1 = m2 = nu = np.zeros(3)
    for step in range(3):
        g = np.asarray([0.5, -1.0, 2.0]) * (step + 1)
        updates, state = tx.update({"x": jnp.asarray(g, jnp.float32)}, state)
        t = step + 1
        m1, m2, nu = b1 * m1 + (1 - b1) * g, b3 * m2 + (1 - b3) * g, b2 * nu + (1 - b2) * g**2
        expected = (m1 / (1 - b1**t) + alpha * m2) / (np.sqrt(nu / (1 - b2**t)) + eps)
        # float32 rounds 1 - b2**t at ~1e-5; a bias-corrected m2 would be 1 / (1 - b3**t) times larger.
        np.testing.assert_allclose(updates["x"], expected, rtol=1e-4)


def test_ademamix_mu_dtype_keeps_the_state_in_it():
    """The first step equals optax's; the accumulators stay bf16 (optax lets them become f32)."""
    params = make_params()
    ours = contrib.scale_by_ademamix(mu_dtype=jnp.bfloat16)
    theirs = optax.contrib.scale_by_ademamix(mu_dtype=jnp.bfloat16)
    grads = grads_at(0, params)
    our_updates, state = ours.update(grads, ours.init(params), params)
    their_updates, _ = theirs.update(grads, theirs.init(params), params)
    assert_close(our_updates, their_updates, "first updates")
    for name in ("m1", "m2", "nu"):
        assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(getattr(state, name))), name
    _, state = ours.update(grads_at(1, params), state, params)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves((state.m1, state.m2, state.nu)))


def test_b3_set_keeps_its_exact_complement():
    """`set(b3=...)` on an Optimizer keeps a rate whose `1 - b3` is exact: still optax's numbers."""
    params = make_params()
    optimizer = modopt.Optimizer(contrib.scale_by_ademamix(b3=0.9), params).set(b3=0.9999)
    grads = grads_at(0, params)
    _, state = optimizer.tx.update(grads, optimizer.state, params)
    theirs = optax.contrib.scale_by_ademamix(b3=0.9999)
    _, their_state = theirs.update(grads, theirs.init(params), params)
    assert_close(state.m2, their_state.m2, "m2")


# --- ACProp --------------------------------------------------------------------------------


def test_acprop_first_step_is_the_gradient_over_one_plus_eps():
    """No second moment yet: the denominator is 1 (+ eps); the numerator is the raw gradient."""
    tx = contrib.scale_by_acprop(eps=0.5)
    g = {"x": jnp.asarray([1.0, -2.0, 4.0])}
    updates, state = tx.update(g, tx.init(g))
    np.testing.assert_allclose(updates["x"], np.asarray([1.0, -2.0, 4.0]) / 1.5, rtol=1e-6)
    # The second step divides by the first step's centered moment: (1 - b2) g0^2 + eps_root, debiased.
    g1 = {"x": jnp.asarray([3.0, 1.0, -1.0])}
    updates, _ = tx.update(g1, state)
    s_hat = ((1 - 0.999) * np.asarray([1.0, -2.0, 4.0]) ** 2 + 1e-16) / (1 - 0.999)
    np.testing.assert_allclose(updates["x"], np.asarray([3.0, 1.0, -1.0]) / (np.sqrt(s_hat) + 0.5), rtol=1e-5)


# --- DoG and DoWG --------------------------------------------------------------------------


def test_dog_init_step_is_a_pair_whose_value_is_a_hyperparameter():
    tx = contrib.dog(init_step=("distance", 0.1))
    assert tx.init_step_type == "distance"
    assert tx.init_step == ("distance", pytest.approx(0.1))
    assert float(modopt.hyperparameters(tx)["init_step_value"]) == pytest.approx(0.1)
    changed = modopt.set_hyperparameters(tx, init_step_value=0.2)
    run_both(changed, optax.contrib.dog(init_step=("distance", 0.2)))


def test_dog_heuristic_distance_uses_the_global_norm():
    """r_eps = value * (1 + ||x0||) with the norm over the whole tree (not per leaf, as the
    `reps_rel` of optax's `scale_by_distance_over_gradients`)."""
    params = make_params()
    state = contrib.dog(init_step=("heuristic", 1e-3)).init(params)[1]
    norm = np.sqrt(sum(np.sum(np.asarray(x, np.float64) ** 2) for x in jax.tree.leaves(params)))
    np.testing.assert_allclose(state.max_dist, 1e-3 * (1 + norm), rtol=1e-6)
    assert bool(state.is_init_step)
    assert float(contrib.dog(init_step=("learning_rate", 0.5)).init(params)[1].max_dist) == 0.0


def test_dog_learning_rate_init_step_sets_the_first_step_size():
    params = {"x": jnp.asarray([1.0, 2.0])}
    tx = contrib.dog(init_step=("learning_rate", 0.25))
    state = tx.init(params)
    updates, state = tx.update({"x": jnp.asarray([1.0, -1.0])}, state, params)
    np.testing.assert_allclose(updates["x"], [-0.25, 0.25])
    # Then DoG's own step size: distance so far over the root of the summed squared norms.
    new_params = {"x": params["x"] + updates["x"]}
    updates, _ = tx.update({"x": jnp.asarray([2.0, 0.0])}, state, new_params)
    step = np.sqrt(2 * 0.25**2) / np.sqrt(2.0 + 4.0 + 1e-8)
    np.testing.assert_allclose(updates["x"], [-2.0 * step, 0.0], rtol=1e-6)


def test_dowg_step_from_the_paper():
    """r^2 = max(r^2, ||x - x0||^2), v += r^2 ||g||^2, step = r^2 / (sqrt(v) + eps)."""
    eps = 1e-4
    tx = contrib.dowg(init_estim_sq_dist=0.5, eps=eps)
    x0 = np.asarray([1.0, -1.0, 2.0])
    params = {"x": jnp.asarray(x0, jnp.float32)}
    state = tx.init(params)
    r2, v, x = 0.5, 0.0, x0
    for step in range(3):
        g = np.asarray([0.3, -0.2, 0.1]) * (step + 1)
        updates, state = tx.update({"x": jnp.asarray(g, jnp.float32)}, state, {"x": jnp.asarray(x, jnp.float32)})
        r2 = max(r2, float(np.sum((x - x0) ** 2)))
        v += r2 * float(np.sum(g**2))
        expected = -r2 / (np.sqrt(v) + eps) * g
        np.testing.assert_allclose(updates["x"], expected, rtol=1e-5)
        x = x + expected


@pytest.mark.parametrize("make", [contrib.dog, contrib.dowg], ids=["dog", "dowg"])
def test_dog_state_dtypes_stay_with_mixed_precision_params(make):
    """bf16 and f32 leaves: the first updates are optax's (f32), and the state's scalars keep the
    lowest dtype (bf16) at every step, where optax's become f32, so the state can be a scan
    carry or a donated buffer."""
    params = {"a": jnp.ones((3,), jnp.bfloat16) * 0.5, "b": jnp.full((2,), 2.0, jnp.float32)}
    ours, theirs = make(), getattr(optax.contrib, make.__name__.lower())()
    grads = jax.tree.map(lambda x: x * 0.5, params)
    state = ours.init(params)
    assert_close(state, theirs.init(params), "initial state")
    updates, new_state = ours.update(grads, state, params)
    their_updates, _ = theirs.update(grads, theirs.init(params), params)
    assert_close(updates, their_updates, "first updates")
    assert jax.tree.map(lambda x: x.dtype, new_state) == jax.tree.map(lambda x: x.dtype, state)
    optimizer = modopt.Optimizer(ours, params)

    @eqx.filter_jit
    def run(params, optimizer):
        def body(carry, _):
            params, optimizer = carry
            return optimizer.step(params, jax.tree.map(lambda x: x - 1, params)), None

        return jax.lax.scan(body, (params, optimizer), length=3)[0]

    new_params, _ = run(params, optimizer)
    assert jax.tree.map(lambda x: x.dtype, new_params) == jax.tree.map(lambda x: x.dtype, params)


# --- COCOB ---------------------------------------------------------------------------------


def test_cocob_first_step_from_algorithm_2():
    """At x0 with gradient g: L = max(eps, |g|), G = |g|, R = 0, C = -g, and the new point is
    x0 + C / (L max(G + L, alpha L)) * (L + R)."""
    alpha, eps = 4.0, 1e-8
    x0 = np.asarray([1.0, -2.0, 0.5])
    g = np.asarray([0.5, -1.0, 0.0])
    tx = contrib.scale_by_cocob(alpha, eps)
    updates, state = tx.update({"x": jnp.asarray(g, jnp.float32)}, tx.init({"x": jnp.asarray(x0, jnp.float32)}),
                               {"x": jnp.asarray(x0, jnp.float32)})
    scale = np.maximum(eps, np.abs(g))
    expected = -g / (scale * np.maximum(np.abs(g) + scale, alpha * scale)) * scale
    np.testing.assert_allclose(updates["x"], expected, rtol=1e-5)
    np.testing.assert_allclose(state.init_particles["x"], x0)
    np.testing.assert_allclose(state.scale["x"], scale, rtol=1e-6)


def test_cocob_keeps_its_own_copy_of_the_start():
    """The state's `init_particles` is not the caller's buffer, which a donated step would delete."""
    params = make_params()
    state = contrib.cocob().init(params)
    assert all(a is not b for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(params)))
    state = contrib.dog().init(params)
    assert all(a is not b for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(params)))


# --- Bad hyperparameters and calls ---------------------------------------------------------

BAD = [
    (lambda: contrib.ademamix(0.1, b3=1.0), "Invalid b3: 1.0 (must be in [0, 1)) in Ademamix."),
    (lambda: contrib.scale_by_ademamix(b1=-0.1), "Invalid b1: -0.1 (must be in [0, 1)) in ScaleByAdemamix."),
    (
        lambda: contrib.scale_by_ademamix(b3=modopt.linear_schedule(0.9, 1.0, 100)),
        "is 1.0 at step 100 (must be in [0, 1)) in ScaleByAdemamix.",
    ),
    (lambda: contrib.ademamix(0.1, alpha=-1.0), "Invalid alpha: -1.0 (must be >= 0 and finite) in Ademamix."),
    (lambda: contrib.ademamix(-0.1), "Invalid learning_rate: -0.1 (must be >= 0 and finite) in Ademamix."),
    (lambda: contrib.simplified_ademamix(0.1, b2=1.0), "Invalid b2: 1.0 (must be in [0, 1)) in SimplifiedAdEMAMix."),
    (
        lambda: contrib.simplified_ademamix(0.1, alpha=modopt.linear_schedule(0.0, -1.0, 10)),
        "is -1.0 at step 10 (must be >= 0 and finite) in SimplifiedAdEMAMix.",
    ),
    (lambda: contrib.acprop(0.1, b2=1.0), "Invalid b2: 1.0 (must be in [0, 1)) in Acprop."),
    (lambda: contrib.scale_by_acprop(eps=-1e-8), "Invalid eps: -1e-08 (must be >= 0) in ScaleByAcprop."),
    (lambda: contrib.cocob(alpha=0.0), "Invalid alpha: 0.0 (must be > 0) in Cocob."),
    (lambda: contrib.scale_by_cocob(eps=-1.0), "Invalid eps: -1.0 (must be >= 0) in ScaleByCocob."),
    (lambda: contrib.dog(init_step=("foo", 1.0)), "Invalid init_step: ('foo', 1.0) (its type must be one of"),
    (lambda: contrib.dog(init_step=1e-6), "Invalid init_step: 1e-06 (must be a pair (type, value)"),
    (lambda: contrib.dog(init_step=("distance", 0.0)), "Invalid init_step_value: 0.0 (must be > 0 and finite) in Dog."),
    (lambda: contrib.dog(eps=-1.0), "Invalid eps: -1.0 (must be >= 0) in Dog."),
    (lambda: contrib.dowg(init_estim_sq_dist=-1.0), "Invalid init_estim_sq_dist: -1.0 (must be > 0 and finite) in Dowg."),
    (lambda: contrib.dowg(learning_rate=-1.0), "Invalid learning_rate: -1.0 (must be >= 0 and finite) in Dowg."),
]


@pytest.mark.parametrize("make, message", BAD, ids=[m.split(" in ")[-1] + ":" + m[:24] for _, m in BAD])
def test_bad_hyperparameters_are_named(make, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        make()


@pytest.mark.parametrize("make", [contrib.dog, contrib.dowg, contrib.scale_by_cocob], ids=["dog", "dowg", "cocob"])
def test_update_without_params_says_it_needs_them(make):
    tx, params = make(), make_params()
    with pytest.raises(ValueError, match=r"update needs the current parameters"):
        tx.update(grads_at(0, params), tx.init(params))


def test_weight_decay_cannot_be_switched_on_later():
    """`weight_decay=None` means no decay transform (optax's identity): setting one changes the state."""
    optimizer = modopt.Optimizer(contrib.dog(), make_params())
    with pytest.raises(ValueError, match="Cannot set weight_decay from None to a value"):
        optimizer.set(weight_decay=0.1)
