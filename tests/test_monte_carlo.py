"""Monte Carlo gradient estimators and control variates (`modopt.monte_carlo`).

optax no longer ships `optax.monte_carlo`, so there is no oracle: every check compares with a
closed form. For `x ~ N(mu, diag(sigma^2))`, `sigma = exp(log_scale)`, the gradients of
`E f(x)` are known for the functions below; each estimator returns per-sample rows whose mean
must lie within `K` standard errors (estimated from the rows themselves) of the truth. The
seeds are fixed, so the tests are deterministic; with `K = 5` a correct estimator would fail a
coordinate with probability ~6e-7 under a normal approximation, and a biased one is caught
once its bias exceeds a few standard errors (~0.1-0.3 here at 2000 samples).
"""

from __future__ import annotations

import doctest
import functools
import importlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from modopt import monte_carlo as mc

K = 5.0  # standard errors allowed between a Monte Carlo mean and the closed form
N = 2000  # samples per estimate
MU = np.array([0.5, -1.0, 2.0], np.float32)
LOG_SCALE = np.array([0.0, -0.5, 0.3], np.float32)
SIGMA = np.exp(LOG_SCALE.astype(np.float64))
W = np.array([1.0, 2.0, -1.0], np.float32)
PARAMS = [jnp.asarray(MU), jnp.asarray(LOG_SCALE)]
ESTIMATORS = {
    "score_function": mc.score_function_jacobians,
    "pathwise": mc.pathwise_jacobians,
    "measure_valued": mc.measure_valued_jacobians,
}


# Functions of one sample, with the gradients of their expectation in (mu, log_scale).
def constant(x):
    return jnp.asarray(0.7) + 0.0 * jnp.sum(x)


def linear(x):
    return jnp.sum(W * x)


def square(x):
    return jnp.sum(x**2)


def weighted_square(x):
    return jnp.sum(W * x) ** 2


def cosine(x):
    return jnp.sum(jnp.cos(x))


def cube(x):
    return jnp.sum(x**3)


def exponential(x):
    return jnp.sum(jnp.exp(x / 2))


def shifted_square(x):
    return jnp.sum(x**2) + 10.0


_DAMP = np.exp(-(SIGMA**2) / 2)  # E cos(x) = cos(mu) exp(-sigma^2 / 2)
_EXP = np.exp(MU / 2 + SIGMA**2 / 8)
TRUTH = {  # name: (function, d/d mu E f, d/d log_scale E f = sigma d/d sigma E f)
    "constant": (constant, np.zeros(3), np.zeros(3)),
    "linear": (linear, W, np.zeros(3)),
    "square": (square, 2 * MU, 2 * SIGMA**2),
    "weighted_square": (weighted_square, 2 * W * np.dot(W, MU), 2 * W**2 * SIGMA**2),
    "cosine": (cosine, -np.sin(MU) * _DAMP, -(SIGMA**2) * np.cos(MU) * _DAMP),
    "exponential": (exponential, 0.5 * _EXP, 0.25 * SIGMA**2 * _EXP),  # E exp(x/2) = exp(mu/2 + sigma^2/8)
    "cube": (cube, 3 * MU**2 + 3 * SIGMA**2, 6 * MU * SIGMA**2),  # E x^3 = mu^3 + 3 mu sigma^2
}


@functools.cache
def _all_cases(name, coupling=True, cases=tuple(TRUTH)):
    """The jacobians of `cases` of TRUTH by one estimator (N samples of key 0), compiled once."""
    estimator = ESTIMATORS[name]
    extra = (coupling,) if name == "measure_valued" else ()

    def run(params, key):
        return {case: estimator(TRUTH[case][0], params, mc.multi_normal, key, N, *extra) for case in cases}

    results = jax.jit(run)(PARAMS, jax.random.key(0))
    return {case: [np.asarray(j, np.float64) for j in jacobians] for case, jacobians in results.items()}


