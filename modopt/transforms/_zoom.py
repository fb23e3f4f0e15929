"""The zoom line search: a step size meeting the strong Wolfe conditions (Nocedal & Wright)."""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from .._core.base import AbstractTransform
from .._core.extra_args import ExtraArg
from .._core.fields import NONNEGATIVE, POSITIVE, PROBABILITY_EXCLUSIVE, choice, hyperparameter, static
from .._util.trees import cast_like, select
from ._linesearch import AT_LEAST_ONE, READS_LOSS, check_count, inner, moved, read_loss, scaled, value_dtype
from .._core.fields import Scalar

STRATEGIES = ("one", "keep")


class ZoomLinesearchInfo(NamedTuple):
    """What the last zoom line search did, for debugging.

    A positive `decrease_error` means no step size with sufficient decrease was found (the
    loss may go up); a positive `curvature_error` only means the slope condition was not met
    (often because `max_learning_rate` is too small), which is mostly harmless.
    """

    num_linesearch_steps: jax.Array  # int32: objective evaluations made
    decrease_error: jax.Array  # by how much the accepted step misses sufficient decrease (0: it meets it)
    curvature_error: jax.Array  # by how much it misses the curvature condition (0: it meets it)


class ScaleByZoomLinesearchState(NamedTuple):
    """The zoom line search's last step size, and the loss and gradient where it led."""

    learning_rate: jax.Array  # the step size of the last update
    value: jax.Array  # the loss at the parameters the last step reached
    grad: Any  # the gradient there, like the params
    info: ZoomLinesearchInfo


class _Zoom(NamedTuple):
    """The carry of the zoom loop: the last point tried, the bracket, and the best safe point.

    `low` and `high` bracket a good step size; `low` has the lower loss (it is not always the
    smaller step). `cubic_ref` is a third point for cubic interpolation. The "safe" point is
    the best one with sufficient decrease, taken if the curvature condition is never met.
    """

    count: jax.Array
    stepsize: jax.Array
    value: jax.Array
    grad: Any
    slope: jax.Array
    decrease_error: jax.Array
    curvature_error: jax.Array
    interval_found: jax.Array
    done: jax.Array
    failed: jax.Array
    low: jax.Array
    value_low: jax.Array
    slope_low: jax.Array
    high: jax.Array
    value_high: jax.Array
    slope_high: jax.Array
    cubic_ref: jax.Array
    value_cubic_ref: jax.Array
    safe_stepsize: jax.Array
    safe_value: jax.Array
    safe_grad: Any


