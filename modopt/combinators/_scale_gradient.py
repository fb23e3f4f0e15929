"""Scaling the gradient that flows back through a value: `scale_gradient`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from .._core.fields import Scalar


@jax.custom_vjp
def _scaled_backward(inputs: Any, scale: Any) -> Any:
    del scale  # it acts on the backward pass only
    return inputs


def _forward(inputs: Any, scale: Any) -> tuple[Any, Any]:
    return inputs, scale


def _backward(scale: Any, cotangents: Any) -> tuple[Any, None]:
    def one(g):
        if jnp.result_type(g) == jax.dtypes.float0:  # integer inputs carry no gradient
            return g
        return (g * scale).astype(jnp.result_type(g))

    # No gradient reaches `scale` (None: a zero cotangent).
    return jax.tree_util.tree_map(one, cotangents), None


_scaled_backward.defvjp(_forward, _backward)


def scale_gradient(inputs: Any, scale: Scalar) -> Any:
    """Returns `inputs` unchanged, with the gradient flowing back through them times `scale`.

    The forward value is the identity; in reverse-mode differentiation the cotangent of every
    leaf of `inputs` is multiplied by `scale` (and kept in the leaf's dtype). No gradient
    flows to `scale`. A concrete `scale` of 1 returns `inputs` as they are, and one of 0 stops
    the gradient (`jax.lax.stop_gradient`, so even an infinite cotangent gives 0); a traced
    `scale` (inside `jit`) works too and does not retrace when it changes. Forward-mode
    differentiation (`jax.jvp`) is not defined for it.

    Args:
        inputs: an array or a pytree of arrays.
        scale: the factor of the backward pass, a scalar (or an array broadcasting with
            every leaf).

    Example:
        >>> f = lambda x: jnp.sum(modopt.scale_gradient(x, 0.1) ** 2)
        >>> jax.grad(f)(jnp.ones(3))  # 0.1 * 2 * x
        Array([0.2, 0.2, 0.2], dtype=float32)
    """
    if not isinstance(scale, jax.core.Tracer) and np.ndim(scale) == 0:
        concrete = np.asarray(scale)
        if concrete == 1:
            return inputs
        if concrete == 0:
            return jax.lax.stop_gradient(inputs)
    return _scaled_backward(inputs, scale)
