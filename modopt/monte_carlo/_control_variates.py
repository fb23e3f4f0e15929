r"""Control variates: lower-variance gradient estimates of `E_p f` from a correlated `h` of known mean.

With `h(x; theta)` whose expectation `E_p h` has a closed form,

    \nabla_\theta E_p f = \nabla_\theta E_p [f(x) - h(x; \theta)] + \nabla_\theta E_p h

and the first term is estimated in two parts: an estimator (score function, pathwise,
measure-valued) applied to `f - h` with `h`'s own parameters held fixed, minus
`E_p[\nabla_\theta h(x; \theta)]` at fixed samples. The more `h` follows `f`, the smaller
the variance; the mean is unchanged. `control_variates_jacobians` does this computation.

A control variate is an `AbstractControlVariate`: `value(params, sample, state)` is `h` at one
sample, `expected_value(params, state)` is `E_p h`, and `update_state(params, samples, state)`
returns the next state (a moving average keeps one). As in optax, a control variate unpacks
into these three functions: `h, expected_h, update_state = control_delta_method(f)`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp

from .._core.fields import PROBABILITY_EXCLUSIVE, as_key, hyperparameter, pretty, static, validate_hyperparameters
from .._util.numerics import safe_increment
from ._estimators import DistBuilder
from ._inputs import Function, check_callable, check_count, check_params, evaluate
from .._core.fields import Scalar

CvState = Any


class AbstractControlVariate(eqx.Module):
    """Base class of control variates `h(x; theta)` with a closed-form expectation under `p`.

    Concrete subclasses are final. They implement `value`, `expected_value` and (if they keep
    a state) `update_state` and `init_state`. Like optax's control variates, one unpacks
    into the triple `(value, expected_value, update_state)`.
    """

    function: Function = static()

    @abc.abstractmethod
    def value(self, params: list, sample: jax.Array, state: CvState = None) -> jax.Array:
        """`h(x; theta)` at one sample `x`, a scalar."""

    @abc.abstractmethod
    def expected_value(self, params: list, state: CvState = None) -> jax.Array:
        """`E_{p(x; theta)} h(x; theta)`, in closed form, a scalar."""

    def update_state(self, params: list, samples: jax.Array, state: CvState = None) -> CvState:
        """The state after seeing `samples` (a batch, axis 0). Stateless by default."""
        del params, samples
        return state

    def init_state(self) -> CvState:
        """The initial state (`None` for a stateless control variate)."""
        return None

    def __check_init__(self):
        check_callable("function", self.function, "a callable of one sample returning one float")
        validate_hyperparameters(self)

    def __iter__(self):
        return iter((self.value, self.expected_value, self.update_state))

    def __getitem__(self, index: int):
        return (self.value, self.expected_value, self.update_state)[index]

    def __len__(self):
        return 3

    def __repr__(self):
        return pretty(self)


def _flat_function(function: Function, shape: tuple[int, ...]) -> Function:
    return lambda flat: function(flat.reshape(shape))


class ControlDeltaMethod(AbstractControlVariate):
    r"""The delta method: `h` is the second-order Taylor expansion of `f` at the mean.

        h(x; mu) = f(mu) + (x - mu) . grad f(mu) + 1/2 (x - mu)^T H_f(mu) (x - mu)
        E_p h    = f(mu) + 1/2 sum_d sigma_d^2 H_f(mu)_dd

    for a Gaussian with mean `params[0]` and diagonal standard deviation `exp(params[1])`
    (`multi_normal`). `h` equals `f` for a quadratic `f`, which leaves no variance. It
    computes the full Hessian of `f` (size squared), and keeps no state.

    Args:
        function: `f`, one sample in, one float out; twice differentiable.

    Example:
        >>> h, expected_h, _ = mc.control_delta_method(lambda x: jnp.sum(x**2))
        >>> params = [jnp.array([1.0, 2.0]), jnp.zeros(2)]  # mean, log standard deviation
        >>> float(expected_h(params, None))  # E sum(x^2) = sum(mu^2 + sigma^2)
        7.0

    Reference: Paisley, Blei and Jordan, "Variational Bayesian Inference with Stochastic
    Search", ICML 2012, https://icml.cc/2012/papers/687.pdf
    """

    def value(self, params, sample, state=None):
        del state
        mean = jnp.asarray(params[0])
        f = _flat_function(self.function, mean.shape)
        flat_mean = mean.reshape(-1)
        centered = (jnp.asarray(sample) - mean).reshape(-1)
        gradient = jax.grad(f)(flat_mean)
        hessian = jax.hessian(f)(flat_mean)
        return f(flat_mean) + centered @ gradient + 0.5 * centered @ hessian @ centered

    def expected_value(self, params, state=None):
        del state
        mean = jnp.asarray(params[0])
        f = _flat_function(self.function, mean.shape)
        flat_mean = mean.reshape(-1)
        variance = jnp.exp(2 * jnp.asarray(params[1])).reshape(-1)
        curvature = jnp.diagonal(jax.hessian(f)(flat_mean))
        return f(flat_mean) + 0.5 * jnp.sum(variance * curvature)


control_delta_method = ControlDeltaMethod


class MovingAverageBaselineState(NamedTuple):
    """The state of `moving_avg_baseline`: the current baseline and the number of updates."""

    value: jax.Array
    count: jax.Array


def _early_decays(decay: jax.Array, count: jax.Array) -> jax.Array:
    """The decay of update number `count` with the early-training heuristic."""
    return jnp.minimum(decay, (1.0 + count) / (10.0 + count))


def _product_of_decays(decay: jax.Array, count: jax.Array, heuristic: bool) -> jax.Array:
    """The product of the decays of the updates `0, ..., count - 1`, in closed form.

    With the heuristic, update `k` decays by `min(decay, (1 + k) / (10 + k))`; the ratio grows
    with `k`, so it is the smaller one for the first `m` updates, `k < (10 decay - 1) / (1 - decay)`,
    and `prod_{k < m} (1 + k) / (10 + k) = m! 9! / (m + 9)! = prod_{j=1..9} j / (m + j)`.
    """
    if not heuristic:
        return decay**count
    switch = jnp.maximum(jnp.ceil((10.0 * decay - 1.0) / (1.0 - decay)), 0.0)  # inf for decay = 1
    early = jnp.minimum(count, switch)
    j = jnp.arange(1, 10, dtype=count.dtype)
    return jnp.prod(j / (early + j)) * decay ** (count - early)


class MovingAverageBaseline(AbstractControlVariate):
    r"""A baseline: `h` is a moving average of `f` over past batches, a constant in `x`.

    The state, a `MovingAverageBaselineState(value, count)` (or the pair), holds the baseline
    and the number of updates; `None` stands for `init_state()`, `(0.0, 0)`.
    `update_state(params, samples, state)` folds in the batch mean `m` of `f(samples)`:

        d     = min(decay, (1 + count) / (10 + count))  with the early-training heuristic,
                decay                                    without
        value <- d value + (1 - d) m

    With `zero_debias`, the value is rather that of an accumulator started at zero, divided
    by its total weight `1 - prod(d)` (the bias correction of Adam's moments): a weighted
    mean of the batch means seen, even early (from `count = 0` the initial value gets no
    weight). Updating from `(v, count)` treats `v` as that debiased mean after `count` updates.

    A baseline does not depend on `x` or `theta`, so it changes nothing for the pathwise
    and measure-valued estimators; for the score function it removes `E f` from `f`, which
    lowers the variance.

    Args:
        function: `f`, one sample in, one float out.
        decay: the decay rate of the moving average, in [0, 1).
        zero_debias: whether to correct the average for its start at zero.
        use_decay_early_training_heuristic: whether update `i` (from 0) decays by
            `min(decay, (1 + i) / (10 + i))` instead of `decay`, which follows `f` faster
            early in training.

    Example:
        >>> baseline = mc.moving_avg_baseline(lambda x: jnp.sum(x), decay=0.9)
        >>> params = [jnp.zeros(2), jnp.zeros(2)]
        >>> samples = jnp.array([[1.0, 1.0], [3.0, 3.0]])  # f = 2 and 6: a batch mean of 4
        >>> state = baseline.update_state(params, samples, baseline.init_state())
        >>> float(state.value), int(state.count)  # debiased: the first batch mean
        (4.0, 1)

    Note: optax's zero debiasing divided the stored value by `1 - d**(count + 1)` at every
    update, which compounds (with `decay=0.99` and no heuristic, the baseline of a constant
    `f` grew ~50x in two updates); modopt's agrees with it on the first update and stays an
    average after. Without `zero_debias` the two agree.
    """

    decay: Scalar = hyperparameter(0.99, check=PROBABILITY_EXCLUSIVE)
    zero_debias: bool = static(True)
    use_decay_early_training_heuristic: bool = static(True)

    def init_state(self) -> MovingAverageBaselineState:
        return MovingAverageBaselineState(jnp.zeros([]), jnp.zeros([], jnp.int32))

    def _state(self, state: CvState) -> MovingAverageBaselineState:
        if state is None:
            return self.init_state()
        try:
            value, count = state
        except (TypeError, ValueError):
            raise TypeError(
                f"Invalid control_variate_state: {state!r}. moving_avg_baseline keeps a state "
                f"(value, count), e.g. MovingAverageBaselineState(jnp.zeros([]), jnp.zeros([], jnp.int32)), "
                f"or None to start at zero."
            ) from None
        return MovingAverageBaselineState(jnp.asarray(value), jnp.asarray(count))

    def value(self, params, sample, state=None):
        del params, sample
        return self._state(state).value

    def expected_value(self, params, state=None):
        del params
        return self._state(state).value

    def update_state(self, params, samples, state=None):
        del params
        value, count = self._state(state)
        batch_mean = jnp.mean(evaluate(self.function, jax.lax.stop_gradient(samples)))
        dtype = jnp.result_type(value, batch_mean, float)
        value, batch_mean = value.astype(dtype), batch_mean.astype(dtype)
        decay = jnp.asarray(self.decay, dtype)
        steps = count.astype(dtype)
        heuristic = self.use_decay_early_training_heuristic
        current = _early_decays(decay, steps) if heuristic else decay
        if self.zero_debias:
            # The debiased accumulator `b / (1 - P)` weighs the past by `current * (1 - P)`
            # and the batch by `1 - current`, where `P` is the product of the past decays.
            past_weight = current * (1 - _product_of_decays(decay, steps, heuristic))
            new_value = (past_weight * value + (1 - current) * batch_mean) / (past_weight + (1 - current))
        else:
            new_value = current * value + (1 - current) * batch_mean
        return MovingAverageBaselineState(jax.lax.stop_gradient(new_value), safe_increment(count))


moving_avg_baseline = MovingAverageBaseline

ControlVariateFactory = Callable[[Function], Any]


def _control_variate(factory: ControlVariateFactory, function: Function):
    check_callable(
        "control_variate_from_function",
        factory,
        "a callable of the function returning a control variate, such as control_delta_method",
    )
    control_variate = factory(function)
    try:
        parts = tuple(control_variate)
    except TypeError:
        parts = ()
    if len(parts) != 3 or not all(callable(part) for part in parts):
        raise TypeError(
            f"Invalid control_variate_from_function: it returned {control_variate!r}, not a control "
            f"variate: an AbstractControlVariate, or a triple of functions (value, expected_value, "
            f"update_state) as control_delta_method(function) is."
        )
    return parts


def _frozen(params):
    return [jax.lax.stop_gradient(p) for p in params]


def estimate_control_variate_coefficients(
    function: Function,
    control_variate_from_function: ControlVariateFactory,
    grad_estimator: Callable[..., list],
    params: list,
    dist_builder: DistBuilder,
    rng: Any,
    num_samples: int,
    control_variate_state: CvState = None,
    eps: float = 1e-3,
) -> list[jax.Array]:
    r"""The variance-minimizing weight of the control variate, one scalar per entry of `params`.

    For the jacobians `J_f` of `f` and `J_h` of the control variate, both by `grad_estimator`
    on the same samples, the coefficient of a parameter is

        sum_k cov(J_f[:, k], J_h[:, k]) / (sum_k var(J_h[:, k]) + eps)

    over its elements `k`. It draws its own samples, from a key split off `rng`, so that
    using the coefficients on the samples of `rng` keeps the estimate unbiased. The state
    is not updated. Gradients do not flow through the coefficients.

    Args:
        function: the function `f` whose expectation is differentiated, as for
            `control_variates_jacobians`.
        control_variate_from_function: builds the control variate from `function`.
        grad_estimator: the jacobian estimator (`score_function_jacobians`, ...).
        params: the distribution's parameters, a list of arrays.
        dist_builder: builds the distribution from `params` (`multi_normal`).
        rng: the PRNG key whose split draws the fresh samples.
        num_samples: the number of fresh samples, a Python int >= 1.
        control_variate_state: the control variate's state, read but not updated.
        eps: added to the variance, >= 0, for a control variate of (near) zero variance.

    Returns:
        A list of scalars, one per entry of `params`.
    """
    if isinstance(eps, (int, float)) and not eps >= 0:
        raise ValueError(f"Invalid eps: {eps} (must be >= 0).")
    value, _, _ = _control_variate(control_variate_from_function, function)
    params = check_params(params, dist_builder)
    count = check_count("estimate_cv_coeffs_num_samples", num_samples)
    key, _ = jax.random.split(as_key(rng))
    frozen = _frozen(params)
    cv_jacobians = grad_estimator(
        lambda x: value(frozen, x, control_variate_state), params, dist_builder, key, count
    )
    f_jacobians = grad_estimator(function, params, dist_builder, key, count)

    def coefficient(cv_jacobian, f_jacobian):
        cv_centered = cv_jacobian - jnp.mean(cv_jacobian, axis=0)
        f_centered = f_jacobian - jnp.mean(f_jacobian, axis=0)
        covariance = jnp.sum(jnp.mean(cv_centered * f_centered, axis=0))
        variance = jnp.sum(jnp.mean(jnp.square(cv_centered), axis=0))
        return jax.lax.stop_gradient(covariance / (variance + eps))

    return [coefficient(cv, f) for cv, f in zip(cv_jacobians, f_jacobians)]


def control_variates_jacobians(
    function: Function,
    control_variate_from_function: ControlVariateFactory,
    grad_estimator: Callable[..., list],
    params: list,
    dist_builder: DistBuilder,
    rng: Any,
    num_samples: int,
    control_variate_state: CvState = None,
    estimate_cv_coeffs: bool = False,
    estimate_cv_coeffs_num_samples: int = 20,
) -> tuple[list[jax.Array], CvState]:
    r"""Gradient estimates of `E_p f` with a control variate, per sample.

    With `h = control_variate_from_function(function)` and coefficient `c` (1, or estimated
    per parameter), row `i` of the jacobian of each parameter is

        J_f[i] - c J_h[i] - c grad_theta h(x_i; theta) + c grad_theta E_p h

    where `J_f` and `J_h` are `grad_estimator`'s rows for `f` and for `h` with its parameters
    held fixed, both on the samples of `rng`, and `grad_theta h` is taken at the fixed
    sample `x_i`. Each row is an estimate of the gradient, as from `grad_estimator` alone:
    the means agree, the variance is lower when `h` follows `f`.

    The state is updated once, with the samples of `rng`, before anything else uses it: the
    updated state defines `h` (so a baseline includes the current batch, a bias of order
    `1 / num_samples`) and the coefficients, which are estimated on fresh samples. (optax's
    code estimated the coefficients with the state passed in, against its documentation.)

    Args:
        function: `f`, one sample in, one float out.
        control_variate_from_function: builds the control variate from `function`, e.g.
            `control_delta_method` or `functools.partial(moving_avg_baseline, decay=0.9)`.
        grad_estimator: `score_function_jacobians`, `pathwise_jacobians` or
            `measure_valued_jacobians` (or one with their signature). A baseline changes
            nothing for the last two.
        params: a list of arrays, the arguments of `dist_builder`.
        dist_builder: builds the distribution from `*params`, such as `multi_normal`.
        rng: a PRNG key or an integer seed.
        num_samples: the number of samples, a Python int >= 1.
        control_variate_state: the control variate's state (`None` to start afresh).
        estimate_cv_coeffs: whether to weigh the control variate by
            `estimate_control_variate_coefficients` instead of 1.
        estimate_cv_coeffs_num_samples: the number of fresh samples for those coefficients.

    Returns:
        `(jacobians, state)`: a list with one array per entry of `params`, of shape
        `(num_samples, *param.shape)`, and the updated control variate state.

    Example:
        >>> def f(x):
        ...     return jnp.sum(x**2) + 10.0
        >>> @jax.jit
        ... def estimate(params, key, state):
        ...     return mc.control_variates_jacobians(
        ...         f, mc.moving_avg_baseline, mc.score_function_jacobians, params,
        ...         mc.multi_normal, key, 100, control_variate_state=state)
        >>> params, state = [jnp.ones(3), jnp.zeros(3)], mc.moving_avg_baseline(f).init_state()
        >>> for step in range(3):
        ...     jacobians, state = estimate(params, jax.random.key(step), state)
        >>> [j.shape for j in jacobians], int(state.count)
        ([(100, 3), (100, 3)], 3)
        >>> grads = [j.mean(axis=0) for j in jacobians]  # estimates of (2 mu, 2 sigma^2)
    """
    value, expected_value, update_state = _control_variate(control_variate_from_function, function)
    check_callable("grad_estimator", grad_estimator, "a gradient estimator such as score_function_jacobians")
    check_callable("dist_builder", dist_builder, "a callable building a distribution, such as multi_normal")
    params = check_params(params, dist_builder)
    count = check_count("num_samples", num_samples)
    key = as_key(rng)
    if estimate_cv_coeffs:  # checked before any work
        check_count("estimate_cv_coeffs_num_samples", estimate_cv_coeffs_num_samples)

    f_jacobians = grad_estimator(function, params, dist_builder, key, count)
    # The same key, hence the same samples, as `grad_estimator` draws.
    samples = jax.lax.stop_gradient(dist_builder(*params).sample((count,), seed=key))
    state = update_state(params, samples, control_variate_state)
    if estimate_cv_coeffs:
        coefficients = estimate_control_variate_coefficients(
            function,
            control_variate_from_function,
            grad_estimator,
            params,
            dist_builder,
            key,
            estimate_cv_coeffs_num_samples,
            state,
        )
    else:
        coefficients = [1.0] * len(params)

    frozen = _frozen(params)
    cv_jacobians = grad_estimator(lambda x: value(frozen, x, state), params, dist_builder, key, count)
    cv_direct_grads = jax.vmap(jax.grad(lambda theta, x: value(theta, x, state)), in_axes=(None, 0))(
        params, samples
    )
    expected_grads = jax.grad(lambda theta: expected_value(theta, state))(params)

    jacobians = []
    for index, param in enumerate(params):
        c = coefficients[index]
        jacobian = f_jacobians[index] - c * (
            cv_jacobians[index] + cv_direct_grads[index] - expected_grads[index]
        )
        if jacobian.shape != (count, *param.shape):
            raise ValueError(
                f"Invalid grad_estimator: for params[{index}] of shape {param.shape} it returned "
                f"jacobians of shape {f_jacobians[index].shape}, not (num_samples, *param.shape) = "
                f"{(count, *param.shape)}."
            )
        jacobians.append(jacobian)
    return jacobians, state