class ScaleByZoomLinesearch(AbstractTransform):
    r"""Scales updates by a step size satisfying sufficient decrease and small curvature.

    With `w` the parameters, `u` the incoming updates (a descent direction), `f` the loss and
    `phi(eta) = f(w + eta u)`, it looks for `eta` with

        phi(eta) <= phi(0) + slope_rtol * eta * phi'(0) + tol       (sufficient decrease)
        |phi'(eta)| <= curv_rtol * |phi'(0)| + tol                   (small curvature)

    (the strong Wolfe conditions), and outputs `eta u`. Near a minimum, where the first
    condition cannot resolve the loss's change in floating point, it also accepts Hager and
    Zhang's approximate condition `phi'(eta) <= (2 slope_rtol - 1) phi'(0)` for steps whose
    loss is at most `phi(0) + approx_dec_rtol * |phi(0)|` (`approx_dec_rtol=None`: never).

    The search first grows the step from a guess (1, or the previous step size) by
    `increase_factor` until it brackets a good step, then shrinks the bracket, trying cubic or
    quadratic interpolants of the loss (bisection when they fall too near an end). Each try
    evaluates the loss and its gradient: at most `max_linesearch_steps` of them. If the
    conditions are not both met, it takes the best step with sufficient decrease seen (once
    the bracket is narrower than `stepsize_precision`, or at the last try). The loss and
    gradient at the accepted point are kept in the state.

    Pass the loss `value`, the gradient `grad` and the objective `value_fn` (a function of the
    params) to `update`; other extra keyword arguments go to `value_fn`.

    Args:
        max_linesearch_steps: the most loss evaluations per update (static), >= 1.
        max_learning_rate: the largest step size, > 0, or `None` for no bound.
        tol: slack of both conditions, >= 0.
        increase_factor: the factor growing the step while bracketing, >= 1.
        slope_rtol: the fraction of the linear decrease required, in [0, 1).
        curv_rtol: the fraction of the initial slope allowed at the step, >= 0 (`inf` drops
            the curvature condition: a backtracking search with interpolation).
        approx_dec_rtol: the relative loss increase within which the approximate decrease
            condition applies, >= 0, or `None`.
        stepsize_precision: the bracket width below which a step with sufficient decrease is
            accepted, >= 0.
        initial_guess_strategy: `"one"` (start from 1, for Newton-like directions such as
            L-BFGS's) or `"keep"` (start from the previous step size, for gradient directions).
        verbose: print a diagnostic when the conditions are not met (static).

    Example:
        >>> tx = modopt.chain(modopt.scale(-1.0), modopt.scale_by_zoom_linesearch(15))
        >>> value, grad = jax.value_and_grad(loss)(params)
        >>> updates, state = tx.update(grad, state, params, value=value, grad=grad, value_fn=loss)

    References: Nocedal & Wright, Numerical Optimization, 1999 (Algorithms 3.5 and 3.6),
    https://doi.org/10.1007/978-0-387-40065-5; Hager & Zhang, 2006, Algorithm 851: CG_DESCENT,
    https://doi.org/10.1145/1132973.1132979
    """

    extra_args_spec: ClassVar[tuple[ExtraArg, ...]] = READS_LOSS

    max_linesearch_steps: int = static()
    max_learning_rate: Scalar | None = hyperparameter(None, check=POSITIVE)
    tol: Scalar = hyperparameter(0.0, check=NONNEGATIVE)
    increase_factor: Scalar = hyperparameter(2.0, check=AT_LEAST_ONE)
    slope_rtol: Scalar = hyperparameter(1e-4, check=PROBABILITY_EXCLUSIVE)
    curv_rtol: Scalar = hyperparameter(0.9, check=NONNEGATIVE)
    approx_dec_rtol: Scalar | None = hyperparameter(1e-6, check=NONNEGATIVE, optional=True)
    stepsize_precision: Scalar = hyperparameter(1e-5, check=NONNEGATIVE)
    initial_guess_strategy: str = choice("keep", STRATEGIES)
    verbose: bool = static(default=False)

    def __check_init__(self):
        check_count(self, "max_linesearch_steps", self.max_linesearch_steps, 1)

    def init(self, params):
        dtype = value_dtype(params)
        return ScaleByZoomLinesearchState(
            learning_rate=jnp.asarray(1.0, dtype),
            value=jnp.asarray(jnp.inf, dtype),
            grad=jax.tree_util.tree_map(jnp.zeros_like, params),
            info=ZoomLinesearchInfo(jnp.zeros([], jnp.int32), _inf(), _inf()),
        )

    # ---- the two conditions ----------------------------------------------------------

    def _decrease_error(self, stepsize, value, slope, value_init, slope_init):
        """How far `stepsize` is from sufficient decrease (0 when met, inf for a NaN loss)."""
        error = value - value_init - self.slope_rtol * stepsize * slope_init
        if self.approx_dec_rtol is not None:
            # Hager & Zhang's approximate condition (their eq. 23), used only for steps whose
            # loss has not risen by more than `approx_dec_rtol` of the initial loss (eq. 26-27).
            approximate = slope - (2 * self.slope_rtol - 1.0) * slope_init
            rise = value - value_init - self.approx_dec_rtol * jnp.abs(value_init)
            error = jnp.minimum(jnp.maximum(approximate, rise), error)
        error = jnp.maximum(error, 0.0)
        return jnp.where(jnp.isnan(error), jnp.inf, error)

    def _curvature_error(self, slope, slope_init):
        """How far a step with slope `slope` is from small curvature (0 when met)."""
        error = jnp.maximum(jnp.abs(slope) - self.curv_rtol * jnp.abs(slope_init), 0.0)
        return jnp.where(jnp.isnan(error), jnp.inf, error)

    # ---- one try ---------------------------------------------------------------------

    def _bracketing(self, s: _Zoom, guess):
        """Phase 1 (N&W Algorithm 3.5): the next step size and where it sits in the bracket."""
        trial = jnp.where(s.count == 0, guess, self.increase_factor * s.stepsize)
        at_max = jnp.asarray(False)
        if self.max_learning_rate is not None:
            at_max = trial >= self.max_learning_rate
            trial = jnp.minimum(trial, self.max_learning_rate)
        return trial, at_max

    def _zooming(self, s: _Zoom):
        """Phase 2 (N&W Algorithm 3.6): an interpolated step size inside the bracket."""
        width = jnp.abs(s.high - s.low)
        left, right = jnp.minimum(s.high, s.low), jnp.maximum(s.high, s.low)
        cubic = _cubic_minimizer(
            s.low, s.value_low, s.slope_low, s.high, s.value_high, s.cubic_ref, s.value_cubic_ref
        )
        use_cubic = (cubic > left + 0.2 * width) & (cubic < right - 0.2 * width)
        quadratic = _quadratic_minimizer(s.low, s.value_low, s.slope_low, s.high, s.value_high)
        use_quadratic = ~use_cubic & (quadratic > left + 0.1 * width) & (quadratic < right - 0.1 * width)
        use_midpoint = ~use_cubic & ~use_quadratic
        trial = jnp.where(use_cubic, cubic, s.cubic_ref)
        trial = jnp.where(use_quadratic, quadratic, trial)
        trial = jnp.where(use_midpoint, (s.low + s.high) / 2.0, trial)
        return trial, width <= self.stepsize_precision

    def _step(self, s: _Zoom, *, objective, params, updates, guess, value_init, slope_init) -> _Zoom:
        zooming = s.interval_found
        bracket_trial, at_max = self._bracketing(s, guess)
        zoom_trial, too_narrow = self._zooming(s)
        trial = jnp.where(zooming, zoom_trial, bracket_trial)

        value, grad = jax.value_and_grad(objective)(moved(params, trial, updates))
        slope = inner(grad, updates)
        decrease_error = self._decrease_error(trial, value, slope, value_init, slope_init)
        curvature_error = self._curvature_error(slope, slope_init)
        good = jnp.maximum(decrease_error, curvature_error) <= self.tol
        sufficient = decrease_error <= self.tol
        last_try = s.count + 1 >= self.max_linesearch_steps
        new = (trial, value, slope)

        # Phase 1: the trial either closes a bracket with the previous point, or grows on.
        overshot = (decrease_error > 0.0) | ((value >= s.value) & (s.count > 0))
        uphill = (slope >= 0.0) & ~overshot  # the slope turned: the minimum lies behind
        previous = (s.stepsize, s.value, s.slope)
        b_low = _where(uphill, new, previous)
        b_high = _where(uphill, previous, new)
        b_found = overshot | uphill | good
        b_done = good | (at_max & ~b_found)  # the largest step is still descending: take it
        b_safe = sufficient

        # Phase 2: the trial replaces an end of the bracket.
        low, high = (s.low, s.value_low, s.slope_low), (s.high, s.value_high, s.slope_high)
        replaces_high = (decrease_error > 0.0) | (value >= s.value_low)
        low_becomes_high = (slope * (s.high - s.low) >= 0.0) & ~replaces_high
        z_high = _where(low_becomes_high, low, _where(replaces_high, new, high))
        z_low = _where(replaces_high, low, new)
        z_cubic_ref = _where(replaces_high | low_becomes_high, high[:2], low[:2])
        z_safe = sufficient & (value < s.safe_value)

        take_safe = jnp.where(zooming, z_safe, b_safe)
        safe_stepsize = jnp.where(take_safe, trial, s.safe_stepsize)
        safe_value = jnp.where(take_safe, value, s.safe_value)
        safe_grad = select(take_safe, grad, s.safe_grad)
        z_done = good
        z_failed = (last_try | (too_narrow & (safe_stepsize > 0.0))) & ~z_done
        b_failed = last_try & ~b_done
        low = _where(zooming, z_low, b_low)
        high = _where(zooming, z_high, b_high)
        cubic_ref = _where(zooming, z_cubic_ref, b_low[:2])
        done = jnp.where(zooming, z_done, b_done)
        failed = jnp.where(zooming, z_failed, b_failed)

        # Giving up: fall back on the best step with sufficient decrease, if any; also when the
        # last loss is not finite (the safe point is then the start, a step of 0).
        fall_back = failed & ((safe_stepsize > 0.0) | jnp.isinf(decrease_error))
        result = _Zoom(
            count=s.count + 1,
            stepsize=jnp.where(fall_back, safe_stepsize, trial),
            value=jnp.where(fall_back, safe_value, value),
            grad=select(fall_back, safe_grad, grad),
            slope=slope,
            decrease_error=decrease_error,
            curvature_error=curvature_error,
            interval_found=zooming | b_found,
            done=done,
            failed=failed,
            low=low[0],
            value_low=low[1],
            slope_low=low[2],
            high=high[0],
            value_high=high[1],
            slope_high=high[2],
            cubic_ref=cubic_ref[0],
            value_cubic_ref=cubic_ref[1],
            safe_stepsize=safe_stepsize,
            safe_value=safe_value,
            safe_grad=safe_grad,
        )
        return cast_like(result, s)

    # ---- the transform ---------------------------------------------------------------

    def update(self, updates, state, params=None, **extra_args):
        value, grad, objective = read_loss(extra_args, self, params)
        dtype = value_dtype(params)
        guess = jnp.asarray(1.0) if self.initial_guess_strategy == "one" else state.learning_rate
        value = jnp.asarray(value)
        slope = inner(updates, grad)  # the derivative of eta -> f(w + eta u) at 0
        zero, inf, false = jnp.asarray(0.0), jnp.asarray(jnp.inf), jnp.asarray(False)
        start = _Zoom(
            count=jnp.zeros([], jnp.int32),
            stepsize=jnp.asarray(0.0, dtype),
            value=value.astype(dtype),
            grad=grad,
            slope=slope,
            decrease_error=inf,
            curvature_error=inf,
            interval_found=false,
            done=false,
            failed=false,
            low=zero,
            value_low=value,
            slope_low=slope,
            high=zero,
            value_high=value,
            slope_high=slope,
            cubic_ref=zero,
            value_cubic_ref=value,
            safe_stepsize=zero,
            safe_value=value,
            safe_grad=grad,
        )

        def step(s):
            return self._step(
                s,
                objective=objective,
                params=params,
                updates=updates,
                guess=guess,
                value_init=value,
                slope_init=slope,
            )

        found = jax.lax.while_loop(lambda s: ~(s.done | s.failed), step, start)
        if self.verbose:
            self._report(found, value, slope)
        new_state = ScaleByZoomLinesearchState(
            learning_rate=found.stepsize,
            value=found.value,
            grad=found.grad,
            info=ZoomLinesearchInfo(found.count, found.decrease_error, found.curvature_error),
        )
        return scaled(found.stepsize, updates), cast_like(new_state, state)

    def _report(self, found: _Zoom, value_init, slope_init) -> None:
        """Prints why the search ended without meeting both conditions (for `verbose=True`)."""
        message = (
            "scale_by_zoom_linesearch: took step size {stepsize} (loss {value_init}, slope {slope_init}), "
            "decrease error {decrease}, curvature error {curvature}. "
        )
        hint = jnp.where(
            slope_init >= 0,
            1,
            jnp.where(jnp.isinf(found.decrease_error), 2, jnp.where(found.decrease_error > 0, 3, 4)),
        )
        # Also when the search stopped at `max_learning_rate` with the loss still going down: it
        # took that step without meeting the curvature condition.
        unmet = found.failed | (jnp.maximum(found.decrease_error, found.curvature_error) > self.tol)
        jax.lax.cond(
            unmet,
            lambda: jax.debug.print(
                message
                + "Hint {hint}: 1 = the updates are not a descent direction, 2 = the loss is not finite "
                "along them (no step taken), 3 = no step with sufficient decrease (try more steps or x64), "
                "4 = the curvature condition was not met (try a larger max_learning_rate).",
                stepsize=found.stepsize,
                value_init=value_init,
                slope_init=slope_init,
                decrease=found.decrease_error,
                curvature=found.curvature_error,
                hint=hint,
                ordered=True,
            ),
            lambda: None,
        )