def _assert_unbiased(rows, expected, what):
    """The mean of i.i.d. rows is within K standard errors of `expected` (plus float32 slack)."""
    n = rows.shape[0]
    mean = rows.mean(axis=0)
    standard_error = rows.std(axis=0, ddof=1) / np.sqrt(n)
    tolerance = K * standard_error + 1e-5 * (1 + np.abs(expected))
    assert np.all(np.abs(mean - expected) <= tolerance), (
        f"{what}: mean {mean}, expected {expected}, {K} standard errors {K * standard_error}"
    )


@pytest.mark.parametrize("case", list(TRUTH))
@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_estimators_are_unbiased(name, case):
    _, grad_mu, grad_log_scale = TRUTH[case]
    jacobians = _all_cases(name)[case]
    assert isinstance(jacobians, list) and len(jacobians) == 2
    assert [j.shape for j in jacobians] == [(N, 3), (N, 3)]
    _assert_unbiased(jacobians[0], grad_mu, f"{name} {case} d/d mu")
    _assert_unbiased(jacobians[1], grad_log_scale, f"{name} {case} d/d log_scale")


UNCOUPLED_CASES = ("linear", "square", "cosine")


@pytest.mark.parametrize("case", UNCOUPLED_CASES)
def test_measure_valued_without_coupling_is_unbiased(case):
    _, grad_mu, grad_log_scale = TRUTH[case]
    jacobians = _all_cases("measure_valued", False, UNCOUPLED_CASES)[case]
    _assert_unbiased(jacobians[0], grad_mu, f"uncoupled {case} d/d mu")
    _assert_unbiased(jacobians[1], grad_log_scale, f"uncoupled {case} d/d log_scale")


def test_measure_valued_variances_with_and_without_coupling():
    # For f = sum(x^2) the rows of each coordinate have closed-form variances. With R, R'
    # Rayleigh (var (4 - pi) / 2, R^2 exponential of variance 4), M double-sided Maxwell
    # (M^2 chi-square with 3 dof: E M^2 = 3, E M^4 = 15), Z normal and U uniform:
    #   loc, coupled:         4 mu R / sqrt(2 pi)                    -> 16 mu^2 var(R) / (2 pi)
    #   loc, uncoupled:       (2 mu (R + R') + sigma (R^2 - R'^2)) / sqrt(2 pi)
    #                                                              -> (8 mu^2 var(R) + 8 sigma^2) / (2 pi)
    #   log_scale, coupled:   2 mu sigma M (1 - U) + sigma^2 M^2 (1 - U^2) -> 4 mu^2 sigma^2 + 4 sigma^4
    #   log_scale, uncoupled: 2 mu sigma (M - Z) + sigma^2 (M^2 - Z^2)     -> 16 mu^2 sigma^2 + 8 sigma^4
    # A sample variance of 2000 rows is within ~6% (one standard error) of its expectation
    # here; 25% allows ~4 standard errors.
    var_r = (4 - np.pi) / 2
    expected = {
        True: (16 * MU**2 * var_r / (2 * np.pi), 4 * MU**2 * SIGMA**2 + 4 * SIGMA**4),
        False: ((8 * MU**2 * var_r + 8 * SIGMA**2) / (2 * np.pi), 16 * MU**2 * SIGMA**2 + 8 * SIGMA**4),
    }
    for coupling, (loc_variance, log_scale_variance) in expected.items():
        cases = tuple(TRUTH) if coupling else UNCOUPLED_CASES
        loc_rows, log_scale_rows = _all_cases("measure_valued", coupling, cases)["square"]
        np.testing.assert_allclose(loc_rows.var(axis=0), loc_variance, rtol=0.25)
        np.testing.assert_allclose(log_scale_rows.var(axis=0), log_scale_variance, rtol=0.25)
    # Hence coupling lowers the log_scale variance everywhere, and the loc variance where
    # |mu| is small against sigma (the first coordinate).
    assert np.all(expected[True][1] < 0.6 * expected[False][1])
    assert expected[True][0][0] < 0.5 * expected[False][0][0]


