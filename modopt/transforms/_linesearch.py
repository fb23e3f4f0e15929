"""Line searches: what they share, and the backtracking (Armijo) line search.

A line search scales the incoming direction `u` by a step size `eta` chosen by evaluating the
objective along `w + eta u`. It reads three extra arguments of `update`: the loss `value` at
the current parameters `w`, its gradient `grad` there, and the objective itself, `value_fn`,
a function of the parameters. Through `Optimizer.step`, `value_fn` takes the model and `grad`
is shaped like it, as the loss and `grads` are. The zoom line search lives in `_zoom.py`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._core.base import AbstractTransform, require_params
from .._core.checks import _first_difference as first_difference
from .._core.extra_args import ExtraArg, extra_arg
from .._core.fields import NONNEGATIVE, POSITIVE, PROBABILITY_EXCLUSIVE, Check, hyperparameter, interval, static
from .._util.trees import cast_like, is_none, zeros_like
from .._core.fields import Scalar

READS_LOSS = (
    ExtraArg("value", "the loss at the current parameters"),
    ExtraArg("grad", "the gradient of the loss at the current parameters", like_params=True),
    ExtraArg("value_fn", "the loss as a function of the parameters", of_params=True),
)
# Names a line search reads itself; any other extra argument is meant for `value_fn`.
_OWN = frozenset(spec.name for spec in READS_LOSS)
AT_LEAST_ONE = Check(">= 1", lambda v: bool((v >= 1).all()))


def inner(a: Any, b: Any, conjugate: bool = False) -> jax.Array:
    """`Re sum(a * b)` (`Re sum(conj(a) * b)` with `conjugate=True`) over the leaves of two trees.

    Each leaf contributes a full contraction at the highest matmul precision, and the leaves
    are summed in order starting from 0, so the value is the same on every backend.
    """

    def term(x, y):
        x, y = jnp.asarray(x), jnp.asarray(y)
        if conjugate and jnp.iscomplexobj(x):
            x = jnp.conj(x)
        return jnp.tensordot(x, y, x.ndim, precision=jax.lax.Precision.HIGHEST)

    total = 0
    for t in jax.tree_util.tree_leaves(jax.tree_util.tree_map(term, a, b)):
        total = total + t
    return jnp.real(total)


def moved(params: Any, step_size: Any, direction: Any) -> Any:
    """`params + step_size * direction`, leaf by leaf (`None` leaves stay `None`)."""
    step_size = jnp.asarray(step_size)
    return jax.tree_util.tree_map(
        lambda p, d: None if p is None else p + step_size * d, params, direction, is_leaf=is_none
    )


def scaled(step_size: Any, tree: Any) -> Any:
    """`step_size * tree`, leaf by leaf."""
    return jax.tree_util.tree_map(lambda x: step_size * x, tree)


def value_dtype(params: Any) -> Any:
    """The real dtype of the loss bookkeeping: that of the first parameter (its real part)."""
    leaves = jax.tree_util.tree_leaves(params)
    if not leaves:
        raise ValueError("A line search needs at least one parameter array.")
    return jnp.real(jnp.empty((), jnp.result_type(leaves[0]))).dtype


def read_loss(extra_args: dict[str, Any], owner: Any, params: Any) -> tuple[Any, Any, Callable[[Any], Any]]:
    """`(value, grad, objective)` from `update`'s extra arguments.

    `objective(params)` is `value_fn` with the remaining extra arguments (data, say) passed as
    the keywords it takes: all of them if it takes `**kwargs`, else those it names. A remaining
    argument it cannot take is a `TypeError`, since it would be silently dropped.
    """
    require_params(params, owner)
    value = extra_arg(extra_args, "value", owner)
    grad = extra_arg(extra_args, "grad", owner)
    value_fn = extra_arg(extra_args, "value_fn", owner)
    if not callable(value_fn):
        raise TypeError(
            f"{type(owner).__name__}.update: `value_fn` must be the loss as a function of the parameters, "
            f"got {type(value_fn).__name__}."
        )
    _check_like_params(grad, params, "grad", owner)
    rest = {k: v for k, v in extra_args.items() if k not in _OWN}
    try:
        parameters = inspect.signature(value_fn).parameters.values()
    except (TypeError, ValueError):
        parameters = ()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        taken = rest
    else:
        names = {p.name for p in parameters}
        taken = {k: v for k, v in rest.items() if k in names}
        unused = sorted(set(rest) - set(taken))
        if unused:
            raise TypeError(
                f"Unexpected keyword arguments for {type(owner).__name__}.update: "
                f"{', '.join(f'`{k}`' for k in unused)}, which `value_fn` does not take. Extra arguments "
                "other than `value`, `grad` and `value_fn` are passed to `value_fn` by keyword."
            )
    return value, grad, lambda p: value_fn(p, **taken)


def _check_like_params(tree: Any, params: Any, name: str, owner: Any) -> None:
    """Raises `ValueError` naming the first path where `tree` is not shaped like `params`."""
    where = f"{type(owner).__name__}.update"
    if jax.tree_util.tree_structure(tree) != jax.tree_util.tree_structure(params):
        raise ValueError(
            f"{where}: `{name}` does not have the structure of the params: found "
            f"{first_difference(params, tree)}. Pass the gradient of `value_fn` at the current params."
        )
    for (path, p), t in zip(jax.tree_util.tree_flatten_with_path(params)[0], jax.tree_util.tree_leaves(tree)):
        if jnp.shape(t) != jnp.shape(p):
            raise ValueError(
                f"{where}: `{name}` at {jax.tree_util.keystr(path)} has shape {jnp.shape(t)}, but the "
                f"parameter has shape {jnp.shape(p)}."
            )


def check_count(owner: Any, name: str, value: Any, least: int) -> None:
    """Raises the hyperparameter error for a static integer below `least` (or not an integer)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < least:
        raise ValueError(
            f"Invalid {name}: {value!r} (must be an integer >= {least}) in {type(owner).__name__}."
        )


