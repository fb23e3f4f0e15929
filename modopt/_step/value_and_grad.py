"""`value_and_grad_from_state`: the loss and gradient a line search computed, reused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from .optimizer import Optimizer
from ..tree._state import get


def value_and_grad_from_state(value_fn: Callable[..., Any]) -> Callable[..., tuple[Any, Any]]:
    r"""`jax.value_and_grad(value_fn)` that reuses the value and gradient stored in the state.

    A line search (`scale_by_zoom_linesearch`, the one of `lbfgs`, or
    `scale_by_backtracking_linesearch(..., store_grad=True)`) evaluates the loss and its
    gradient at the point it accepts, which is where the next step starts: it keeps both in
    its state (`value`, `grad`). The function returned,
    `value_and_grad(params, *args, state=state, **kwargs)`, returns them from `state`, and
    computes `jax.value_and_grad(value_fn)(params, *args, **kwargs)` only where the stored
    value is not finite (before the first step it is infinite).

    `state` is an optimizer state (of modopt's transforms or optax's) or a `modopt.Optimizer`.
    With an `Optimizer`, `params` is the model and `value_fn` a function of the model, as in
    `optimizer.step(model, grads, value=..., grad=..., value_fn=...)`; the gradient is that of
    the trained leaves (`None` elsewhere), the form `step` takes.

    Args:
        value_fn: the loss, a function of the parameters (or of the model) returning a scalar,
            differentiable by `jax.value_and_grad`.

    Returns:
        `value_and_grad(params, *args, state, **kwargs) -> (value, grad)`. It raises a
        `ValueError` where the state stores no value or no gradient (a backtracking line search
        without `store_grad=True`), and a `KeyError` where it stores several.

    Example:
        >>> def f(x): return jnp.sum(x ** 2)
        >>> tx = modopt.lbfgs()
        >>> value_and_grad = modopt.value_and_grad_from_state(f)
        >>> params = jnp.array([1.0, 2.0, 3.0])
        >>> state = tx.init(params)
        >>> for _ in range(3):
        ...     value, grad = value_and_grad(params, state=state)
        ...     updates, state = tx.update(grad, state, params, value=value, grad=grad, value_fn=f)
        ...     params = modopt.apply_updates(params, updates)

    Reference: Nocedal & Wright, 2006, Numerical Optimization, 2nd ed., chapter 3 (line searches),
    https://doi.org/10.1007/978-0-387-40065-5
    """

    def value_and_grad(params: Any, *fn_args: Any, state: Any, **fn_kwargs: Any) -> tuple[Any, Any]:
        if isinstance(state, Optimizer):
            # The value and gradient are in the state of the transform, over the trained leaves.
            trained, rest = eqx.partition(params, state._filter(params))
            stored = _stored(state.state)

            def of_trained(p, *args, **kwargs):
                return value_fn(eqx.combine(p, rest), *args, **kwargs)

            return _reuse_or_compute(of_trained, stored, trained, fn_args, fn_kwargs)
        return _reuse_or_compute(value_fn, _stored(state), params, fn_args, fn_kwargs)

    return value_and_grad


def _stored(state: Any) -> tuple[Any, Any]:
    """The `value` and `grad` a line search keeps in `state`."""
    value, grad = get(state, "value"), get(state, "grad")
    if value is None or grad is None:
        raise ValueError(
            "value_and_grad_from_state: the state holds no "
            f"{'value' if value is None else 'gradient'}: it needs a line search that stores the value and "
            "the gradient where it stops (scale_by_zoom_linesearch, as in lbfgs, or "
            "scale_by_backtracking_linesearch(..., store_grad=True))."
        )
    return value, grad


def _reuse_or_compute(value_fn: Callable[..., Any], stored: tuple[Any, Any], params: Any, args: Any, kwargs: Any):
    value, grad = stored
    return jax.lax.cond(
        jnp.isfinite(value),
        lambda *_: (value, grad),
        lambda p, a, kw: jax.value_and_grad(value_fn)(p, *a, **kw),
        params,
        args,
        kwargs,
    )
