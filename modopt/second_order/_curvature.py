"""Curvature of a loss at `(params, inputs, targets)`: Hessian-vector products and diagonals.

Every function takes a loss `loss(params, inputs, targets) -> scalar` and works on the flat
vector of all parameters, in the order of `jax.flatten_util.ravel_pytree(params)`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from .._core.base import Params

LossFn = Callable[[Any, Any, Any], jax.Array]


def _check(where: str, name: str, loss: Any, params: Any, inputs: Any, targets: Any) -> None:
    """Clear errors for a non-callable loss, non-floating parameters, or a non-scalar loss."""
    if not callable(loss):
        raise TypeError(
            f"Invalid {name}: a {type(loss).__name__} (expected a function "
            f"{name}(params, inputs, targets) -> scalar) in {where}."
        )
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    if not leaves:
        raise ValueError(f"Invalid params: {params!r} holds no arrays in {where}.")
    for path, leaf in leaves:
        dtype = jnp.result_type(leaf)
        if not jnp.issubdtype(dtype, jnp.floating):
            raise TypeError(
                f"Invalid params: the leaf at {jax.tree_util.keystr(path) or 'the root'} has dtype {dtype} "
                f"(expected a real floating dtype) in {where}. Pass only the trainable floating "
                "parameters (e.g. `eqx.partition(model, eqx.is_inexact_array)`) and close over the rest."
            )
    out = jax.eval_shape(loss, params, inputs, targets)
    out_leaves = jax.tree_util.tree_leaves(out)
    if (
        len(out_leaves) != 1
        or out_leaves[0].shape != ()
        or not jnp.issubdtype(out_leaves[0].dtype, jnp.floating)
    ):
        shown = out_leaves[0] if len(out_leaves) == 1 else out
        raise ValueError(
            f"Invalid {name}: it returned {shown} (expected a real floating scalar) in {where}. "
            "Reduce over the batch, e.g. with `.mean()` or `.sum()`."
        )


def _tangent(v: Any, params: Any, flat_params: jax.Array, unravel: Callable[[jax.Array], Any]) -> Any:
    """`v` as a pytree shaped like `params`: from the flat vector, or as given when it already is."""
    size = flat_params.size
    params_def = jax.tree_util.tree_structure(params)
    if jax.tree_util.tree_structure(v) == params_def:
        shapes_match = all(
            jnp.shape(a) == jnp.shape(b)
            for a, b in zip(jax.tree_util.tree_leaves(v), jax.tree_util.tree_leaves(params))
        )
        if shapes_match:
            return jax.tree_util.tree_map(lambda a, b: jnp.asarray(a, jnp.result_type(b)), v, params)
    if hasattr(v, "shape") or isinstance(v, (list, tuple, float, int)):
        flat = jnp.asarray(v)
        if flat.shape == (size,):
            return unravel(flat.astype(flat_params.dtype))
        raise ValueError(
            f"Invalid v: shape {flat.shape} in hvp (expected a flat vector of shape ({size},), the size of "
            "`ravel_pytree(params)[0]`, or a pytree shaped like params)."
        )
    raise ValueError(
        f"Invalid v: {type(v).__name__} in hvp (expected a flat vector of shape ({size},) or a pytree shaped like params)."
    )


def hvp(loss: LossFn, v: Any, params: Params, inputs: Any, targets: Any) -> Any:
    r"""The Hessian-vector product `H v` of `loss` at `params`, without forming the Hessian.

    With `f(w) = loss(w, inputs, targets)`, the product is the directional derivative of the
    gradient, `H v = d/de grad f(w + e v)` at `e = 0`, computed forward-over-reverse (`jax.jvp`
    of `jax.grad`) for about the cost of two gradients (Pearlmutter's R-operator).

    Args:
        loss: `loss(params, inputs, targets) -> scalar`, twice differentiable in `params`.
        v: the vector, flat with the size of `ravel_pytree(params)[0]`, or a pytree shaped like
            `params`.
        params: the parameters (a pytree of real floating arrays) where the Hessian is taken.
        inputs: the inputs at which `loss` is evaluated.
        targets: the targets at which `loss` is evaluated.

    Returns:
        `H v`, a pytree shaped like `params` (an array when `params` is one array); flatten it
        with `jax.flatten_util.ravel_pytree` for the flat vector.

    Example:
        >>> import jax.numpy as jnp
        >>> from modopt.second_order import hvp
        >>> loss = lambda w, x, y: jnp.sum((x @ w - y) ** 2)  # Hessian 2 x^T x
        >>> hvp(loss, jnp.array([1.0, 0.0]), jnp.zeros(2), jnp.eye(2), jnp.zeros(2))
        Array([2., 0.], dtype=float32)

    Reference: Pearlmutter, 1994, Fast exact multiplication by the Hessian,
    https://doi.org/10.1162/neco.1994.6.1.147
    """
    _check("hvp", "loss", loss, params, inputs, targets)
    flat, unravel = ravel_pytree(params)
    tangent = _tangent(v, params, flat, unravel)
    gradient = jax.grad(lambda p: loss(p, inputs, targets))
    return jax.jvp(gradient, (params,), (tangent,))[1]


def hessian_diag(loss: LossFn, params: Params, inputs: Any, targets: Any) -> jax.Array:
    r"""The exact diagonal of the Hessian of `loss` at `params`, as a flat vector.

    With `n` the number of parameters, `H_ii = e_i^T H e_i` for the unit vectors `e_i`: the
    gradient is linearized once (`jax.linearize`) and the linear map applied to all `e_i` at
    once (`jax.vmap`). This costs `n` Hessian-vector products and `O(n^2)` memory: meant for
    small models and tests. For large models, estimate the diagonal instead, e.g. Hutchinson's
    `E[z * (H z)]` over random signs `z` with `hvp`.

    Args:
        loss: `loss(params, inputs, targets) -> scalar`, twice differentiable in `params`.
        params: the parameters (a pytree of real floating arrays) where the Hessian is taken.
        inputs: the inputs at which `loss` is evaluated.
        targets: the targets at which `loss` is evaluated.

    Returns:
        The flat vector `diag(H)` of size `n`, in the order of `ravel_pytree(params)[0]`.

    Example:
        >>> import jax.numpy as jnp
        >>> from modopt.second_order import hessian_diag
        >>> loss = lambda w, x, y: jnp.sum((x @ w - y) ** 2)
        >>> hessian_diag(loss, jnp.zeros(2), jnp.array([[1.0, 2.0]]), jnp.zeros(1))
        Array([2., 8.], dtype=float32)

    Reference: Becker & LeCun, 1988, "Improving the convergence of back-propagation learning
    with second order methods", http://yann.lecun.com/exdb/publis/pdf/becker-lecun-89.pdf
    (the Hessian diagonal as a preconditioner).
    """
    _check("hessian_diag", "loss", loss, params, inputs, targets)
    flat, unravel = ravel_pytree(params)
    _, linear = jax.linearize(jax.grad(lambda p: loss(p, inputs, targets)), params)

    def column(basis_vector):
        return ravel_pytree(linear(unravel(basis_vector)))[0]

    columns = jax.vmap(column)(jnp.eye(flat.size, dtype=flat.dtype))  # row i holds H e_i
    return jnp.diagonal(columns)


def fisher_diag(negative_log_likelihood: LossFn, params: Params, inputs: Any, targets: Any) -> jax.Array:
    r"""The diagonal of the observed Fisher information at `(inputs, targets)`, as a flat vector.

    With `g = grad_w nll(w, inputs, targets)`, the observed Fisher information is the outer
    product `g g^T`; its diagonal is `g * g` (elementwise). For one example this is the
    empirical Fisher of that example. For a batch, the gradient of the batch's total is
    squared; the empirical Fisher of a batch, the mean of per-example `g_i * g_i`, is
    `jax.vmap(fisher_diag, in_axes=(None, None, 0, 0))(nll, params, inputs, targets).mean(0)`
    with a per-example `nll`.

    Args:
        negative_log_likelihood: `nll(params, inputs, targets) -> scalar`.
        params: the parameters (a pytree of real floating arrays).
        inputs: the inputs at which the likelihood is evaluated.
        targets: the targets at which the likelihood is evaluated.

    Returns:
        The flat vector `g * g` of size `n`, in the order of `ravel_pytree(params)[0]`.

    Example:
        >>> import jax.numpy as jnp
        >>> from modopt.second_order import fisher_diag
        >>> nll = lambda w, x, y: 0.5 * jnp.sum((x @ w - y) ** 2)  # gradient x^T (x w - y)
        >>> fisher_diag(nll, jnp.zeros(2), jnp.array([[1.0, 2.0]]), jnp.ones(1))
        Array([1., 4.], dtype=float32)

    Reference: Martens, 2020, New insights and perspectives on the natural gradient method
    (section 11, the empirical Fisher), https://arxiv.org/abs/1412.1193
    """
    _check("fisher_diag", "negative_log_likelihood", negative_log_likelihood, params, inputs, targets)
    gradient = jax.grad(negative_log_likelihood)(params, inputs, targets)
    return jnp.square(ravel_pytree(gradient)[0])