def _inf() -> jax.Array:
    """`inf` in the default float dtype, strongly typed (a state leaf keeps its type across steps)."""
    return jnp.asarray(jnp.inf, jnp.result_type(float))


def _where(condition, on_true: tuple, on_false: tuple) -> tuple:
    """Selects between two tuples of scalars."""
    return tuple(jnp.where(condition, a, b) for a, b in zip(on_true, on_false))


def _cubic_minimizer(a, fa, fpa, b, fb, c, fc):
    """The stationary point of the cubic through `(a, fa)`, `(b, fb)`, `(c, fc)` with slope `fpa` at `a`.

    NaN when the cubic has none (the caller then falls back on another point).
    """
    db, dc = b - a, c - a
    denominator = (db * dc) ** 2 * (db - dc)
    basis = jnp.array([[dc**2, -(db**2)], [-(dc**3), db**3]])
    residuals = jnp.array([fb - fa - fpa * db, fc - fa - fpa * dc])
    cubic, square = jnp.dot(basis, residuals, precision=jax.lax.Precision.HIGHEST) / denominator
    return a + (-square + jnp.sqrt(square * square - 3.0 * cubic * fpa)) / (3.0 * cubic)


def _quadratic_minimizer(a, fa, fpa, b, fb):
    """The stationary point of the parabola through `(a, fa)`, `(b, fb)` with slope `fpa` at `a`."""
    db = b - a
    curvature = (fb - fa - fpa * db) / (db**2)
    return a - fpa / (2.0 * curvature)


scale_by_zoom_linesearch = ScaleByZoomLinesearch