def _samples(seed=0, n=N):
    return np.asarray(mc.multi_normal(*PARAMS).sample((n,), seed=jax.random.key(seed)), np.float64)


def test_pathwise_is_exact_for_a_linear_function():
    loc_rows, log_scale_rows = _all_cases("pathwise")["linear"]
    # d/d mu sum(W x) = W for every sample; d/d log_scale sum(W (mu + sigma eps)) = W (x - mu).
    np.testing.assert_allclose(loc_rows, np.broadcast_to(W, (N, 3)), rtol=1e-6)
    np.testing.assert_allclose(log_scale_rows, W * (_samples() - MU), rtol=1e-5, atol=1e-5)


def test_score_function_rows_follow_the_gaussian_score():
    loc_rows, log_scale_rows = _all_cases("score_function")["square"]
    x = _samples()
    f = np.sum(x**2, axis=1, keepdims=True)
    z = (x - MU) / SIGMA
    # grad_mu log p = (x - mu) / sigma^2, grad_log_sigma log p = z^2 - 1
    np.testing.assert_allclose(loc_rows, f * z / SIGMA, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(log_scale_rows, f * (z**2 - 1), rtol=1e-4, atol=1e-4)


def test_estimators_keep_the_shape_of_matrix_parameters():
    loc = jnp.arange(6.0).reshape(2, 3) / 6
    log_scale = jnp.full((2, 3), -0.5)
    key = jax.random.key(0)
    for estimator in ESTIMATORS.values():
        shapes = jax.eval_shape(
            lambda p, e=estimator: e(square, p, mc.multi_normal, key, 5), [loc, log_scale]
        )
        assert [s.shape for s in shapes] == [(5, 2, 3), (5, 2, 3)]
    # The delta method is exact for a quadratic: every row is the true gradient.
    jacobians, _ = _cv_jitted()(
        square,
        mc.control_delta_method,
        mc.score_function_jacobians,
        [loc, log_scale],
        mc.multi_normal,
        key,
        5,
    )
    np.testing.assert_allclose(jacobians[0], np.broadcast_to(2 * loc, (5, 2, 3)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        jacobians[1], np.broadcast_to(2 * jnp.exp(2 * log_scale), (5, 2, 3)), rtol=1e-5
    )


# Eager calls reuse the configuration of `_all_cases` (cosine, key 0, N samples): the compiled
# results are there, and the eager operations compile once for those shapes.


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_jit_equals_eager(name):
    eager = ESTIMATORS[name](cosine, PARAMS, mc.multi_normal, jax.random.key(0), N)
    for a, b in zip(eager, _all_cases(name)["cosine"]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_any_distribution_builder_for_score_function_and_pathwise():
    def builder(loc, log_scale):  # not `multi_normal` itself: the generic path
        return mc.multi_normal(loc, log_scale)

    for name in ("score_function", "pathwise"):
        ours = ESTIMATORS[name](cosine, PARAMS, builder, jax.random.key(0), N)
        for a, b in zip(ours, _all_cases(name)["cosine"]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_keys_and_seeds_give_the_same_samples():
    typed = mc.score_function_jacobians(cosine, PARAMS, mc.multi_normal, jax.random.key(0), N)
    for rng in (0, jax.random.PRNGKey(0)):
        other = mc.score_function_jacobians(cosine, PARAMS, mc.multi_normal, rng, N)
        for a, b in zip(typed, other):
            np.testing.assert_array_equal(a, b)


# Control variates.


@functools.cache
def _cv_jitted():
    # Static: function, control variate, estimator, dist_builder, num_samples, the coefficient flags.
    return jax.jit(mc.control_variates_jacobians, static_argnums=(0, 1, 2, 4, 6, 8, 9))


def _with_cv(control_variate, estimator, function, num_samples=N, state=None, estimate=False):
    """`control_variates_jacobians` on the samples of key 0 (those of `_all_cases`)."""
    key = jax.random.key(0)
    jacobians, new_state = _cv_jitted()(
        function, control_variate, estimator, PARAMS, mc.multi_normal, key, num_samples, state, estimate
    )
    return [np.asarray(j, np.float64) for j in jacobians], new_state


def test_delta_method_matches_its_taylor_expansion():
    h, expected_h, update = mc.control_delta_method(cosine)
    x = jnp.array([0.4, -0.9, 2.3])
    d = np.asarray(x - MU, np.float64)
    taylor = np.sum(np.cos(MU) - np.sin(MU) * d - 0.5 * np.cos(MU) * d**2)
    np.testing.assert_allclose(h(PARAMS, x), taylor, rtol=1e-5)
    # E h = sum(cos mu) - 1/2 sum(sigma^2 cos mu)
    np.testing.assert_allclose(expected_h(PARAMS, None), np.sum(np.cos(MU) * (1 - SIGMA**2 / 2)), rtol=1e-5)
    assert update(PARAMS, x[None], None) is None  # stateless
    # For a quadratic the expansion is the function itself.
    np.testing.assert_allclose(mc.control_delta_method(square).value(PARAMS, x), square(x), rtol=1e-6)


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_delta_method_removes_all_variance_for_a_quadratic(name):
    jacobians, state = _with_cv(mc.control_delta_method, ESTIMATORS[name], square, num_samples=200)
    assert state is None
    np.testing.assert_allclose(jacobians[0], np.broadcast_to(2 * MU, (200, 3)), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(jacobians[1], np.broadcast_to(2 * SIGMA**2, (200, 3)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case, estimate", [("cube", False), ("cube", True), ("exponential", False)])
def test_delta_method_lowers_score_function_variance_and_keeps_the_mean(case, estimate):
    function, grad_mu, grad_log_scale = TRUTH[case]
    plain = _all_cases("score_function")[case]  # on the same samples
    reduced, _ = _with_cv(mc.control_delta_method, mc.score_function_jacobians, function, estimate=estimate)
    _assert_unbiased(reduced[0], grad_mu, f"delta method {case} d/d mu")
    _assert_unbiased(reduced[1], grad_log_scale, f"delta method {case} d/d log_scale")
    for r, p in zip(reduced, plain):
        assert np.all(r.var(axis=0) < 0.5 * p.var(axis=0)), (r.var(axis=0), p.var(axis=0))


def test_baseline_lowers_score_function_variance_and_keeps_the_mean():
    # f = sum(x^2) + 10: the score function's rows carry 10 times the score, which the
    # baseline removes. "square" of `_all_cases` is the same estimator on the same samples
    # without the offset, i.e. with a perfect constant baseline of 10.
    state = mc.MovingAverageBaselineState(jnp.asarray(0.0), jnp.asarray(0, jnp.int32))
    reduced, state = _with_cv(
        mc.moving_avg_baseline, mc.score_function_jacobians, shifted_square, state=state
    )
    # With zero debiasing, the first update makes the baseline the batch mean of f; using it on
    # that same batch biases the gradient by a factor 1 - 1/N, far below a standard error.
    samples = mc.multi_normal(*PARAMS).sample((N,), seed=jax.random.key(0))
    np.testing.assert_allclose(state.value, jnp.mean(jax.vmap(shifted_square)(samples)), rtol=1e-5)
    assert int(state.count) == 1
    _assert_unbiased(reduced[0], 2 * MU, "baseline d/d mu")
    _assert_unbiased(reduced[1], 2 * SIGMA**2, "baseline d/d log_scale")
    # The rows without a baseline: those of sum(x^2) plus 10 times the score.
    x = np.asarray(samples, np.float64)
    z = (x - MU) / SIGMA
    scores = [z / SIGMA, z**2 - 1]
    for r, p, score in zip(reduced, _all_cases("score_function")["square"], scores):
        plain = p + 10.0 * score
        assert np.all(r.var(axis=0) < 0.7 * plain.var(axis=0)), (r.var(axis=0), plain.var(axis=0))


@pytest.mark.parametrize("name", ["pathwise", "measure_valued"])
def test_baseline_changes_nothing_for_pathwise_and_measure_valued(name):
    state = mc.MovingAverageBaselineState(jnp.asarray(3.0), jnp.asarray(4, jnp.int32))
    reduced, _ = _with_cv(mc.moving_avg_baseline, ESTIMATORS[name], cosine, state=state)
    for r, p in zip(reduced, _all_cases(name)["cosine"]):
        np.testing.assert_allclose(r, p, rtol=1e-5, atol=1e-5)


def test_control_variates_jit_equals_eager():
    # The configuration of the jitted baseline test above, run eagerly.
    state = mc.MovingAverageBaselineState(jnp.asarray(0.0), jnp.asarray(0, jnp.int32))
    jitted, jitted_state = _with_cv(
        mc.moving_avg_baseline, mc.score_function_jacobians, shifted_square, state=state
    )
    eager, eager_state = mc.control_variates_jacobians(
        shifted_square,
        mc.moving_avg_baseline,
        mc.score_function_jacobians,
        PARAMS,
        mc.multi_normal,
        0,
        N,
        state,
    )
    for a, b in zip(eager, jitted):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(eager_state.value, jitted_state.value, rtol=1e-6)
    assert int(eager_state.count) == int(jitted_state.count) == 1


# The moving average baseline's state, against its formulas.


def _batch(seed=0, n=64):
    return mc.multi_normal(*PARAMS).sample((n,), seed=jax.random.key(seed))


def _batch_mean(function, samples):
    return float(np.mean(np.asarray(jax.vmap(function)(samples), np.float64)))


def _reference_decay(decay, step, heuristic):
    return min(decay, (1.0 + step) / (10.0 + step)) if heuristic else decay


@pytest.mark.parametrize("heuristic", [False, True])
def test_baseline_without_debias_is_an_exponential_moving_average(heuristic):
    decay = 0.9
    h, expected_h, update = mc.moving_avg_baseline(
        linear, decay=decay, zero_debias=False, use_decay_early_training_heuristic=heuristic
    )
    value = 2.0
    for step in (0, 1, 3, 20):
        samples = _batch(step)
        state = update(PARAMS, samples, (jnp.asarray(value, jnp.float32), step))
        d = _reference_decay(decay, step, heuristic)  # 0.1, 2/11, 4/13, 0.9 with the heuristic
        np.testing.assert_allclose(state.value, d * value + (1 - d) * _batch_mean(linear, samples), rtol=1e-5)
        assert int(state.count) == step + 1
    # The baseline is the state's value, whatever the sample.
    assert float(h(PARAMS, jnp.ones(3), (jnp.asarray(2.5), 0))) == 2.5
    assert float(expected_h(PARAMS, (jnp.asarray(2.5), 0))) == 2.5


@pytest.mark.parametrize("heuristic", [False, True])
def test_zero_debiased_baseline_is_a_bias_corrected_average(heuristic):
    # Reference: an accumulator b started at 0, b <- d_i b + (1 - d_i) m_i, reported as
    # b / (1 - prod_i d_i) (Adam's bias correction), in float64.
    decay = 0.95
    cv = mc.moving_avg_baseline(
        cosine, decay=decay, zero_debias=True, use_decay_early_training_heuristic=heuristic
    )
    state, accumulator, product = cv.init_state(), 0.0, 1.0
    for step in range(8):
        samples = _batch(step)
        state = cv.update_state(PARAMS, samples, state)
        d = _reference_decay(decay, step, heuristic)
        accumulator = d * accumulator + (1 - d) * _batch_mean(cosine, samples)
        product *= d
        np.testing.assert_allclose(state.value, accumulator / (1 - product), rtol=1e-5)
        assert int(state.count) == step + 1


@pytest.mark.parametrize("count", [0, 1, 2, 5, 100, 169, 170, 171, 1000])
def test_zero_debiased_baseline_at_any_count(count):
    # With decay 0.95 the heuristic's ratio (1 + i) / (10 + i) passes 0.95 at i = 170.
    decay, value = 0.95, 1.25
    cv = mc.moving_avg_baseline(square, decay=decay)
    samples = _batch(count)
    state = cv.update_state(PARAMS, samples, (jnp.asarray(value), jnp.asarray(count, jnp.int32)))
    product = np.prod([_reference_decay(decay, k, True) for k in range(count)])  # decays so far
    d = _reference_decay(decay, count, True)
    past = d * (1 - product)  # the weight of the average so far
    expected = (past * value + (1 - d) * _batch_mean(square, samples)) / (past + 1 - d)
    np.testing.assert_allclose(state.value, expected, rtol=1e-5)


def test_zero_debiased_baseline_of_a_constant_is_that_constant():
    cv = mc.moving_avg_baseline(constant, decay=0.99, use_decay_early_training_heuristic=False)
    state = None  # starts at zero
    for step in range(5):
        state = cv.update_state(PARAMS, _batch(step), state)
        np.testing.assert_allclose(state.value, 0.7, rtol=1e-5)


def test_baseline_state_is_not_differentiated():
    cv = mc.moving_avg_baseline(square)

    def baseline_of(loc):
        samples = mc.multi_normal(loc, PARAMS[1]).sample((8,), seed=0)
        return cv.update_state(PARAMS, samples, None).value

    assert float(jnp.sum(jnp.abs(jax.grad(baseline_of)(PARAMS[0])))) == 0.0


# Bad input.


def _estimator_call(estimator, **overrides):
    arguments = {
        "function": square,
        "params": PARAMS,
        "dist_builder": mc.multi_normal,
        "rng": 0,
        "num_samples": 4,
    }
    arguments.update(overrides)
    return lambda: estimator(**arguments)


BAD_INPUTS = [
    ({"num_samples": 0}, ValueError, "Invalid num_samples: 0 (must be an integer >= 1)."),
    ({"num_samples": -3}, ValueError, "Invalid num_samples: -3 (must be an integer >= 1)."),
    ({"num_samples": 2.5}, ValueError, "Invalid num_samples: 2.5 (must be an integer >= 1)."),
    ({"num_samples": True}, ValueError, "Invalid num_samples: True (must be an integer >= 1)."),
    ({"params": {"loc": MU}}, TypeError, "Invalid params: a dict."),
    ({"params": PARAMS[0]}, TypeError, "Invalid params: a ArrayImpl."),
    ({"params": [MU]}, ValueError, "Invalid params: 1 arrays, but multi_normal takes two, [loc, log_scale]."),
    ({"params": [MU, LOG_SCALE, MU]}, ValueError, "Invalid params: 3 arrays, but multi_normal takes two"),
    (
        {"params": [MU, LOG_SCALE[:2]]},
        ValueError,
        "Invalid params: loc has shape (3,) and log_scale has shape (2,).",
    ),
    ({"params": [np.arange(3), LOG_SCALE]}, TypeError, "Invalid params[0]: dtype int"),
    ({"params": [MU, "wide"]}, TypeError, "Invalid params[1]"),
    ({"function": "square"}, TypeError, "Invalid function: 'square' of type str"),
    ({"function": lambda x: x}, ValueError, "Invalid function: it must return one number per sample"),
    ({"dist_builder": None}, TypeError, "Invalid dist_builder: None"),
]


@pytest.mark.parametrize("name", list(ESTIMATORS))
@pytest.mark.parametrize("overrides, error, message", BAD_INPUTS)
def test_bad_input_is_named(name, overrides, error, message):
    if name == "measure_valued" and "dist_builder" in overrides:
        error, message = ValueError, "Invalid dist_builder: None. measure_valued_jacobians is implemented for"
    with pytest.raises(error, match=re.escape(message)):
        _estimator_call(ESTIMATORS[name], **overrides)()


def test_traced_num_samples_is_explained():
    with pytest.raises(TypeError, match="num_samples must be a Python int, not a traced value"):
        jax.jit(mc.pathwise_jacobians, static_argnums=(0, 2))(square, PARAMS, mc.multi_normal, 0, 4)


def test_measure_valued_needs_the_gaussian():
    def builder(loc, log_scale):
        return mc.multi_normal(loc, log_scale)

    with pytest.raises(ValueError, match="Invalid dist_builder: .*builder.* implemented for the Gaussian"):
        mc.measure_valued_jacobians(square, PARAMS, builder, 0, 4)
    with pytest.raises(TypeError, match=re.escape("Invalid coupling: 'yes' (expected True or False).")):
        mc.measure_valued_jacobians(square, PARAMS, mc.multi_normal, 0, 4, coupling="yes")


def test_distribution_checks_its_parameters():
    expected = "Incompatible shapes for broadcasting: log_scale of shape (2,) and loc of shape (3,)"
    with pytest.raises(ValueError, match=re.escape(expected)):
        mc.multi_normal(MU, LOG_SCALE[:2])
    with pytest.raises(TypeError, match="needs a seed"):
        mc.multi_normal(MU, LOG_SCALE).sample((2,))


def test_control_variate_bad_input_is_named():
    def call(**overrides):
        arguments = {
            "function": square,
            "control_variate_from_function": mc.control_delta_method,
            "grad_estimator": mc.score_function_jacobians,
            "params": PARAMS,
            "dist_builder": mc.multi_normal,
            "rng": 0,
            "num_samples": 4,
        }
        arguments.update(overrides)
        return mc.control_variates_jacobians(**arguments)

    with pytest.raises(ValueError, match=re.escape("Invalid num_samples: 0 (must be an integer >= 1).")):
        call(num_samples=0)
    with pytest.raises(
        ValueError, match=re.escape("Invalid estimate_cv_coeffs_num_samples: 0 (must be an integer >= 1).")
    ):
        call(estimate_cv_coeffs=True, estimate_cv_coeffs_num_samples=0)
    with pytest.raises(
        TypeError, match="Invalid control_variate_from_function: it returned 3, not a control variate"
    ):
        call(control_variate_from_function=lambda f: 3)
    with pytest.raises(TypeError, match="Invalid grad_estimator"):
        call(grad_estimator="score")
    with pytest.raises(
        ValueError, match=re.escape("Invalid params: loc has shape (3,) and log_scale has shape (1,).")
    ):
        call(params=[MU, LOG_SCALE[:1]])
    with pytest.raises(
        TypeError, match=r"Invalid control_variate_state: 5\. moving_avg_baseline keeps a state"
    ):
        call(control_variate_from_function=mc.moving_avg_baseline, control_variate_state=5)
    with pytest.raises(
        ValueError, match=re.escape("Invalid decay: 1.0 (must be in [0, 1)) in MovingAverageBaseline.")
    ):
        mc.moving_avg_baseline(square, decay=1.0)
    with pytest.raises(TypeError, match="Invalid function: 3 of type int"):
        mc.control_delta_method(3)


@pytest.mark.parametrize("module", ["_distributions", "_estimators", "_control_variates"])
def test_docstring_examples(module):
    module = importlib.import_module(f"modopt.monte_carlo.{module}")
    result = doctest.testmod(
        module,
        extraglobs={"mc": mc, "jax": jax, "jnp": jnp},
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
    )
    assert result.attempted > 0 and result.failed == 0
