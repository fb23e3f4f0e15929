"""Behaviours that optax 0.2.8's own test files check of modopt, compared with optax itself.

Each test here covers a difference that `tests/test_optax_suite.py` found between modopt and
optax's own tests: either modopt now does what optax does (checked against optax), or the
optax test is deselected there (`DEPARTURES`) and the behaviour it was after is checked here
with values modopt accepts.
"""

from __future__ import annotations

import contextlib
import io
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import modopt

optax = pytest.importorskip("optax")


# --- optimistic_adam is deprecated, as in optax -------------------------------------------


def test_optimistic_adam_warns_as_optax_does():
    with pytest.warns(DeprecationWarning, match="use `optimistic_adam_v2` instead"):
        optax.optimistic_adam(1e-2)
    with pytest.warns(DeprecationWarning, match="use `optimistic_adam_v2` instead"):
        modopt.optimistic_adam(1e-2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        modopt.optimistic_adam_v2(1.0, alpha=1e-2, beta=1e-2)  # the replacement does not warn


# --- a PRNG key given as an integer seed held in inject_hyperparams' state ----------------


def test_noisy_sgd_with_an_injected_integer_seed_matches_optax():
    params = [-jnp.ones((2, 3)), jnp.ones((2, 5, 2))]
    grads = [jnp.ones((2, 3)), -jnp.ones((2, 5, 2))]

    def run(lib):
        tx = lib.inject_hyperparams(lib.noisy_sgd)(learning_rate=1e-3, eta=1e-4, key=0)
        state = jax.jit(tx.init)(params)
        updates, state = jax.jit(tx.update)(grads, state, params)
        updates, _ = jax.jit(tx.update)(grads, state, params)
        return updates

    ours, theirs = run(modopt), run(optax)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)
    # and it is the same noise as the plain transform's, seeded by the same integer
    plain = modopt.noisy_sgd(1e-3, eta=1e-4, key=0)
    state = plain.init(params)
    first, state = plain.update(grads, state, params)
    second, _ = plain.update(grads, state, params)
    for a, b in zip(ours, second):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)


# --- multi_normal broadcasts its loc and log_scale, as optax's does -------------------------


@pytest.mark.parametrize(
    "loc_shape, scale_shape",
    [((1, 4), (3, 4)), ((1, 2, 1, 3), (2, 1, 4, 3)), ((2, 3), ()), ((), (3,))],
)
def test_multi_normal_broadcasts_like_optax(loc_shape, scale_shape):
    rng = np.random.default_rng(0)
    loc = jnp.asarray(rng.normal(size=loc_shape), jnp.float32)
    log_scale = jnp.asarray(0.3 * rng.normal(size=scale_shape), jnp.float32)
    ours, theirs = modopt.multi_normal(loc, log_scale), optax.multi_normal(loc, log_scale)
    assert ours.event_shape == theirs._param_shape
    key = jax.random.key(3)
    sample_ours, sample_theirs = ours.sample((5,), key), theirs.sample((5,), key)
    assert sample_ours.shape == sample_theirs.shape == (5, *theirs._param_shape)
    np.testing.assert_allclose(sample_ours, sample_theirs, rtol=1e-6, atol=1e-6)
    x = jnp.asarray(rng.normal(size=theirs._param_shape), jnp.float32)
    np.testing.assert_allclose(ours.log_prob(x), theirs.log_prob(x), rtol=1e-5)
    np.testing.assert_allclose(ours.log_prob(sample_theirs), theirs.log_prob(sample_theirs), rtol=1e-5)


@pytest.mark.parametrize("loc_shape, scale_shape", [((2,), (3,)), ((1, 2, 1, 3), (2, 1, 4, 4))])
def test_multi_normal_rejects_shapes_that_do_not_broadcast_as_optax_does(loc_shape, scale_shape):
    loc, log_scale = jnp.zeros(loc_shape), jnp.zeros(scale_shape)
    with pytest.raises(ValueError, match="Incompatible shapes for broadcasting"):
        optax.multi_normal(loc, log_scale)
    with pytest.raises(ValueError, match=r"Incompatible shapes for broadcasting: log_scale of shape"):
        modopt.multi_normal(loc, log_scale)


# --- line searches ----------------------------------------------------------------------------

LINESEARCHES = {
    "backtracking": lambda lib: lib.scale_by_backtracking_linesearch(max_backtracking_steps=5),
    "zoom": lambda lib: lib.scale_by_zoom_linesearch(max_linesearch_steps=5),
}


@pytest.mark.parametrize("name", list(LINESEARCHES))
def test_linesearch_rejects_an_extra_argument_value_fn_does_not_take_as_optax_does(name):
    def value_fn(params, batch):
        return jnp.sum(params * batch)

    params, grad = jnp.array([1.0, 2.0]), jnp.array([1.0, 1.0])
    for lib in (optax, modopt):
        tx = LINESEARCHES[name](lib)
        state = tx.init(params)
        with pytest.raises(TypeError, match="Unexpected keyword arguments"):
            tx.update(
                -grad, state, params, value=value_fn(params, jnp.ones(2)), grad=grad,
                value_fn=value_fn, batch=jnp.ones(2), unused_arg=42,
            )  # fmt: skip