# ---- backtracking ------------------------------------------------------------------------


class BacktrackingLinesearchInfo(NamedTuple):
    """What the last backtracking line search did, for debugging."""

    num_linesearch_steps: jax.Array  # int32: objective evaluations made
    decrease_error: jax.Array  # how far the accepted step misses sufficient decrease (0: it meets it)


class ScaleByBacktrackingLinesearchState(NamedTuple):
    """The backtracking line search's last step size, loss and (optionally) gradient."""

    learning_rate: jax.Array  # the step size of the last update
    value: jax.Array  # the loss at the parameters the last step reached
    grad: Any  # the gradient there (like the params) with `store_grad=True`, else None
    info: BacktrackingLinesearchInfo


class _Backtrack(NamedTuple):
    """The carry of the backtracking loop."""

    learning_rate: jax.Array
    value: jax.Array
    decrease_error: jax.Array
    steps: jax.Array


class ScaleByBacktrackingLinesearch(AbstractTransform):
    r"""Scales updates by a step size found by backtracking until the loss decreases enough.

    With `w` the parameters, `u` the incoming updates (a descent direction) and `g` the
    gradient at `w`, it takes `eta` from `min(increase_factor * eta_prev, max_learning_rate)`
    and multiplies it by `decrease_factor` until the sufficient-decrease (Armijo) condition

        f(w + eta u) <= (1 + rtol) f(w) + eta * slope_rtol * <u, g> + atol

    holds, or `max_backtracking_steps` reductions were tried. The output is `eta u`; a step
    whose loss is NaN or infinite gives `eta = 0`. Pass the loss `value`, the gradient `grad`
    and the objective `value_fn` (a function of the params) to `update`; other extra keyword
    arguments go to `value_fn`. The updates must be a descent direction (`<u, g> < 0`), e.g.
    after `scale(-1)`: transforms chained after the line search need not be.

    Args:
        max_backtracking_steps: the most step-size reductions per update (static), >= 0.
        slope_rtol: the fraction of the linear decrease required, in [0, 1).
        decrease_factor: the factor shrinking the step size, in (0, 1).
        increase_factor: the factor growing the previous step size into the first guess,
            >= 1 (1: start from the previous step size; `inf`: from `max_learning_rate`).
        max_learning_rate: the largest step size, > 0.
        atol: absolute slack of the condition, >= 0.
        rtol: relative slack of the condition, >= 0.
        store_grad: also compute the gradient at the accepted point and keep it in the state
            (static), to reuse for the next step of a deterministic objective.
        verbose: print a diagnostic when no step size satisfies the condition (static).

    Example:
        >>> tx = modopt.chain(modopt.scale(-1.0), modopt.scale_by_backtracking_linesearch(15))
        >>> value, grad = jax.value_and_grad(loss)(params)
        >>> updates, state = tx.update(grad, state, params, value=value, grad=grad, value_fn=loss)

    References: Nocedal & Wright, Numerical Optimization, 1999 (Algorithm 3.1),
    https://doi.org/10.1007/978-0-387-40065-5; Vaswani et al., 2019,
    https://arxiv.org/abs/1905.09997
    """

    extra_args_spec: ClassVar[tuple[ExtraArg, ...]] = READS_LOSS

    max_backtracking_steps: int = static()
    slope_rtol: Scalar = hyperparameter(1e-4, check=PROBABILITY_EXCLUSIVE)
    decrease_factor: Scalar = hyperparameter(0.8, check=interval(0, 1, closed_lo=False))
    increase_factor: Scalar = hyperparameter(1.5, check=AT_LEAST_ONE)
    max_learning_rate: Scalar = hyperparameter(1.0, check=POSITIVE)
    atol: Scalar = hyperparameter(0.0, check=NONNEGATIVE)
    rtol: Scalar = hyperparameter(0.0, check=NONNEGATIVE)
    store_grad: bool = static(default=False)
    verbose: bool = static(default=False)

    def __check_init__(self):
        check_count(self, "max_backtracking_steps", self.max_backtracking_steps, 0)

    def init(self, params):
        dtype = value_dtype(params)
        return ScaleByBacktrackingLinesearchState(
            learning_rate=jnp.asarray(1.0, dtype),
            value=jnp.asarray(jnp.inf, dtype),
            grad=zeros_like(params) if self.store_grad else None,
            info=BacktrackingLinesearchInfo(jnp.zeros([], jnp.int32), jnp.asarray(jnp.inf, dtype)),
        )

    def update(self, updates, state, params=None, **extra_args):
        value, grad, objective = read_loss(extra_args, self, params)
        slope = inner(updates, grad)  # the derivative of eta -> f(w + eta u) at 0

        def decrease_error(step_size, new_value):
            error = new_value - (1.0 + self.rtol) * value - step_size * self.slope_rtol * slope
            return jnp.maximum(jnp.where(jnp.isnan(error), jnp.inf, error), 0.0)

        def searching(c):
            return ~(c.decrease_error <= self.atol) & (c.steps <= self.max_backtracking_steps)

        def backtrack(c):
            # The first evaluation tries the guess itself; every later one a smaller step.
            step_size = jnp.where(c.steps > 0, self.decrease_factor * c.learning_rate, c.learning_rate)
            new_value = objective(moved(params, step_size, updates))
            new = _Backtrack(step_size, new_value, decrease_error(step_size, new_value), c.steps + 1)
            return cast_like(new, c)

        guess = jnp.minimum(self.increase_factor * state.learning_rate, self.max_learning_rate)
        start = _Backtrack(guess, jnp.asarray(value), jnp.asarray(jnp.inf), jnp.zeros([], jnp.int32))
        found = jax.lax.while_loop(searching, backtrack, start)

        if self.verbose:
            jax.lax.cond(
                found.decrease_error > self.atol,
                lambda: jax.debug.print(
                    "scale_by_backtracking_linesearch: no step size gave sufficient decrease (loss {value}, "
                    "slope {slope}, last step size {step}, decrease error {error}); a NaN or infinite loss "
                    "gives a step of 0.",
                    value=value,
                    slope=slope,
                    step=found.learning_rate,
                    error=found.decrease_error,
                    ordered=True,
                ),
                lambda: None,
            )
        new_grad = None
        if self.store_grad:
            new_grad = jax.grad(objective)(moved(params, found.learning_rate, updates))
        # A NaN or infinite loss at every step tried: stay put rather than step into it.
        learning_rate = jnp.where(jnp.isinf(found.decrease_error), 0.0, found.learning_rate)
        new_state = ScaleByBacktrackingLinesearchState(
            learning_rate=learning_rate,
            value=found.value,
            grad=new_grad,
            info=BacktrackingLinesearchInfo(found.steps, found.decrease_error),
        )
        return scaled(learning_rate, updates), cast_like(new_state, state)


scale_by_backtracking_linesearch = ScaleByBacktrackingLinesearch