def _verbose_output(lib, **kwargs):
    """What the zoom search prints on `||w||^2` from `w = (-60, 0)` along `u = (1, 0)`."""
    fn = lambda w: jnp.dot(w, w)
    w, u = jnp.array([-60.0, 0.0]), jnp.array([1.0, 0.0])
    tx = lib.scale_by_zoom_linesearch(verbose=True, **kwargs)
    value, grad = jax.value_and_grad(fn)(w)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        _, state = tx.update(u, tx.init(w), w, value=value, grad=grad, value_fn=fn)
        jax.effects_barrier()
    return out.getvalue(), float(state.learning_rate)


def test_zoom_verbose_reports_a_step_cut_at_max_learning_rate_as_optax_does():
    # Every step up to 30 still descends, and only steps in [30, 90] meet the curvature
    # condition with curv_rtol=0.5: capped at 10, both searches take 10 and say so.
    kwargs = dict(max_linesearch_steps=10, curv_rtol=0.5, max_learning_rate=10.0)
    theirs, their_step = _verbose_output(optax, **kwargs)
    ours, our_step = _verbose_output(modopt, **kwargs)
    assert their_step == our_step == 10.0
    assert "curvature" in theirs.lower() and "curvature error 40.0" in ours and "Hint 4" in ours
    # With room to reach 60 (the exact minimizer) neither prints anything.
    assert _verbose_output(optax, max_linesearch_steps=10)[0] == ""
    assert _verbose_output(modopt, max_linesearch_steps=10)[0] == ""


@pytest.mark.parametrize("name", list(LINESEARCHES))
def test_linesearch_rejects_an_increase_factor_below_one(name):
    # optax does not check it; below 1 the "increase" shrinks every first guess. For the zoom
    # search that breaks the bracketing phase, as optax itself shows on a quadratic whose good
    # steps lie beyond the first guess: it exhausts its evaluations and misses the curvature
    # condition, where the default factor meets both conditions in a few.
    with pytest.raises(ValueError, match=r"Invalid increase_factor: 0.5 \(must be >= 1\)"):
        getattr(modopt, f"scale_by_{name}_linesearch")(5, increase_factor=0.5)
    if name == "zoom":
        fn = lambda w: 0.01 * jnp.sum(w**2)
        w = jnp.array([10.0])
        value, grad = jax.value_and_grad(fn)(w)
        infos = {}
        for factor in (2.0, 0.5):
            tx = optax.scale_by_zoom_linesearch(20, increase_factor=factor)
            _, state = tx.update(-grad, tx.init(w), w, value=value, grad=grad, value_fn=fn)
            infos[factor] = state.info
        assert float(infos[2.0].curvature_error) == 0.0 and int(infos[2.0].num_linesearch_steps) < 10
        assert float(infos[0.5].curvature_error) > 0.0 and int(infos[0.5].num_linesearch_steps) >= 19


# optax's test_dtype_stability, with values modopt accepts: every numeric hyperparameter as a
# 0-d array of `confuse`, the params in `dtype`, a loss in `confuse`, x64 on, under lax.cond.
VALID = {
    "backtracking": dict(
        slope_rtol=1e-4, decrease_factor=0.8, increase_factor=1.5, max_learning_rate=1.0, atol=1e-5, rtol=1e-5
    ),
    "zoom": dict(
        tol=1e-5,
        increase_factor=2.0,
        slope_rtol=1e-4,
        curv_rtol=0.9,
        approx_dec_rtol=1e-6,
        stepsize_precision=1e-5,
    ),
}


@pytest.mark.parametrize("name", list(LINESEARCHES))
@pytest.mark.parametrize(
    "dtype, confuse",
    [("float16", "float64"), ("bfloat16", "float32"), ("float32", "float16"), ("float64", "bfloat16")],
)
def test_linesearch_dtype_stability(name, dtype, confuse):
    with jax.enable_x64(True):
        dtype, confuse = jnp.dtype(dtype), jnp.dtype(confuse)
        tx = getattr(modopt, f"scale_by_{name}_linesearch")(
            5, **{k: jnp.array(v, confuse) for k, v in VALID[name].items()}
        )
        x = jnp.array([1.0, 2.0], dtype)
        state = tx.init(x)
        value_fn = lambda x: jnp.sum(x**2).astype(confuse)
        cond = jax.random.randint(jax.random.key(0), (), 0, 2) == 0
        new_state = jax.lax.cond(
            cond,
            lambda x: tx.update(x, state, x, value=1.0, grad=x, value_fn=value_fn)[1],
            lambda x: state,
            x,
        )
        assert jax.tree_util.tree_structure(new_state) == jax.tree_util.tree_structure(state)
        for new, old in zip(jax.tree_util.tree_leaves(new_state), jax.tree_util.tree_leaves(state)):
            assert new.dtype == old.dtype
